/**
 * The ingress with real sockets: a "sandbox" is a netns of this test (sandbox-netns.ts) with an
 * HTTP server, a WebSocket echo, a TCP echo, a loopback-only TCP echo reached through a real
 * podd process (dist/main.js) inside the netns, and the ingress on 127.0.0.1:<random>.
 * Needs root (ip netns) and `npx tsc -b services/podd/tsconfig.build.json`.
 */
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { createLogger } from '@sandnode/shared';
import { built, describeWith, PARTS, waitFor } from '@sandnode/testkit';
import { MapNetworkDirectory, type SandboxNetworkView } from '../../core/network-directory';
import { createIngress, INGRESS_ENGINES, type Ingress } from '../ingress';
import { poddRelay, type PoddRelay } from '../ingress-podd';
import { startSandboxNetns, type SandboxNetns } from './sandbox-netns';

const PODD_MAIN = path.resolve(__dirname, '../../../../podd/dist/main.js');
const TOKEN = 'secret-token-of-the-test';

/** get sends one request and returns status, headers and body. */
function request(port: number, o: { path?: string; host?: string; headers?: Record<string, string>; method?: string; body?: string; agent?: http.Agent }) {
  return new Promise<{ status: number; headers: http.IncomingHttpHeaders; body: string }>((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path: o.path ?? '/echo', method: o.method ?? 'GET', headers: { ...(o.host ? { host: o.host } : {}), ...o.headers }, agent: o.agent }, (res) => {
      let body = '';
      res.on('data', (d: Buffer) => (body += d.toString()));
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body }));
    });
    req.on('error', reject);
    req.end(o.body);
  });
}

/** readUntil reads from sock until the text read so far satisfies done. */
function readUntil(sock: net.Socket, done: (s: string) => boolean): Promise<string> {
  return new Promise((resolve, reject) => {
    let s = '';
    const on = (d: Buffer) => {
      s += d.toString('latin1');
      if (done(s)) {
        sock.off('data', on);
        resolve(s);
      }
    };
    sock.on('data', on);
    sock.once('error', reject);
  });
}

function wsFrame(text: string): Buffer {
  const p = Buffer.from(text);
  const mask = Buffer.from([1, 2, 3, 4]);
  const masked = Buffer.from(p.map((b, i) => b ^ mask[i % 4]!));
  return Buffer.concat([Buffer.from([0x81, 0x80 | p.length]), mask, masked]);
}

/** openWebSocket does the handshake through the ingress and returns the socket after the 101. */
async function openWebSocket(port: number, host: string): Promise<net.Socket> {
  const sock = net.connect(port, '127.0.0.1');
  await new Promise<void>((r) => sock.once('connect', () => r()));
  sock.write(
    `GET /ws HTTP/1.1\r\nHost: ${host}\r\nsandnode-access-token: ${TOKEN}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n`,
  );
  const head = await readUntil(sock, (s) => s.includes('\r\n\r\n'));
  expect(head).toMatch(/^HTTP\/1\.1 101 /);
  return sock;
}

async function wsEcho(sock: net.Socket, text: string): Promise<string> {
  const got = readUntil(sock, (s) => s.length >= 2 + text.length);
  sock.write(wsFrame(text));
  return (await got).slice(2);
}

for (const engine of INGRESS_ENGINES) {
  describeWith(`ingress [${engine}] (real sockets, a netns sandbox, a real podd)`, [PARTS.root, built('@sandnode/podd')], () => {
    let sb: SandboxNetns & { dir: string };
    let dir: MapNetworkDirectory;
    let ingress: Ingress;
    let relay: PoddRelay;
    let port: number;
    let view: SandboxNetworkView;
    const id = 'sb-00000000000000aa';
    const host = (p: number, sid = id) => `${p}-${sid}.localhost:${port}`;
    const auth = { 'sandnode-access-token': TOKEN };

    beforeAll(async () => {
      sb = await startSandboxNetns();
      const podd = sb.spawnInside([process.execPath, PODD_MAIN, '--socket', path.join(sb.dir, 'podd.sock')]);
      podd.stdout?.resume();
      view = {
        sandboxId: id,
        state: 'RUNNING',
        slot: 0,
        address: sb.address,
        gateway: sb.gateway,
        policy: { allowOut: [], denyOut: [], blockAll: false } as unknown as SandboxNetworkView['policy'],
        public: false,
        accessTokenSha256: createHash('sha256').update(TOKEN).digest('hex'),
        poddAddress: `unix://${path.join(sb.dir, 'podd.sock')}`,
      };
      dir = new MapNetworkDirectory();
      dir.set(view);
      relay = poddRelay();
      ingress = createIngress({ engine, directory: dir, domain: 'localhost', log: createLogger('server', 'test', 'silent'), podd: relay, limits: { headersTimeoutMs: 1000 } });
      await new Promise<void>((r) => ingress.server.listen(0, '127.0.0.1', r));
      port = (ingress.server.address() as net.AddressInfo).port;
      await waitFor('podd in the netns', () => existsSync(path.join(sb.dir, 'podd.sock')), 10_000);
    }, 30_000);
    afterAll(async () => {
      await ingress?.close();
      relay?.close();
      sb?.stop();
    });

    test('routes by Host (any port on it) and by the sandnode headers; the token never goes upstream', async () => {
      const a = await request(port, { host: `8080-${id}.localhost:9999`, headers: auth, path: '/echo?x=1', method: 'POST', body: 'hello' });
      expect(a.status).toBe(200);
      const ja = JSON.parse(a.body) as { method: string; url: string; headers: Record<string, string>; body: string };
      expect(ja).toMatchObject({ method: 'POST', url: '/echo?x=1', body: 'hello' });
      expect(ja.headers['sandnode-access-token']).toBeUndefined();
      expect(ja.headers['x-forwarded-for']).toBe('127.0.0.1');
      const b = await request(port, { host: 'whatever', headers: { ...auth, 'sandnode-sandbox-id': id, 'sandnode-sandbox-port': '8080' } });
      expect(b.status).toBe(200);
      expect(JSON.parse(b.body).headers['sandnode-sandbox-id']).toBeUndefined();
    });

    test('keep-alive: several requests on one client connection', async () => {
      const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
      const sockets = new Set<net.Socket>();
      agent.on('free', (s: net.Socket) => sockets.add(s));
      for (let i = 0; i < 5; i++) expect((await request(port, { host: host(8080), headers: auth, agent })).status).toBe(200);
      expect(sockets.size).toBe(1);
      agent.destroy();
    });

    test('401 without or with a wrong token; a public sandbox needs none', async () => {
      const none = await request(port, { host: host(8080) });
      expect(none.status).toBe(401);
      expect(none.body).toMatch(/private: send its access token in the sandnode-access-token header\n$/);
      expect((await request(port, { host: host(8080), headers: { 'sandnode-access-token': 'wrong' } })).status).toBe(401);
      dir.set({ ...view, public: true });
      try {
        expect((await request(port, { host: host(8080) })).status).toBe(200);
      } finally {
        dir.set(view);
      }
    });

    test('404 unknown sandbox, 400 bad Host, 503 + Retry-After paused, 502 closed port', async () => {
      const unknown = await request(port, { host: host(8080, 'sb-00000000000000ff'), headers: auth });
      expect(unknown.status).toBe(404);
      expect(unknown.body).toMatch(/no networked sandbox sb-00000000000000ff/);
      expect((await request(port, { host: `localhost:${port}`, headers: auth })).status).toBe(400);
      expect((await request(port, { host: `0-${id}.localhost`, headers: auth })).status).toBe(400);
      expect((await request(port, { host: 'x', headers: { 'sandnode-sandbox-id': id, 'sandnode-sandbox-port': '70000' } })).status).toBe(400);
      dir.set({ ...view, state: 'PAUSED' });
      try {
        const paused = await request(port, { host: host(8080), headers: auth });
        expect(paused.status).toBe(503);
        expect(paused.headers['retry-after']).toBe('5');
        expect(paused.body).toMatch(/is PAUSED, not RUNNING/);
      } finally {
        dir.set(view);
      }
      const closed = await request(port, { host: host(8099), headers: auth });
      expect(closed.status).toBe(502);
      expect(closed.body).toBe(`nothing listens on port 8099 of sandbox ${id}\n`);
    });

    test('a streamed response arrives chunk by chunk as the sandbox writes it', async () => {
      const chunks: string[] = [];
      await new Promise<void>((resolve, reject) => {
        const req = http.request({ host: '127.0.0.1', port, path: '/trickle', headers: { host: host(8080), ...auth } }, (res) => {
          res.on('data', (d: Buffer) => {
            chunks.push(d.toString());
            // the next chunk is written only once this one arrived: a buffering proxy would hang here
            if (chunks.length < 3) void request(port, { host: host(8080), headers: auth, path: '/next' });
          });
          res.on('end', () => resolve());
        });
        req.on('error', reject);
        req.end();
      });
      expect(chunks.join('')).toBe('chunk1\nchunk2\nchunk3\n');
      expect(chunks.length).toBe(3);
    });

    test('a response head the sandbox sends before its body reaches the client before the body', async () => {
      const body = await new Promise<string>((resolve, reject) => {
        const req = http.request({ host: '127.0.0.1', port, path: '/headfirst', headers: { host: host(8080), ...auth } }, (res) => {
          // the body is written only once the head arrived: a proxy holding the head for the first body bytes would hang here
          void request(port, { host: host(8080), headers: auth, path: '/next' });
          let b = '';
          res.on('data', (d: Buffer) => (b += d.toString()));
          res.on('end', () => resolve(b));
        });
        req.on('error', reject);
        req.end();
      });
      expect(body).toBe('body');
    });

    test('a response body the sandbox cuts short is cut short for the client too (never a clean end)', async () => {
      const outcome = await new Promise<{ bytes: number; ended: boolean }>((resolve) => {
        const req = http.request({ host: '127.0.0.1', port, path: '/cut', headers: { host: host(8080), ...auth } }, (res) => {
          let bytes = 0;
          let ended = false;
          res.on('data', (d: Buffer) => (bytes += d.length));
          res.on('end', () => (ended = true));
          res.on('close', () => resolve({ bytes, ended }));
          res.on('error', () => undefined);
        });
        req.on('error', () => undefined);
        req.end();
      });
      expect(outcome).toEqual({ bytes: 10, ended: false });
    });

    test('a large request body streams through whole', async () => {
      const body = 'x'.repeat(5 * 1024 * 1024);
      const r = await request(port, { host: host(8080), headers: auth, method: 'PUT', body });
      expect(JSON.parse(r.body).body.length).toBe(body.length);
    });

    test('WebSocket echo', async () => {
      const sock = await openWebSocket(port, host(8081));
      expect(await wsEcho(sock, 'hello ws')).toBe('hello ws');
      expect(await wsEcho(sock, 'again')).toBe('again');
      sock.destroy();
      await waitFor('the tunnel released', () => ingress.openPerSandbox(id) === 0);
    });

    test('CONNECT: 200, then raw TCP to the sandbox port (echo)', async () => {
      const sock = net.connect(port, '127.0.0.1');
      sock.write(`CONNECT ${host(8082)} HTTP/1.1\r\nHost: ${host(8082)}\r\nsandnode-access-token: ${TOKEN}\r\n\r\n`);
      const head = await readUntil(sock, (s) => s.includes('\r\n\r\n'));
      expect(head).toMatch(/^HTTP\/1\.1 200 /);
      const echoed = readUntil(sock, (s) => s === 'raw bytes\n');
      sock.write('raw bytes\n');
      expect(await echoed).toBe('raw bytes\n');
      sock.destroy();
    });

    test('a service on 127.0.0.1 inside is reached through podd ForwardPort (CONNECT and HTTP)', async () => {
      const sock = net.connect(port, '127.0.0.1');
      sock.write(`CONNECT ${host(8083)} HTTP/1.1\r\nsandnode-access-token: ${TOKEN}\r\n\r\n`);
      expect(await readUntil(sock, (s) => s.includes('\r\n\r\n'))).toMatch(/^HTTP\/1\.1 200 /);
      const echoed = readUntil(sock, (s) => s === 'via podd\n');
      sock.write('via podd\n');
      expect(await echoed).toBe('via podd\n');
      sock.destroy();
      // HTTP too, several requests (the relayed upstream connection is pooled like a TCP one)
      for (const p of ['/a', '/b', '/c']) {
        const r = await request(port, { host: host(8084), headers: auth, path: p });
        expect(r).toMatchObject({ status: 200, body: `loopback http ${p}` });
      }
    });

    test('bounds: one more connection than maxPerSandbox gets 429; a silent tunnel is closed after idleTimeoutMs', async () => {
      const small = createIngress({ engine, directory: dir, domain: 'localhost', log: createLogger('server', 'test', 'silent'), limits: { maxPerSandbox: 1, idleTimeoutMs: 300 } });
      await new Promise<void>((r) => small.server.listen(0, '127.0.0.1', r));
      const p = (small.server.address() as net.AddressInfo).port;
      try {
        const sock = net.connect(p, '127.0.0.1');
        sock.write(`CONNECT ${host(8082)} HTTP/1.1\r\nsandnode-access-token: ${TOKEN}\r\n\r\n`);
        expect(await readUntil(sock, (s) => s.includes('\r\n\r\n'))).toMatch(/^HTTP\/1\.1 200 /);
        const second = await request(p, { host: host(8080), headers: auth });
        expect(second.status).toBe(429);
        expect(second.body).toBe(`too many connections to sandbox ${id} (1)\n`);
        // nothing more is sent: the tunnel is closed by the idle timeout, and its slot is free again
        await new Promise<void>((r) => sock.once('close', () => r()));
        await waitFor('the tunnel released', () => small.openPerSandbox(id) === 0);
        expect((await request(p, { host: host(8080), headers: auth })).status).toBe(200);
      } finally {
        await small.close();
      }
    });

    test('slowloris: a request head that does not complete is closed after headersTimeoutMs', async () => {
      const sock = net.connect(port, '127.0.0.1');
      sock.write(`GET / HTTP/1.1\r\nHost: ${host(8080)}\r\n`);
      const got = await new Promise<string>((resolve) => {
        let s = '';
        sock.on('data', (d: Buffer) => (s += d.toString()));
        sock.on('close', () => resolve(s));
      });
      expect(got).toMatch(/^HTTP\/1\.1 408 /);
    });

    test('an oversized request head gets 431', async () => {
      const r = await request(port, { host: host(8080), headers: { ...auth, 'x-big': 'y'.repeat(20 * 1024) } }).catch((e: Error) => ({ status: -1, body: e.message }));
      expect(r.status).toBe(431);
    });
  });
}
