import { MapNetworkDirectory } from '../core/network-directory';
import { loopbackView } from './__tests__/loopback-view';
import { rawRig, send, sha, type RawRig } from './__tests__/raw-rig';

/**
 * attack3-ingress-3 (attacker finding): the raw engine parses a request head as latin1 (one char per byte, obs-text
 * 0x80-0xff allowed in the target and in field values) but writes the rebuilt head upstream as
 * a JS string with the socket's default encoding, UTF-8: every 8-bit byte the client sent
 * reaches the sandbox as two other bytes (0xE9 -> 0xC3 0xA9). The sandbox sees a different
 * target and different values from the ones the client sent (the response head, by contrast,
 * is relayed byte for byte). Expected: the bytes as sent, or a 400.
 */
describe('ingress [raw]: 8-bit bytes of a request head reach the sandbox as sent', () => {
  let rig: RawRig;
  let port: number;
  let upPort: number;
  const heads: Buffer[] = [];
  const dir = new MapNetworkDirectory();

  beforeAll(async () => {
    rig = await rawRig('attack3-ingress-3', dir, (sock) => {
      let got = Buffer.alloc(0);
      sock.on('error', () => undefined);
      sock.on('data', (d: Buffer) => {
        got = Buffer.concat([got, d]);
        const end = got.indexOf('\r\n\r\n');
        if (end >= 0) {
          heads.push(got.subarray(0, end + 4));
          got = got.subarray(end + 4);
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

  test('a target and a field value with byte 0xE9: the sandbox gets 0xE9, not 0xC3 0xA9 (or the client gets 400)', async () => {
    const req = Buffer.concat([
      Buffer.from('GET /caf', 'latin1'),
      Buffer.from([0xe9]),
      Buffer.from(` HTTP/1.1\r\nHost: ${upPort}-sb-1.localhost\r\nsandnode-access-token: token-a\r\nX-Name: Ren`, 'latin1'),
      Buffer.from([0xe9]),
      Buffer.from('\r\n\r\n', 'latin1'),
    ]);
    const out = await send(port, req, 2000, (g) => g.endsWith('\r\n\r\nok') || /^HTTP\/1\.1 400 /.test(g));
    if (/^HTTP\/1\.1 400 /.test(out)) return expect(heads).toEqual([]);
    expect(heads).toHaveLength(1);
    const head = heads[0]!;
    expect(head.subarray(0, 9)).toEqual(Buffer.from([0x47, 0x45, 0x54, 0x20, 0x2f, 0x63, 0x61, 0x66, 0xe9])); // "GET /caf" 0xE9
    expect(head.includes(Buffer.from([0xc3, 0xa9]))).toBe(false);
    expect(head.includes(Buffer.concat([Buffer.from('X-Name: Ren'), Buffer.from([0xe9, 0x0d, 0x0a])]))).toBe(true);
  });
});
