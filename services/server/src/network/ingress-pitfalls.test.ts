/**
 * The ingress engines against what an attacker tried on an earlier raw engine: thousands of
 * pipelined requests in one packet (stack), unbounded head and buffers (a slow reader either
 * way), forged X-Forwarded-* (upgrades too), hop-by-hop fields, the access token, and request
 * smuggling (CL + TE, two CLs, bad chunk sizes) — each against both engines, on real sockets:
 * a "sandbox" HTTP server on 127.0.0.1 (loopbackView), the ingress on 127.0.0.1:0.
 */
import http from 'node:http';
import net from 'node:net';
import { createLogger } from '@sandnode/shared';
import { MapNetworkDirectory } from '../core/network-directory';
import { createIngress, INGRESS_ENGINES, type Ingress } from './ingress';
import { loopbackView } from './__tests__/loopback-view';

/** talk writes `data` to the ingress at port and collects what comes back until the ingress closes (or `ms`). */
function talk(port: number, data: string | Buffer, ms = 5000): Promise<{ text: string; closed: boolean }> {
  return new Promise((resolve) => {
    const sock = net.connect(port, '127.0.0.1');
    const chunks: Buffer[] = [];
    const t = setTimeout(() => {
      sock.destroy();
      resolve({ text: Buffer.concat(chunks).toString('latin1'), closed: false });
    }, ms);
    sock.on('data', (d: Buffer) => chunks.push(d));
    sock.on('error', () => undefined);
    sock.on('close', () => {
      clearTimeout(t);
      resolve({ text: Buffer.concat(chunks).toString('latin1'), closed: true });
    });
    sock.write(data);
  });
}

const statuses = (text: string) => [...text.matchAll(/HTTP\/1\.1 (\d{3}) /g)].map((m) => Number(m[1]));

for (const engine of INGRESS_ENGINES) {
  describe(`ingress [${engine}]: pitfalls of a raw engine`, () => {
    let upstream: http.Server;
    let ingress: Ingress;
    let port: number;
    let upPort: number;
    const seen: { method: string; url: string; headers: http.IncomingHttpHeaders; body: string }[] = [];
    const upgrades: http.IncomingHttpHeaders[] = [];
    let flood: { written: number; res?: http.ServerResponse } = { written: 0 };
    let upload: { readBytes: number; hold?: http.IncomingMessage } = { readBytes: 0 };
    const dir = new MapNetworkDirectory();
    const host = () => `${upPort}-sb-1.localhost`;

    beforeAll(async () => {
      upstream = http.createServer((req, res) => {
        if (req.url === '/flood') {
          // writes as fast as the ingress takes it: a bounded ingress stops taking it
          flood = { written: 0, res };
          res.writeHead(200, { 'content-type': 'application/octet-stream' });
          const block = Buffer.alloc(64 * 1024, 7);
          const more = () => {
            while (!res.destroyed && flood.written < 1024 * 2 ** 20) {
              flood.written += block.length;
              if (!res.write(block)) return void res.once('drain', more);
            }
          };
          return more();
        }
        if (req.url === '/hold-upload') {
          // reads nothing: a bounded ingress stops reading the client
          upload = { readBytes: 0, hold: req };
          req.pause();
          return;
        }
        let body = '';
        req.on('data', (d: Buffer) => (body += d.toString('latin1')));
        req.on('end', () => {
          seen.push({ method: req.method!, url: req.url!, headers: req.headers, body });
          res.end(`ok ${req.url}`);
        });
      });
      upstream.on('upgrade', (req: http.IncomingMessage, sock: net.Socket) => {
        upgrades.push(req.headers);
        sock.end('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n');
      });
      upstream.keepAliveTimeout = 10_000;
      await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
      upPort = (upstream.address() as net.AddressInfo).port;
      dir.set({ ...loopbackView({}), public: true });
      ingress = createIngress({ engine, directory: dir, domain: 'localhost', log: createLogger('ingress-pitfalls', '0', 'silent') });
      await new Promise<void>((r) => ingress.server.listen(0, '127.0.0.1', r));
      port = (ingress.server.address() as net.AddressInfo).port;
    });
    afterAll(async () => {
      await ingress?.close();
      upstream?.closeAllConnections();
      await new Promise((r) => upstream?.close(r));
    });
    beforeEach(() => void seen.splice(0));

    test('20000 pipelined requests in one packet (unknown sandbox: answered at once) are answered in a loop, the server lives on', async () => {
      const n = 20_000;
      const one = `GET /x HTTP/1.1\r\nHost: ${upPort}-sb-nope.localhost\r\n\r\n`;
      const got = await talk(port, one.repeat(n) + `GET /last HTTP/1.1\r\nHost: ${host()}\r\nConnection: close\r\n\r\n`, 30_000);
      const st = statuses(got.text);
      expect(st.length).toBe(n + 1);
      expect(st.slice(0, n).every((s) => s === 404)).toBe(true);
      expect(st[n]).toBe(200);
      expect(got.text.endsWith('ok /last')).toBe(true);
    }, 60_000);

    test('200 pipelined requests to the sandbox in one packet come back in order', async () => {
      const reqs = Array.from({ length: 200 }, (_, i) => `GET /p${i} HTTP/1.1\r\nHost: ${host()}\r\n\r\n`).join('');
      const got = await talk(port, reqs + `GET /end HTTP/1.1\r\nHost: ${host()}\r\nConnection: close\r\n\r\n`, 30_000);
      const bodies = [...got.text.matchAll(/ok (\/(?:p\d+|end))/g)].map((m) => m[1]);
      expect(bodies).toEqual([...Array.from({ length: 200 }, (_, i) => `/p${i}`), '/end']);
    }, 60_000);

    test('a head over maxHeaderBytes that never ends gets 431 with a reason and is closed', async () => {
      const got = await talk(port, `GET / HTTP/1.1\r\nHost: ${host()}\r\nX-Big: ${'a'.repeat(64 * 1024)}`);
      expect(got.text).toMatch(/^HTTP\/1\.1 431 /);
      expect(got.text).toMatch(/request head too large/);
      expect(got.closed).toBe(true);
    });

    test('a garbage request line gets 400 with a reason and is closed', async () => {
      const got = await talk(port, 'HELLO THERE\r\n\r\n');
      expect(got.text).toMatch(/^HTTP\/1\.1 400 /);
      expect(got.text).toMatch(/bad request/);
      expect(got.closed).toBe(true);
    });

    test.each([
      ['Content-Length and Transfer-Encoding', 'Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: H\r\n\r\n'],
      ['two Content-Length fields', 'Content-Length: 4\r\nContent-Length: 40\r\n\r\nabcdGET /smuggled HTTP/1.1\r\nHost: H\r\n\r\n'],
      ['a bad chunk size', 'Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: H\r\n\r\n'],
      ['a Transfer-Encoding that is not chunked', 'Transfer-Encoding: gzip, identity\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: H\r\n\r\n'],
    ])('smuggling: %s gets 400 and the connection closes; no smuggled request reaches the sandbox', async (_name, rest) => {
      const got = await talk(port, `POST /front HTTP/1.1\r\nHost: ${host()}\r\n${rest.replaceAll('Host: H', `Host: ${host()}`)}`);
      expect(statuses(got.text)).toEqual([400]);
      expect(got.closed).toBe(true);
      await new Promise((r) => setTimeout(r, 100));
      expect(seen.map((s) => s.url)).not.toContain('/smuggled');
    });

    test('a chunked body passes whole (with trailers); the next request on the connection is its own', async () => {
      const got = await talk(
        port,
        `POST /c HTTP/1.1\r\nHost: ${host()}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: t\r\n\r\nGET /after HTTP/1.1\r\nHost: ${host()}\r\nConnection: close\r\n\r\n`,
      );
      expect(statuses(got.text)).toEqual([200, 200]);
      expect(seen.map((s) => [s.url, s.body])).toEqual([
        ['/c', 'hello world'],
        ['/after', ''],
      ]);
    });

    test('X-Forwarded-* are set over what the client sent; hop-by-hop fields and the token do not go upstream', async () => {
      const got = await talk(
        port,
        `GET /h HTTP/1.1\r\nHost: ${host()}\r\nX-Forwarded-For: 6.6.6.6\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: evil.example\r\nsandnode-access-token: secret\r\nConnection: close, X-Secret\r\nX-Secret: 1\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nX-Kept: yes\r\n\r\n`,
      );
      expect(statuses(got.text)).toEqual([200]);
      const h = seen[0]!.headers;
      expect(h['x-forwarded-for']).toBe('127.0.0.1');
      expect(h['x-forwarded-proto']).toBe('http');
      expect(h['x-forwarded-host']).toBe(host());
      expect(h['sandnode-access-token']).toBeUndefined();
      expect(h['x-secret']).toBeUndefined();
      expect(h['keep-alive']).toBeUndefined();
      expect(h.te).toBeUndefined();
      expect(h['x-kept']).toBe('yes');
    });

    test("a WebSocket upgrade gets X-Forwarded-* set over the client's too, and no token", async () => {
      upgrades.splice(0);
      const got = await talk(
        port,
        `GET /ws HTTP/1.1\r\nHost: ${host()}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nX-Forwarded-For: 6.6.6.6\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: evil.example\r\nsandnode-access-token: secret\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n`,
      );
      expect(got.text).toMatch(/^HTTP\/1\.1 101 /);
      const h = upgrades[0]!;
      expect(h['x-forwarded-for']).toBe('127.0.0.1');
      expect(h['x-forwarded-proto']).toBe('http');
      expect(h['x-forwarded-host']).toBe(host());
      expect(h['sandnode-access-token']).toBeUndefined();
      expect(h.upgrade).toBe('websocket');
    });

    test('backpressure: a client that reads nothing stops the sandbox writing (bounded, not buffered)', async () => {
      const sock = net.connect(port, '127.0.0.1');
      sock.on('error', () => undefined);
      sock.pause();
      sock.write(`GET /flood HTTP/1.1\r\nHost: ${host()}\r\n\r\n`);
      await new Promise((r) => setTimeout(r, 1500));
      const at = flood.written;
      await new Promise((r) => setTimeout(r, 500));
      // socket buffers (loopback: some MiB each way) hold what was written; the rest waits
      expect(flood.written).toBeLessThan(96 * 2 ** 20);
      expect(flood.written).toBe(at);
      sock.destroy();
      flood.res?.destroy();
    });

    test('backpressure: a sandbox that reads nothing stops the ingress reading an upload (bounded)', async () => {
      const sock = net.connect(port, '127.0.0.1');
      sock.on('error', () => undefined);
      await new Promise<void>((r) => sock.once('connect', () => r()));
      sock.write(`POST /hold-upload HTTP/1.1\r\nHost: ${host()}\r\nContent-Length: ${1024 * 2 ** 20}\r\n\r\n`);
      const block = Buffer.alloc(64 * 1024, 1);
      let sent = 0;
      const t0 = Date.now();
      while (Date.now() - t0 < 2000 && sent < 1024 * 2 ** 20) {
        if (sock.writableNeedDrain) await Promise.race([new Promise((r) => sock.once('drain', r)), new Promise((r) => setTimeout(r, 200))]);
        else {
          sock.write(block);
          sent += block.length;
        }
      }
      const accepted = sent - sock.writableLength;
      expect(accepted).toBeLessThan(96 * 2 ** 20);
      sock.destroy();
      upload.hold?.destroy();
    });

    test('a response with both Content-Length and Transfer-Encoding from the sandbox is a 502', async () => {
      const bad = net.createServer((s) => {
        s.once('data', () => s.end('HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n'));
        s.on('error', () => undefined);
      });
      await new Promise<void>((r) => bad.listen(0, '127.0.0.1', r));
      try {
        const p = (bad.address() as net.AddressInfo).port;
        const got = await talk(port, `GET / HTTP/1.1\r\nHost: ${p}-sb-1.localhost\r\nConnection: close\r\n\r\n`);
        expect(statuses(got.text)).toEqual([502]);
      } finally {
        bad.close();
      }
    });
  });
}
