/**
 * attack3-ingress-2 (attacker finding): parseHead copies the whole value array for every repeat of a field name
 * (`[...had, value]`), so a head of N repeats of one short field costs O(N^2). Within the
 * engine's own bounds: a sandbox's 64 KiB response head of `a:` lines (16 000 fields) blocks
 * the server's event loop for about a second (5 s at 120 KB, see attacker-1), and a client
 * with no token, no valid Host even, pipelining 16 KiB request heads (4 000 fields each,
 * under maxHeaderBytes) costs ~25 ms of server CPU per 16 KB sent. The ingress shares the
 * server's event loop (gRPC API, handovers), so one hostile sandbox or one unauthenticated
 * client stalls the node.
 */
import net from 'node:net';
import { MapNetworkDirectory } from '../core/network-directory';
import { findHeadEnd, parseHead } from './http1';
import { loopbackView } from './__tests__/loopback-view';
import { rawRig, sha, type RawRig } from './__tests__/raw-rig';

/** maxGap runs fn and resolves with the longest the event loop was blocked meanwhile, ms. */
async function maxGap(fn: () => Promise<unknown>): Promise<number> {
  let last = performance.now();
  let max = 0;
  const iv = setInterval(() => {
    const now = performance.now();
    max = Math.max(max, now - last);
    last = now;
  }, 5);
  try {
    await fn();
  } finally {
    clearInterval(iv);
  }
  return max;
}

describe('ingress [raw]: repeated fields cost linear time', () => {
  test('parseHead of a 64 KiB head of 16 000 repeats of one field takes well under 250 ms', () => {
    const b = Buffer.from(`HTTP/1.1 200 OK\r\n${'a:\r\n'.repeat(16000)}\r\n`, 'latin1');
    const t = performance.now();
    const head = parseHead(b, findHeadEnd(b), false);
    const ms = performance.now() - t;
    expect((head.headers['a'] as string[]).length).toBe(16000);
    expect(ms).toBeLessThan(250);
  });

  test('a request head at maxHeaderBytes (16 KiB, 4 000 repeats) parses in under 25 ms', () => {
    const b = Buffer.from(`GET / HTTP/1.1\r\nHost: x\r\n${'a:\r\n'.repeat(4000)}\r\n`, 'latin1');
    parseHead(b, findHeadEnd(b), true); // warm up
    const t = performance.now();
    parseHead(b, findHeadEnd(b), true);
    expect(performance.now() - t).toBeLessThan(25);
  });

  describe('through the ingress', () => {
    let rig: RawRig;
    let port: number;
    let upPort: number;
    const dir = new MapNetworkDirectory();

    beforeAll(async () => {
      rig = await rawRig('attack3-ingress-2', dir, (sock) => {
        let got = '';
        sock.on('error', () => undefined);
        sock.on('data', (d: Buffer) => {
          got += d.toString('latin1');
          if (got.includes('\r\n\r\n')) {
            got = '';
            // a hostile sandbox: 16 000 empty fields, 64 KB, inside MAX_RESPONSE_HEAD
            sock.write(`HTTP/1.1 200 OK\r\n${'a:\r\n'.repeat(16000)}Content-Length: 2\r\n\r\nok`);
          }
        });
      });
      upPort = rig.upPort;
      dir.set({ ...loopbackView({}), accessTokenSha256: sha('token-a') });
      port = rig.port;
    });
    afterAll(async () => {
      await rig?.close();
    });

    test("one response of a hostile sandbox does not block the server's event loop for 300 ms", async () => {
      const gap = await maxGap(
        () =>
          new Promise<void>((resolve, reject) => {
            const s = net.connect(port, '127.0.0.1');
            let got = '';
            s.on('error', reject);
            s.on('data', (d: Buffer) => {
              got += d.toString('latin1');
              if (got.endsWith('\r\n\r\nok') || /^HTTP\/1\.1 502 /.test(got)) {
                s.destroy();
                resolve();
              }
            });
            s.write(`GET / HTTP/1.1\r\nHost: ${upPort}-sb-1.localhost\r\nsandnode-access-token: token-a\r\n\r\n`);
          }),
      );
      expect(gap).toBeLessThan(300);
    });

    test('50 pipelined 16 KiB request heads from a client with no token cost under 400 ms of CPU', async () => {
      const one = `GET / HTTP/1.1\r\nHost: nowhere\r\n${'a:\r\n'.repeat(4000)}\r\n`;
      const cpu0 = process.cpuUsage();
      await new Promise<void>((resolve, reject) => {
        const s = net.connect(port, '127.0.0.1');
        let answers = 0;
        s.on('error', reject);
        s.on('data', (d: Buffer) => {
          answers += (d.toString('latin1').match(/HTTP\/1\.1 /g) ?? []).length;
          if (answers >= 50) {
            s.destroy();
            resolve();
          }
        });
        s.on('close', () => resolve());
        s.write(one.repeat(50));
      });
      const cpu = process.cpuUsage(cpu0);
      expect((cpu.user + cpu.system) / 1000).toBeLessThan(400);
    });
  });
});
