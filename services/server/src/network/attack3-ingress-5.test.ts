import { createHash } from 'node:crypto';
import net from 'node:net';
import { createLogger } from '@sandnode/shared';
import { MapNetworkDirectory } from '../core/network-directory';
import { createIngress, type Ingress } from './ingress';
import { loopbackView } from './__tests__/loopback-view';

const sha = (t: string) => createHash('sha256').update(t).digest('hex');

/** send writes `data` on a new connection and resolves with every byte received (latin1) until it closes or `ms` pass. */
function send(port: number, data: Buffer | string, ms: number, until?: (got: string) => boolean): Promise<string> {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    let got = '';
    const done = () => {
      clearTimeout(t);
      s.destroy();
      resolve(got);
    };
    s.on('data', (d: Buffer) => {
      got += d.toString('latin1');
      if (until?.(got)) done();
    });
    s.on('error', () => undefined);
    const t = setTimeout(done, ms);
    s.on('close', done);
    s.write(data);
  });
}

/**
 * attack3-ingress-5 (attacker finding): interim (1xx) responses are relayed as the sandbox wrote them (ingress-raw.ts
 * responseHead: `toClient(ex, respBuf.subarray(0, end))`), unlike final ones: their hop-by-hop
 * fields (Connection, Keep-Alive, the fields Connection names) reach the client, an
 * `HTTP/1.0 1xx` start line goes out as is, and an HTTP/1.0 client is sent 1xx responses
 * (RFC 9110 15.2: a server MUST NOT send a 1xx response to an HTTP/1.0 client; 7.6.1: an
 * intermediary removes the connection fields of every message it forwards).
 */
describe('ingress [raw]: interim responses get the same treatment as final ones', () => {
  let upstream: net.Server;
  let ingress: Ingress;
  let port: number;
  let upPort: number;
  const dir = new MapNetworkDirectory();
  const interim = 'HTTP/1.0 103 Early Hints\r\nConnection: X-Secret, keep-alive\r\nX-Secret: internal-only\r\nKeep-Alive: timeout=5\r\nLink: </a.css>; rel=preload\r\n\r\n';

  beforeAll(async () => {
    upstream = net.createServer((sock) => {
      let got = '';
      sock.on('error', () => undefined);
      sock.on('data', (d: Buffer) => {
        got += d.toString('latin1');
        if (got.includes('\r\n\r\n')) {
          got = '';
          sock.write(`${interim}HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok`);
        }
      });
    });
    await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
    upPort = (upstream.address() as net.AddressInfo).port;
    dir.set({ ...loopbackView({}), accessTokenSha256: sha('token-a') });
    ingress = createIngress({ engine: 'raw', directory: dir, domain: 'localhost', log: createLogger('attack3-ingress-5', '0', 'silent') });
    await new Promise<void>((r) => ingress.server.listen(0, '127.0.0.1', r));
    port = (ingress.server.address() as net.AddressInfo).port;
  });
  afterAll(async () => {
    await ingress?.close();
    await new Promise((r) => upstream?.close(r));
  });

  const req = (v: string) => `GET / ${v}\r\nHost: ${upPort}-sb-1.localhost\r\nsandnode-access-token: token-a\r\n\r\n`;
  const okDone = (g: string) => g.endsWith('\r\n\r\nok');

  test('a 103 loses its hop-by-hop fields and goes out as HTTP/1.1 to an HTTP/1.1 client', async () => {
    const out = await send(port, req('HTTP/1.1'), 2000, okDone);
    expect(out).toMatch(/ok$/);
    const first = out.slice(0, out.indexOf('\r\n\r\n') + 4);
    expect(first).toMatch(/^HTTP\/1\.1 103 /);
    expect(first).toMatch(/\r\nLink: <\/a\.css>; rel=preload\r\n/);
    expect(first).not.toMatch(/X-Secret|Keep-Alive|Connection/i);
  });

  test('an HTTP/1.0 client gets no 1xx, only the final response', async () => {
    const out = await send(port, req('HTTP/1.0'), 2000, okDone);
    expect(out).toMatch(/ok$/);
    expect(out).toMatch(/^HTTP\/1\.1 200 /);
    expect(out).not.toMatch(/103 Early Hints/);
  });
});
