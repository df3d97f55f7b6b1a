import { MapNetworkDirectory } from '../core/network-directory';
import { loopbackView } from './__tests__/loopback-view';
import { rawRig, send, sha, type RawRig } from './__tests__/raw-rig';

/**
 * attack3-ingress-5 (attacker finding): interim (1xx) responses are relayed as the sandbox wrote them (ingress-raw.ts
 * responseHead: `toClient(ex, respBuf.subarray(0, end))`), unlike final ones: their hop-by-hop
 * fields (Connection, Keep-Alive, the fields Connection names) reach the client, an
 * `HTTP/1.0 1xx` start line goes out as is, and an HTTP/1.0 client is sent 1xx responses
 * (RFC 9110 15.2: a server MUST NOT send a 1xx response to an HTTP/1.0 client; 7.6.1: an
 * intermediary removes the connection fields of every message it forwards).
 */
describe('ingress [raw]: interim responses get the same treatment as final ones', () => {
  let rig: RawRig;
  let port: number;
  let upPort: number;
  const dir = new MapNetworkDirectory();
  const interim = 'HTTP/1.0 103 Early Hints\r\nConnection: X-Secret, keep-alive\r\nX-Secret: internal-only\r\nKeep-Alive: timeout=5\r\nLink: </a.css>; rel=preload\r\n\r\n';

  beforeAll(async () => {
    rig = await rawRig('attack3-ingress-5', dir, (sock) => {
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
    upPort = rig.upPort;
    dir.set({ ...loopbackView({}), accessTokenSha256: sha('token-a') });
    port = rig.port;
  });
  afterAll(async () => {
    await rig?.close();
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
