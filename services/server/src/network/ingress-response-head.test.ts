/**
 * The raw ingress engine's response heads and access checks on its fast paths (ingress-raw.ts
 * `clientResponse`, ingress-route.ts `TokenMemo`): a "sandbox" on a raw TCP socket answers with
 * heads written byte by byte, so what the client gets can be compared with what was sent.
 * Hop-by-hop fields are dropped wherever they are in the head, HTTP/1.0 becomes HTTP/1.1, a
 * close-delimited body adds `Connection: close`, an untouched head passes as it came; a
 * connection that proved a token once is still refused a wrong one, and a sandbox whose token
 * changed is checked again.
 */
import net from 'node:net';
import { MapNetworkDirectory } from '../core/network-directory';
import { route, type TokenMemo } from './ingress-route';
import { loopbackView } from './__tests__/loopback-view';
import { rawRig, sha, type RawRig } from './__tests__/raw-rig';

/** A client connection to the ingress that sends a request and reads exactly one response (by its Content-Length, or to the close). */
class Client {
  private readonly sock: net.Socket;
  private buf = '';
  private closed = false;
  private wake: (() => void) | undefined;

  constructor(port: number) {
    this.sock = net.connect(port, '127.0.0.1');
    this.sock.on('data', (d: Buffer) => {
      this.buf += d.toString('latin1');
      this.wake?.();
    });
    this.sock.on('error', () => undefined);
    this.sock.on('close', () => {
      this.closed = true;
      this.wake?.();
    });
  }

  /** request writes `head` and resolves with the response's head (text up to the blank line), body and whether the connection closed after it. */
  async request(head: string): Promise<{ head: string; body: string; closed: boolean }> {
    this.sock.write(head);
    for (;;) {
      const end = this.buf.indexOf('\r\n\r\n');
      if (end >= 0) {
        const h = this.buf.slice(0, end + 2);
        const len = /\r\ncontent-length: *(\d+)/i.exec(h);
        const want = len ? Number(len[1]) : undefined;
        const body = this.buf.slice(end + 4);
        if ((want !== undefined && body.length >= want) || (want === undefined && this.closed)) {
          this.buf = want !== undefined ? body.slice(want) : '';
          return { head: h, body: want !== undefined ? body.slice(0, want) : body, closed: this.closed };
        }
      }
      if (this.closed) throw new Error(`connection closed after ${JSON.stringify(this.buf)}`);
      await new Promise<void>((r) => (this.wake = r));
    }
  }

  close(): void {
    this.sock.destroy();
  }
}

describe('ingress [raw]: response heads and access on the fast paths', () => {
  let rig: RawRig;
  let port: number;
  let upPort: number;
  /** what the sandbox answers to the next requests, one string per request (head and body as bytes) */
  const answers: string[] = [];
  /** connections the sandbox accepted */
  let accepted = 0;
  const dir = new MapNetworkDirectory();
  const host = () => `${upPort}-sb-1.localhost`;

  beforeAll(async () => {
    rig = await rawRig('ingress-response-head', dir, (sock) => {
      accepted++;
      let got = '';
      sock.on('error', () => undefined);
      sock.on('data', (d: Buffer) => {
        got += d.toString('latin1');
        for (let end = got.indexOf('\r\n\r\n'); end >= 0; end = got.indexOf('\r\n\r\n')) {
          got = got.slice(end + 4);
          const a = answers.shift() ?? 'HTTP/1.1 500 Nothing Queued\r\nContent-Length: 0\r\n\r\n';
          if (a.endsWith('\u0000close')) sock.end(a.slice(0, -'\u0000close'.length));
          else sock.write(a);
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
  beforeEach(() => {
    answers.splice(0);
    dir.set({ ...loopbackView({}), accessTokenSha256: sha('token-a') });
  });

  const get = (path: string, token = 'token-a', extra = '') => `GET ${path} HTTP/1.1\r\nHost: ${host()}\r\nsandnode-access-token: ${token}\r\n${extra}\r\n`;

  test('an untouched head reaches the client byte for byte, OWS and all', async () => {
    const head = 'HTTP/1.1 201 Made Here\r\nContent-Length: 3\r\nX-Odd:   spaced value  \r\nx-lower:v\r\n';
    answers.push(`${head}\r\nabc`);
    const c = new Client(port);
    try {
      const r = await c.request(get('/a'));
      expect(r.head).toBe(head);
      expect(r.body).toBe('abc');
    } finally {
      c.close();
    }
  });

  test('hop-by-hop fields are dropped first, middle and last, and those the Connection field names; the connection serves the next request', async () => {
    answers.push('HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Hop\r\nContent-Length: 2\r\nKeep-Alive: timeout=5\r\nX-Keep: 1\r\nX-Hop: secret\r\nProxy-Connection: keep-alive\r\n\r\nok');
    answers.push('HTTP/1.1 200 OK\r\nContent-Length: 4\r\nX-Hop: 2\r\nConnection: X-Hop\r\n\r\nnext');
    const c = new Client(port);
    try {
      const r = await c.request(get('/b'));
      expect(r.head).toBe('HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Keep: 1\r\n');
      expect(r.body).toBe('ok');
      const r2 = await c.request(get('/c'));
      expect(r2.head).toBe('HTTP/1.1 200 OK\r\nContent-Length: 4\r\n');
      expect(r2.body).toBe('next');
      expect(r2.closed).toBe(false);
    } finally {
      c.close();
    }
  });

  test('an HTTP/1.0 response goes out as HTTP/1.1; a body to the close adds Connection: close and ends the connection', async () => {
    answers.push('HTTP/1.0 200 Fine\r\nContent-Length: 2\r\nX-A: 1\r\n\r\nhi');
    answers.push('HTTP/1.1 200 OK\r\nX-B: 2\r\n\r\nuntil the end\u0000close');
    const c = new Client(port);
    try {
      const r = await c.request(get('/d'));
      expect(r.head).toBe('HTTP/1.1 200 Fine\r\nContent-Length: 2\r\nX-A: 1\r\n');
      expect(r.body).toBe('hi');
      const r2 = await c.request(get('/e'));
      expect(r2.head).toBe('HTTP/1.1 200 OK\r\nX-B: 2\r\nConnection: close\r\n');
      expect(r2.body).toBe('until the end');
      expect(r2.closed).toBe(true);
    } finally {
      c.close();
    }
  });

  test('a connection that proved its token is refused a wrong one, let in with the right one again, and checked again when the token changes', async () => {
    answers.push('HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n1', 'HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n3');
    const c = new Client(port);
    try {
      expect((await c.request(get('/1'))).body).toBe('1');
      const wrong = await c.request(get('/2', 'token-b'));
      expect(wrong.head).toMatch(/^HTTP\/1\.1 401 /);
      expect(wrong.body).toMatch(/wrong access token/);
      expect((await c.request(get('/3'))).body).toBe('3');
      // the sandbox's token is now token-b (as a fork's own): token-a proved before no longer lets in
      dir.set({ ...loopbackView({}), accessTokenSha256: sha('token-b') });
      expect((await c.request(get('/4'))).head).toMatch(/^HTTP\/1\.1 401 /);
      expect(answers).toEqual([]);
    } finally {
      c.close();
    }
  });

  test('a free upstream connection is reused within 4 s of its last answer, never after (the sandbox may have closed it)', async () => {
    const ok = (b: string) => `HTTP/1.1 200 OK\r\nContent-Length: ${b.length}\r\n\r\n${b}`;
    answers.push(ok('x'), ok('y'), ok('z'), ok('w'));
    const c = new Client(port);
    // a whole number: now + 3900 + 4000 - (now + 3900) is exactly 4000 (with a fraction it can be
    // 3999.9999…, and the 4 s old connection was reused: a CI flake)
    const now = Math.ceil(performance.now());
    const clock = jest.spyOn(performance, 'now');
    try {
      clock.mockReturnValue(now);
      await c.request(get('/f'));
      const before = accepted;
      clock.mockReturnValue(now + 3900);
      expect((await c.request(get('/g'))).body).toBe('y');
      expect(accepted).toBe(before);
      clock.mockReturnValue(now + 3900 + 3999);
      expect((await c.request(get('/h'))).body).toBe('z');
      expect(accepted).toBe(before);
      clock.mockReturnValue(now + 3900 + 3999 + 4000);
      expect((await c.request(get('/i'))).body).toBe('w');
      expect(accepted).toBe(before + 1);
    } finally {
      clock.mockRestore();
      c.close();
    }
  });

  test('route with a memo: the memo only skips the hash for the same token and digest', () => {
    const view = { ...loopbackView({}), accessTokenSha256: sha('token-a') };
    const d = new MapNetworkDirectory();
    d.set(view);
    const memo: TokenMemo = {};
    const h = (token: string) => ({ host: '80-sb-1.localhost', 'sandnode-access-token': token });
    expect(route(h('token-a'), d, 'localhost', undefined, memo).ok).toBe(true);
    expect(memo).toEqual({ token: 'token-a', sha: sha('token-a') });
    expect(route(h('token-x'), d, 'localhost', undefined, memo)).toMatchObject({ ok: false, status: 401 });
    expect(memo.token).toBe('token-a'); // a refusal never replaces what was proved
    // a forged memo for another digest does not let a token in
    const forged: TokenMemo = { token: 'token-x', sha: sha('token-other') };
    expect(route(h('token-x'), d, 'localhost', undefined, forged)).toMatchObject({ ok: false, status: 401 });
  });
});
