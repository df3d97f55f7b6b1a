import net from 'node:net';
import tls from 'node:tls';
import { seededRandom } from '@sandnode/testkit';
import { MAX_PREAMBLE_BYTES, parsePreamble } from './preamble';

/** clientHello captures the first bytes a real Node TLS client sends (with servername, or none). */
async function clientHello(servername?: string): Promise<Buffer> {
  const server = net.createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const got = new Promise<Buffer>((resolve) => server.once('connection', (s) => s.once('data', (d: Buffer) => (resolve(d), s.destroy()))));
  const c = tls.connect({ host: '127.0.0.1', port: (server.address() as net.AddressInfo).port, servername, rejectUnauthorized: false });
  c.on('error', () => undefined);
  const hello = await got;
  c.destroy();
  server.close();
  return hello;
}

/** splitRecords re-frames one TLS record's handshake bytes into records of at most `n` bytes. */
function splitRecords(rec: Buffer, n: number): Buffer {
  const body = rec.subarray(5, 5 + rec.readUInt16BE(3));
  const out: Buffer[] = [];
  for (let i = 0; i < body.length; i += n) {
    const part = body.subarray(i, i + n);
    const h = Buffer.from([0x16, 3, 1, 0, 0]);
    h.writeUInt16BE(part.length, 3);
    out.push(h, part);
  }
  return Buffer.concat(out);
}

describe('parsePreamble: TLS', () => {
  let hello: Buffer;
  let bare: Buffer;
  beforeAll(async () => {
    hello = await clientHello('allowed.test');
    bare = await clientHello(undefined);
  });

  it('reads the SNI of a real ClientHello, and none when the client sent none', () => {
    expect(parsePreamble(hello)).toEqual({ kind: 'tls', sni: 'allowed.test' });
    expect(parsePreamble(bare)).toEqual({ kind: 'tls', sni: undefined });
  });

  it('waits for more on every strict prefix, then decides', () => {
    for (let i = 1; i < hello.length; i++) expect(parsePreamble(hello.subarray(0, i))).toEqual({ kind: 'more' });
  });

  it('reassembles a ClientHello split over several records', () => {
    const split = splitRecords(hello, 50);
    expect(parsePreamble(split)).toEqual({ kind: 'tls', sni: 'allowed.test' });
    expect(parsePreamble(split.subarray(0, split.length - 1))).toEqual({ kind: 'more' });
  });

  it('refuses a ClientHello longer than the bound, and a non-handshake record', () => {
    const big = Buffer.from(hello);
    big.writeUIntBE(MAX_PREAMBLE_BYTES, 6, 3); // handshake length
    expect(parsePreamble(big)).toMatchObject({ kind: 'invalid' });
    const alert = Buffer.from(hello);
    alert[5] = 2; // ServerHello, not ClientHello
    expect(parsePreamble(alert)).toMatchObject({ kind: 'invalid' });
  });

  it('never throws on random, mutated or truncated ClientHellos (seeded fuzz)', () => {
    const rng = seededRandom(0x5eed12);
    for (let i = 0; i < 20000; i++) {
      const b = Buffer.from(rng.chance(0.5) ? hello : splitRecords(hello, rng.int(1, 300)));
      const mutations = rng.int(1, 8);
      for (let m = 0; m < mutations; m++) b[rng.below(b.length)] = rng.int(0, 255);
      const cut = rng.chance(0.3) ? b.subarray(0, rng.below(b.length)) : b;
      const input = rng.chance(0.1) ? Buffer.concat([Buffer.from([0x16]), rng.bytes(rng.int(0, 3000))]) : cut;
      let p;
      try {
        p = parsePreamble(input);
      } catch (err) {
        throw new Error(`seed ${rng.seed} iteration ${i}: parsePreamble threw ${(err as Error).message}`, { cause: err });
      }
      expect(input[0] === 0x16 ? ['more', 'tls', 'invalid'] : ['more', 'http', 'invalid', 'other']).toContain(p.kind);
      if (p.kind === 'tls' && p.sni !== undefined) expect(p.sni).toMatch(/^[\x21-\x7e]+$/);
    }
  });
});

describe('parsePreamble: HTTP', () => {
  const req = (s: string) => Buffer.from(s, 'latin1');

  it('reads method, target and Host', () => {
    expect(parsePreamble(req('GET /a?b HTTP/1.1\r\nUser-Agent: x\r\nHost: Allowed.Test:80\r\n\r\n'))).toEqual({ kind: 'http', method: 'GET', target: '/a?b', host: 'Allowed.Test:80' });
    expect(parsePreamble(req('GET / HTTP/1.0\r\n\r\n'))).toEqual({ kind: 'http', method: 'GET', target: '/', host: undefined });
  });

  it('takes the authority of an absolute-form target over the Host header', () => {
    expect(parsePreamble(req('GET http://allowed.test/x HTTP/1.1\r\nHost: denied.test\r\n\r\n'))).toMatchObject({ kind: 'http', host: 'allowed.test' });
  });

  it('waits for the end of the head, refuses two Host headers, CONNECT and malformed lines', () => {
    expect(parsePreamble(req('GET / HTTP/1.1\r\nHost: a\r\n'))).toEqual({ kind: 'more' });
    expect(parsePreamble(req('GE'))).toEqual({ kind: 'more' });
    expect(parsePreamble(req('GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n'))).toMatchObject({ kind: 'invalid', why: 'two Host headers' });
    expect(parsePreamble(req('CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n'))).toMatchObject({ kind: 'invalid' });
    expect(parsePreamble(req('GET / HTTP/2.0\r\n\r\n'))).toMatchObject({ kind: 'invalid' });
    expect(parsePreamble(req('GET / HTTP/1.1\r\nno colon here\r\n\r\n'))).toMatchObject({ kind: 'invalid' });
  });

  it('is "other" for protocols that are neither (SSH, binary)', () => {
    expect(parsePreamble(req('SSH-2.0-OpenSSH_9.2\r\n'))).toEqual({ kind: 'other' });
    expect(parsePreamble(Buffer.from([0, 1, 2, 3]))).toEqual({ kind: 'other' });
  });

  it('refuses an oversized head (no end within the bound)', () => {
    const big = req(`GET / HTTP/1.1\r\nX: ${'a'.repeat(MAX_PREAMBLE_BYTES)}\r\n`);
    expect(parsePreamble(big)).toMatchObject({ kind: 'invalid' });
  });

  it('never throws on random, mutated or truncated request heads (seeded fuzz)', () => {
    const rng = seededRandom(0xbeef);
    const base = req('POST /upload HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 3\r\n\r\nabc');
    for (let i = 0; i < 5000; i++) {
      let b = Buffer.from(base);
      for (let m = rng.int(0, 6); m > 0; m--) b[rng.below(b.length)] = rng.pick([0, 10, 13, 32, 58, rng.int(0, 255)]);
      if (rng.chance(0.3)) b = b.subarray(0, rng.below(b.length));
      if (rng.chance(0.02)) b = Buffer.concat([b, rng.bytes(rng.int(0, 2 * MAX_PREAMBLE_BYTES))]);
      let p;
      try {
        p = parsePreamble(b);
      } catch (err) {
        throw new Error(`seed ${rng.seed} iteration ${i}: parsePreamble threw ${(err as Error).message}`, { cause: err });
      }
      expect(['more', 'http', 'invalid', 'other', 'tls']).toContain(p.kind);
    }
  });
});
