/**
 * attack3-ingress-1 (attacker finding): the raw ingress's bound on a sandbox's response head (MAX_RESPONSE_HEAD, 64 KiB)
 * is only checked while the head's end has not been seen: a head that is over the bound but
 * whose blank line comes within the read that passes the bound is parsed and relayed whole.
 * A hostile sandbox writes a 120 KB head in one write: the first read (64 KiB) has no end,
 * the next (up to 256 KiB) brings the rest, and the client gets all 120 KB instead of a 502.
 */
import { MapNetworkDirectory } from '../core/network-directory';
import { loopbackView } from './__tests__/loopback-view';
import { rawRig, send, sha, type RawRig } from './__tests__/raw-rig';

describe('ingress [raw]: the response head bound holds however the head is read', () => {
  let rig: RawRig;
  let port: number;
  let upPort: number;
  let answer = '';
  const dir = new MapNetworkDirectory();

  beforeAll(async () => {
    rig = await rawRig('attack3-ingress-1', dir, (sock) => {
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
    upPort = rig.upPort;
    dir.set({ ...loopbackView({}), accessTokenSha256: sha('token-a') });
    port = rig.port;
  });
  afterAll(async () => {
    await rig?.close();
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
