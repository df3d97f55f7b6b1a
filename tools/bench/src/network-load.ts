/**
 * HTTP load of the network section (network.ts): the same client against every target (a
 * sandbox address directly, the node's ingress, nginx in front of the same port), so the
 * figures differ only by what sits between. A target is host:port plus the headers it needs
 * (the ingress: Host and the access token).
 *
 * Throughput (requests/s, download) is driven by wrk and curl (Debian's packages, C) when both
 * are on PATH: on 2 cores the load client shares the CPU with the proxy it measures, and
 * node:http as the client costs more CPU per request than the proxies do (see
 * `clientCpuUsPerRequest`), so with it the figures rank the clients' share of the cores, not
 * the proxies. Without them this process's node:http is the client and the figure says so.
 * Latency (one request at a time on one connection) always uses node:http: one request in
 * flight leaves the cores to the proxy, and its client time is the same for every target.
 */
import { existsSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { percentile } from '@sandnode/node-stack';
import { run } from '@sandnode/shared';

/** onPath: the path of cmd in a PATH directory, or undefined. */
function onPath(cmd: string): string | undefined {
  for (const d of (process.env.PATH ?? '').split(':')) if (d !== '' && existsSync(path.join(d, cmd))) return path.join(d, cmd);
  return undefined;
}

/** The throughput client: 'wrk' (wrk for requests/s, curl for downloads) when both are installed, else 'node'. */
export function loadClient(): 'wrk' | 'node' {
  return onPath('wrk') && onPath('curl') ? 'wrk' : 'node';
}

/** headerArgs are t's headers as -H arguments (wrk and curl take the same form); `Host` spelled so, as wrk only replaces its own Host header then (a `host:` went as a second one, answered 400). */
export function headerArgs(t: Target): string[] {
  return Object.entries(t.headers).flatMap(([k, v]) => ['-H', `${k.toLowerCase() === 'host' ? 'Host' : k}: ${v}`]);
}

/** url is t's address with path p. */
function url(t: Target, p: string): string {
  return `http://${t.host}:${t.port}${p}`;
}

/**
 * wrkRequestsPerSecond runs wrk (1 thread, `clients` kept-alive connections, GET /) against t
 * for ms (whole seconds, at least 1) and gives its requests/s. Throws when wrk reports a socket
 * error or a non-2xx answer: a figure only counts answered requests.
 */
export async function wrkRequestsPerSecond(t: Target, clients: number, ms: number): Promise<number> {
  const secs = Math.max(1, Math.round(ms / 1000));
  const { stdout: out } = await run('wrk', ['-t1', `-c${clients}`, `-d${secs}s`, ...headerArgs(t), url(t, '/')], { timeoutMs: secs * 1000 + 30_000 });
  return parseWrk(t.name, out);
}

/** parseWrk reads requests/s from wrk's report; throws (naming target) on socket errors, non-2xx answers or no figure. */
export function parseWrk(target: string, out: string): number {
  const errs = /Socket errors: (.*)/.exec(out);
  if (errs) throw new Error(`${target}: wrk: socket errors ${errs[1]}`);
  const bad = /Non-2xx or 3xx responses: (\d+)/.exec(out);
  if (bad) throw new Error(`${target}: wrk: ${bad[1]} answers were not 2xx/3xx`);
  const m = /Requests\/sec:\s+([\d.]+)/.exec(out);
  if (!m) throw new Error(`${target}: wrk printed no Requests/sec: ${out.slice(0, 300)}`);
  return Number(m[1]);
}

/** curlDownload fetches /bytes/<bytes> with curl (body to /dev/null) and gives MiB/s; throws when the status is not 200 or bytes are missing. */
export async function curlDownload(t: Target, bytes: number): Promise<number> {
  const { stdout: out } = await run('curl', ['-sS', '--http1.1', '-o', '/dev/null', '-w', '%{http_code} %{size_download} %{time_total}', ...headerArgs(t), url(t, `/bytes/${bytes}`)], {
    timeoutMs: 120_000,
  });
  return parseCurl(t.name, out, bytes);
}

/** parseCurl reads curl's `-w '%{http_code} %{size_download} %{time_total}'` line as MiB/s; throws (naming target) on another status or a short body. */
export function parseCurl(target: string, out: string, bytes: number): number {
  const [code, size, secs] = out.trim().split(' ').map(Number);
  if (code !== 200 || size !== bytes || !(secs! > 0)) throw new Error(`${target}: download got ${code}, ${size} of ${bytes} bytes`);
  return bytes / 2 ** 20 / secs!;
}

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

/** download fetches /bytes/<bytes> once and gives MiB/s (curl when loadClient() is 'wrk', else node:http); throws when the status is not 200 or bytes are missing. */
export async function download(t: Target, bytes: number): Promise<number> {
  if (loadClient() === 'wrk') return curlDownload(t, bytes);
  return nodeDownload(t, bytes);
}

/** nodeDownload is download through this process's node:http. */
export async function nodeDownload(t: Target, bytes: number): Promise<number> {
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

/** requestsPerSecond runs `clients` kept-alive connections of GET / for ms and gives requests/s (wrk when loadClient() is 'wrk', else node:http); any failed request throws. */
export async function requestsPerSecond(t: Target, clients: number, ms: number): Promise<number> {
  if (loadClient() === 'wrk') return wrkRequestsPerSecond(t, clients, ms);
  return nodeRequestsPerSecond(t, clients, ms).then((r) => r.rps);
}

/**
 * nodeRequestsPerSecond runs `clients` loops of GET / through this process's node:http for ms:
 * requests/s and this process's CPU per request (µs: the client's own cost, user + system).
 */
export async function nodeRequestsPerSecond(t: Target, clients: number, ms: number): Promise<{ rps: number; clientCpuUsPerRequest: number }> {
  const cpu0 = process.cpuUsage();
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
    const cpu = process.cpuUsage(cpu0);
    return { rps: Math.round(done / ((performance.now() - t0) / 1000)), clientCpuUsPerRequest: Math.round(((cpu.user + cpu.system) / Math.max(1, done)) * 10) / 10 };
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
