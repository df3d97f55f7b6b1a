import { MapNetworkDirectory } from '../core/network-directory';
import { loopbackView } from './__tests__/loopback-view';
import { rawRig, send, sha, type RawRig } from './__tests__/raw-rig';

/**
 * attack3-ingress-4 (attacker finding): the free-upstream expiry moved from one timer per connection (monotonic) to
 * `Date.now() - freeSince` checks (get() and the 1 s sweep): wall-clock time. When the clock
 * steps back (NTP, a VM restored, an operator's `date -s`), a free upstream connection is
 * neither swept nor refused however long it really sat idle: here 4.5 s of real idle time (the
 * limit is 4 s, chosen below the usual 5 s keep-alive of servers so that the ingress never
 * writes a request into a connection the sandbox is closing) and the next request still goes
 * out on it; with a step of an hour, free connections are kept for an hour.
 */
describe('ingress [raw]: free upstream expiry does not follow the wall clock', () => {
  let rig: RawRig;
  let port: number;
  let upPort: number;
  let accepted = 0;
  const dir = new MapNetworkDirectory();

  beforeAll(async () => {
    rig = await rawRig('attack3-ingress-4', dir, (sock) => {
      accepted++;
      let got = '';
      sock.on('error', () => undefined);
      sock.on('data', (d: Buffer) => {
        got += d.toString('latin1');
        for (let end = got.indexOf('\r\n\r\n'); end >= 0; end = got.indexOf('\r\n\r\n')) {
          got = got.slice(end + 4);
          sock.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok');
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

  test('a connection idle 4.5 s (real time) is not reused after the clock stepped back an hour', async () => {
    const req = `GET / HTTP/1.1\r\nHost: ${upPort}-sb-1.localhost\r\nsandnode-access-token: token-a\r\n\r\n`;
    const okDone = (g: string) => g.endsWith('\r\n\r\nok');
    const real = Date.now.bind(Date);
    expect(await send(port, req, 2000, okDone)).toMatch(/ok$/);
    expect(accepted).toBe(1);
    const clock = jest.spyOn(Date, 'now').mockImplementation(() => real() - 3_600_000);
    try {
      await new Promise((r) => setTimeout(r, 4500));
      expect(await send(port, req, 2000, okDone)).toMatch(/ok$/);
      expect(accepted).toBe(2); // a new connection: the free one sat idle 4.5 s
    } finally {
      clock.mockRestore();
    }
  }, 15000);
});
