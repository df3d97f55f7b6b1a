import { MapNetworkDirectory } from '../core/network-directory';
import { loopbackView } from './__tests__/loopback-view';
import { rawRig, send, sha, type RawRig } from './__tests__/raw-rig';

/**
 * attack4 (attacker finding): a head ended by bare LFs (`HTTP/1.1 200 OK\n...\n\n`) was not
 * refused though http1.ts's grammar refuses bare LF: the parser only looked for CRLFCRLF, so a
 * sandbox's bare-LF answer left its client waiting until 64 KiB came or the idle timeout (120 s),
 * and a client's bare-LF request until the head timeout (10 s). Now: 502 and 400 at once.
 */
describe('ingress [raw]: bare-LF heads are refused as they come', () => {
  let rig: RawRig;
  const dir = new MapNetworkDirectory();

  beforeAll(async () => {
    rig = await rawRig('attack4-bare-lf', dir, (sock) => {
      sock.on('error', () => undefined);
      sock.once('data', () => sock.write('HTTP/1.1 200 OK\nContent-Length: 2\n\nok'));
    });
    dir.set({ ...loopbackView({}), accessTokenSha256: sha('token-a') });
  });
  afterAll(async () => {
    await rig?.close();
  });

  test("a sandbox's bare-LF response is a 502 within a second", async () => {
    const t0 = Date.now();
    const out = await send(rig.port, `GET / HTTP/1.1\r\nHost: ${rig.upPort}-sb-1.localhost\r\nsandnode-access-token: token-a\r\n\r\n`, 5000, (g) => g.includes('\r\n\r\n'));
    expect(out).toMatch(/^HTTP\/1\.1 502 /);
    expect(Date.now() - t0).toBeLessThan(1000);
  });

  test("a client's bare-LF request is a 400 within a second", async () => {
    const t0 = Date.now();
    const out = await send(rig.port, `GET / HTTP/1.1\nHost: ${rig.upPort}-sb-1.localhost\n\n`, 5000, (g) => g.includes('\r\n\r\n'));
    expect(out).toMatch(/^HTTP\/1\.1 400 /);
    expect(out).toMatch(/bare LF/);
    expect(Date.now() - t0).toBeLessThan(1000);
  });
});
