/**
 * attack3-ingress-1 (attacker finding): the raw ingress's bound on a sandbox's response head (MAX_RESPONSE_HEAD, 64 KiB)
 * is only checked while the head's end has not been seen: a head that is over the bound but
 * whose blank line comes within the read that passes the bound is parsed and relayed whole.
 * A hostile sandbox writes a 120 KB head in one write: the first read (64 KiB) has no end,
 * the next (up to 256 KiB) brings the rest, and the client gets all 120 KB instead of a 502.
 */
import { createHash } from 'node:crypto';
import net from 'node:net';
import { createLogger } from '@sandnode/shared';
import { MapNetworkDirectory } from '../core/network-directory';
import { createIngress, type Ingress } from './ingress';
import { loopbackView } from './__tests__/loopback-view';

const sha = (t: string) => createHash('sha256').update(t).digest('hex');

/** send writes `data` on a new connection and resolves with every byte received until the connection closes or `ms` pass. */
function send(port: number, data: string, ms: number): Promise<string> {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    let got = '';
    s.on('data', (d: Buffer) => (got += d.toString('latin1')));
    s.on('error', () => undefined);
    const done = () => {
      clearTimeout(t);
      s.destroy();
      resolve(got);
    };
    const t = setTimeout(done, ms);
    s.on('close', done);
    s.write(data);
  });
}

describe('ingress [raw]: the response head bound holds however the head is read', () => {
  let upstream: net.Server;
  let ingress: Ingress;
  let port: number;
  let upPort: number;
  let answer = '';
  const dir = new MapNetworkDirectory();

  beforeAll(async () => {
    upstream = net.createServer((sock) => {
      let got = '';
      sock.on('error', () => undefined);
      sock.on('data', (d: Buffer) => {
        got += d.toString('latin1');
        if (got.includes('\r\n\r\n')) {
          got = '';
          sock.write(answer); // one write: the head's end comes in the second read of the ingress
        }
      });
    });
    await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
    upPort = (upstream.address() as net.AddressInfo).port;
    dir.set({ ...loopbackView({}), accessTokenSha256: sha('token-a') });
    ingress = createIngress({ engine: 'raw', directory: dir, domain: 'localhost', log: createLogger('attack3-ingress-1', '0', 'silent') });
    await new Promise<void>((r) => ingress.server.listen(0, '127.0.0.1', r));
    port = (ingress.server.address() as net.AddressInfo).port;
  });
  afterAll(async () => {
    await ingress?.close();
    await new Promise((r) => upstream?.close(r));
  });

  test('a 120 KB response head sent in one write is refused with 502, never relayed', async () => {
    const fields = 'X-Pad: ' + 'p'.repeat(100) + '\r\n';
    answer = `HTTP/1.1 200 OK\r\n${fields.repeat(1100)}Content-Length: 2\r\n\r\nok`;
    expect(answer.length).toBeGreaterThan(2 * 64 * 1024 - 20000);
    const out = await send(port, `GET / HTTP/1.1\r\nHost: ${upPort}-sb-1.localhost\r\nsandnode-access-token: token-a\r\n\r\n`, 3000);
    expect(out.length).toBeLessThan(64 * 1024);
    expect(out).toMatch(/^HTTP\/1\.1 502 /);
    expect(out).toMatch(/response head over 65536 bytes/);
  });
});
