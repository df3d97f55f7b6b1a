/**
 * HTTP load of the network section (network.ts): the same client against every target (a
 * sandbox address directly, the node's ingress, nginx in front of the same port), so the
 * figures differ only by what sits between. A target is host:port plus the headers it needs
 * (the ingress: Host and the access token).
 */
import http from 'node:http';
import net from 'node:net';
import { percentile } from '@sandnode/node-stack';

/** Where a load goes: host, port and the headers every request carries. */
export interface Target {
  name: string;
  host: string;
  port: number;
  headers: Record<string, string>;
}

/** get sends GET path with agent and resolves with the status and the body's length in bytes; rejects on a socket error. */
function get(t: Target, path: string, agent: http.Agent | false): Promise<{ status: number; bytes: number }> {
  return new Promise((resolve, reject) => {
    const req = http.get({ host: t.host, port: t.port, path, headers: t.headers, agent }, (res) => {
      let bytes = 0;
      res.on('data', (c: Buffer) => (bytes += c.length));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, bytes }));
      res.on('error', reject);
    });
    req.on('error', reject);
  });
}

/** download fetches /bytes/<bytes> once and gives MiB/s; throws when the status is not 200 or bytes are missing. */
export async function download(t: Target, bytes: number): Promise<number> {
  const t0 = performance.now();
  const r = await get(t, `/bytes/${bytes}`, false);
  const s = (performance.now() - t0) / 1000;
  if (r.status !== 200 || r.bytes !== bytes) throw new Error(`${t.name}: download got ${r.status}, ${r.bytes} of ${bytes} bytes`);
  return bytes / 2 ** 20 / s;
}

/** latency sends n sequential GET / on one kept-alive connection (after 20 warm-up ones) and gives each round trip in ms. */
export async function latency(t: Target, n: number): Promise<number[]> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  try {
    const out: number[] = [];
    for (let i = 0; i < n + 20; i++) {
      const t0 = performance.now();
      const r = await get(t, '/', agent);
      if (r.status !== 200) throw new Error(`${t.name}: GET / got ${r.status}`);
      if (i >= 20) out.push(performance.now() - t0);
    }
    return out;
  } finally {
    agent.destroy();
  }
}

/** requestsPerSecond runs `clients` loops of GET / on kept-alive connections for ms and gives requests/s; any failed request throws. */
export async function requestsPerSecond(t: Target, clients: number, ms: number): Promise<number> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: clients });
  try {
    let done = 0;
    const end = performance.now() + ms;
    const t0 = performance.now();
    await Promise.all(
      Array.from({ length: clients }, async () => {
        while (performance.now() < end) {
          const r = await get(t, '/', agent);
          if (r.status !== 200) throw new Error(`${t.name}: GET / got ${r.status}`);
          done++;
        }
      }),
    );
    return done / ((performance.now() - t0) / 1000);
  } finally {
    agent.destroy();
  }
}

/**
 * openUpgraded opens n WebSocket-style upgrades (GET /ws, Upgrade: websocket) to t, n at a
 * time in batches of 50, and resolves once every one got its 101; the sockets stay open until
 * the returned close(). Throws (after closing what opened) when one is answered otherwise.
 */
export async function openUpgraded(t: Target, n: number): Promise<{ close(): void }> {
  const sockets: net.Socket[] = [];
  const close = () => {
    for (const s of sockets) s.destroy();
  };
  const one = () =>
    new Promise<void>((resolve, reject) => {
      const s = net.connect(t.port, t.host);
      sockets.push(s);
      let head = '';
      s.on('error', reject);
      s.on('connect', () => {
        const h = Object.entries(t.headers)
          .map(([k, v]) => `${k}: ${v}\r\n`)
          .join('');
        s.write(`GET /ws HTTP/1.1\r\n${h}Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: c2FuZG5vZGUtYmVuY2gtMDE=\r\n\r\n`);
      });
      s.on('data', (c: Buffer) => {
        head += c.toString('latin1');
        if (!head.includes('\r\n\r\n')) return;
        if (head.startsWith('HTTP/1.1 101')) resolve();
        else reject(new Error(`${t.name}: upgrade answered ${head.split('\r\n')[0]}`));
      });
    });
  try {
    for (let i = 0; i < n; i += 50) await Promise.all(Array.from({ length: Math.min(50, n - i) }, one));
  } catch (err) {
    close();
    throw err;
  }
  return { close };
}

/** p returns percentile q of xs rounded to 0.01 (ms figures below 1 ms matter here). */
export function p(xs: number[], q: number): number {
  return Math.round(percentile(xs, q) * 100) / 100;
}
