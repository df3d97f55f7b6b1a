import net from 'node:net';
import { createLogger } from '@sandnode/shared';
import { MapNetworkDirectory } from '../core/network-directory';
import { createIngress } from './ingress';
import type { IngressEngine } from './ingress-common';
import { loopbackView } from './__tests__/loopback-view';
import { sha } from './__tests__/raw-rig';

/**
 * attack4 (attacker finding): a client that sent its request and closed its socket while the
 * answer's head had come but its body was silent (a long poll, SSE between beats) kept the
 * exchange — and the sandbox's slot of ingressMaxConnectionsPerSandbox — until the idle timeout
 * (120 s): 512 such requests, every client gone, answered every new request to that sandbox 429
 * for 2 minutes, with the attacker holding no socket. Now a silent answer to a client that sent
 * its FIN ends after halfClosedIdleMs; a flowing one still reaches a half-closed client whole.
 */
describe.each(['raw', 'node-http'] as IngressEngine[])('ingress [%s]: a client gone mid-answer frees its slot', (engine) => {
  const dir = new MapNetworkDirectory();
  const upstreams = new Set<net.Socket>();
  let upstream: net.Server;
  let ingress: ReturnType<typeof createIngress>;
  let port: number;
  let upPort: number;

  beforeAll(async () => {
    upstream = net.createServer({ allowHalfOpen: true }, (sock) => {
      upstreams.add(sock);
      // the ingress let go of this upstream connection: it sent its FIN (or reset it)
      sock.once('end', () => upstreams.delete(sock) && sock.end());
      sock.once('close', () => upstreams.delete(sock));
      sock.on('error', () => undefined);
      let got = '';
      sock.on('data', (d: Buffer) => {
        got += d.toString('latin1');
        if (!got.includes('\r\n\r\n')) return;
        if (got.startsWith('GET /silent'))
          sock.write('HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n'); // ...and nothing more
        else if (got.startsWith('GET /slow')) {
          // 10 chunks of "x\n", one every 100 ms: the answer keeps flowing after the client's FIN
          sock.write('HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n');
          let n = 0;
          const t = setInterval(() => {
            sock.write('x\n');
            if (++n === 10) clearInterval(t);
          }, 100);
        }
        got = '';
      });
    });
    await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
    upPort = (upstream.address() as net.AddressInfo).port;
    dir.set({ ...loopbackView({}), accessTokenSha256: sha('token-a') });
    ingress = createIngress({ engine, directory: dir, domain: 'localhost', log: createLogger('attack4', '0', 'silent'), limits: { maxPerSandbox: 4, halfClosedIdleMs: 300 } });
    await new Promise<void>((r) => ingress.server.listen(0, '127.0.0.1', r));
    port = (ingress.server.address() as net.AddressInfo).port;
  });
  afterAll(async () => {
    await ingress?.close();
    for (const s of upstreams) s.destroy();
    await new Promise((r) => upstream?.close(r));
  });

  const req = (path: string) => `GET ${path} HTTP/1.1\r\nHost: ${upPort}-sb-1.localhost\r\nsandnode-access-token: token-a\r\n\r\n`;

  /** opens a connection, sends the request, waits for the answer's head, then `end`s (FIN) or destroys it; resolves with what it read by then. */
  function askThenLeave(path: string, how: 'end' | 'destroy'): Promise<string> {
    return new Promise((resolve, reject) => {
      const s = net.connect({ port, host: '127.0.0.1', allowHalfOpen: true });
      let got = '';
      s.on('error', reject);
      s.on('data', (d: Buffer) => {
        got += d.toString('latin1');
        if (got.includes('\r\n\r\n')) {
          if (how === 'end') s.end();
          else s.destroy();
          resolve(got);
        }
      });
      s.write(req(path));
    });
  }

  const until = async (ok: () => boolean, ms: number) => {
    const end = Date.now() + ms;
    while (!ok() && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
    return ok();
  };

  test('clients that closed while a silent answer was on the way free their slots: the next request gets 200, not 429', async () => {
    for (let i = 0; i < 4; i++) expect(await askThenLeave('/silent', i % 2 ? 'end' : 'destroy')).toMatch(/^HTTP\/1\.1 200 /);
    // every slot taken by a client that is gone: each upstream closes once the quiet limit passes
    expect(await until(() => upstreams.size === 0, 3000)).toBe(true);
    const s = net.connect(port, '127.0.0.1');
    const got = await new Promise<string>((resolve) => {
      let g = '';
      s.on('data', (d: Buffer) => {
        g += d.toString('latin1');
        if (g.includes('\r\n\r\n')) resolve(g);
      });
      s.on('error', () => resolve(g));
      s.write(req('/slow'));
    });
    s.destroy();
    expect(got).toMatch(/^HTTP\/1\.1 200 /);
  });

  // raw: a flowing answer reaches a half-closed client whole; node-http: node:http takes the FIN
  // as the client gone (as nginx with proxy_ignore_client_abort off) and lets the upstream go
  test(engine === 'raw' ? 'a half-closed client that still reads gets a flowing answer whole (1 s of chunks, limit 300 ms)' : 'a FIN ends the exchange at once and lets the upstream go', async () => {
    const body = await new Promise<string>((resolve, reject) => {
      const s = net.connect({ port, host: '127.0.0.1', allowHalfOpen: true });
      let got = '';
      s.on('error', reject);
      s.on('data', (d: Buffer) => (got += d.toString('latin1')));
      s.on('end', () => resolve(got));
      s.on('close', () => resolve(got));
      s.write(req('/slow'), () => s.end()); // the request, then FIN at once
      setTimeout(() => resolve(got), 4000);
    });
    if (engine === 'node-http') {
      expect(body).toBe('');
      expect(await until(() => upstreams.size === 0, 3000)).toBe(true);
      return;
    }
    expect(body).toMatch(/^HTTP\/1\.1 200 /);
    expect(body.slice(body.indexOf('\r\n\r\n') + 4)).toBe('x\n'.repeat(10));
  });
});
