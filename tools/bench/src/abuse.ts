/**
 * GetSandbox latency of a well-behaved client under abuse (section `abuse` of `npm run bench`,
 * issue 10 §5; goal: p99 under each abuse within 2x the quiet p99 of the same run). The client
 * (the shared sandnode client, IN_FLIGHT calls at once on its own connection) runs for
 * BENCH_ABUSE_SECONDS (default 3) per phase, each abuse after a quiet phase of its own:
 * - held: 250 (BENCH_ABUSE_HELD) Exec requests that declare 4 MiB, send 1 MiB and hold the rest
 *   back, 10 per raw HTTP/2 connection on the server's unix socket (held-bytes caps of
 *   server-guards.ts);
 * - preface: 200 connections that send only the HTTP/2 preface and SETTINGS (handshake timeout);
 * - exec flood: 500 Exec streams (`sleep 60`) into one sandbox over 4 connections (the
 *   per-sandbox cap of 64, podd's own cap).
 * The server's RSS (VmRSS of /proc/<pid>/status, MiB) is sampled through each phase; its peak is
 * reported beside the figure.
 */
import { readFileSync } from 'node:fs';
import http2 from 'node:http2';
import net from 'node:net';
import { askVersion, createSandnodeChannel, createServiceClient } from '@sandnode/shared';
import { SandboxServiceDefinition } from '@sandnode/shared/proto/server/v1/sandbox';
import { percentile } from '@sandnode/node-stack';
import { createChannel, type Channel } from 'nice-grpc';

const num = (k: string, d: number) => Number(process.env[k] ?? d);
const r1 = (x: number) => Math.round(x * 10) / 10;
const MiB = 1024 * 1024;
/** GetSandbox calls the well-behaved client has in flight. */
const IN_FLIGHT = 4;

/** One phase: the client's latencies and the server's peak RSS. */
export interface AbusePhase {
  calls: number;
  failed: number;
  p50Ms: number;
  p99Ms: number;
  serverRssPeakMiB: number;
}

/** What benchAbuse measured: each abuse beside the quiet phase before it. */
export interface AbuseBench {
  seconds: number;
  phases: Record<string, { quiet: AbusePhase; abused: AbusePhase; p99Ratio: number; abuse: string }>;
  goalP99Ratio: number;
}

function rssMiB(pid: number): number {
  const m = /^VmRSS:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? r1(Number(m[1]) / 1024) : NaN;
}

function prefix(len: number): Buffer {
  const b = Buffer.alloc(5);
  b.writeUInt32BE(len, 1);
  return b;
}

function connectRaw(sock: string): Promise<http2.ClientHttp2Session> {
  const s = http2.connect('http://localhost', { createConnection: () => net.connect(sock) });
  s.on('error', () => undefined);
  return new Promise((resolve) => s.once('remoteSettings', () => resolve(s)));
}

/** An abuse: start() sets it up and resolves when it is in place; the returned stop() takes it down; says what it did. */
type Abuse = (ctx: { sock: string; address: string; sandboxId: string }) => Promise<{ stop: () => void; what: string }>;

const held: Abuse = async ({ sock }) => {
  const n = Math.max(10, num('BENCH_ABUSE_HELD', 250));
  const conns = await Promise.all(Array.from({ length: Math.ceil(n / 10) }, () => connectRaw(sock)));
  let refused = 0;
  for (const s of conns) {
    for (let i = 0; i < 10; i++) {
      const req = s.request({ ':method': 'POST', ':path': '/sandnode.server.v1.SandboxService/Exec', 'content-type': 'application/grpc', te: 'trailers' });
      req.on('error', () => undefined);
      req.on('data', () => undefined);
      req.on('close', () => refused++);
      req.write(Buffer.concat([prefix(4 * MiB), Buffer.alloc(MiB)]));
    }
  }
  await new Promise((r) => setTimeout(r, 1000)); // the writes reach the server
  return { stop: () => conns.forEach((s) => s.destroy()), what: `${conns.length * 10} held 4 MiB Exec requests, ${refused} refused at once` };
};

const preface: Abuse = async ({ sock }) => {
  const socks = await Promise.all(
    Array.from({ length: 200 }, async () => {
      const s = net.connect(sock);
      s.on('error', () => undefined);
      s.on('data', () => undefined);
      await new Promise((r) => s.once('connect', r));
      s.write(Buffer.concat([Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'), Buffer.from([0, 0, 0, 4, 0, 0, 0, 0, 0])]));
      return s;
    }),
  );
  return { stop: () => socks.forEach((s) => s.destroy()), what: '200 preface-only connections' };
};

const execFlood: Abuse = async ({ address, sandboxId }) => {
  const channels: Channel[] = Array.from({ length: 4 }, () => createChannel(address, undefined, { 'grpc.use_local_subchannel_pool': 1 }));
  const clients = channels.map((ch) => createServiceClient(SandboxServiceDefinition, ch, { timeoutMs: 120_000 }));
  const abort = new AbortController();
  let started = 0;
  let refused = 0;
  const settled: Promise<void>[] = [];
  for (let i = 0; i < 500; i++) {
    settled.push(
      new Promise<void>((resolve) => {
        void (async () => {
          try {
            for await (const ev of clients[i % 4]!.exec({ sandboxId, argv: ['sleep', '60'] }, { signal: abort.signal })) {
              if (ev.event?.$case === 'started') {
                started++;
                resolve();
              }
            }
          } catch {
            refused++;
          }
          resolve();
        })();
      }),
    );
  }
  await Promise.all(settled);
  return {
    stop: () => {
      abort.abort();
      setTimeout(() => channels.forEach((ch) => ch.close()), 1000).unref();
    },
    what: `500 Exec streams: ${started} running, ${refused} refused`,
  };
};

/** benchAbuse runs the phases against the server at address over sandbox ids; rows get the table lines. */
export async function benchAbuse(address: string, ids: string[], rows: (string | number)[][]): Promise<AbuseBench> {
  const seconds = num('BENCH_ABUSE_SECONDS', 3);
  const sock = address.replace(/^unix:\/\//, '');
  const serverPid = (await askVersion(address)).pid;
  const ch = createSandnodeChannel(address);
  const client = createServiceClient(SandboxServiceDefinition, ch, { timeoutMs: 10_000 });
  const measure = async (): Promise<AbusePhase> => {
    await client.getSandbox({ sandboxId: ids[0] as string });
    const ms: number[] = [];
    let failed = 0;
    let rss = rssMiB(serverPid);
    const sampler = setInterval(() => (rss = Math.max(rss, rssMiB(serverPid))), 100);
    const end = Date.now() + seconds * 1000;
    await Promise.all(
      Array.from({ length: IN_FLIGHT }, async (_, w) => {
        for (let i = 0; Date.now() < end; i++) {
          const t0 = performance.now();
          try {
            await client.getSandbox({ sandboxId: ids[(i + w) % ids.length] as string });
            ms.push(performance.now() - t0);
          } catch {
            failed++;
          }
        }
      }),
    );
    clearInterval(sampler);
    return { calls: ms.length, failed, p50Ms: r1(percentile(ms, 50)), p99Ms: r1(percentile(ms, 99)), serverRssPeakMiB: r1(Math.max(rss, rssMiB(serverPid))) };
  };
  const phases: AbuseBench['phases'] = {};
  try {
    for (const [name, abuse] of [
      ['held incomplete requests', held],
      ['preface-only connections', preface],
      ['exec-stream flood', execFlood],
    ] as const) {
      const quiet = await measure();
      const a = await abuse({ sock, address, sandboxId: ids[0] as string });
      const abused = await measure();
      a.stop();
      await new Promise((r) => setTimeout(r, 2000)); // the server lets go of the abuse
      const p99Ratio = Math.round((abused.p99Ms / quiet.p99Ms) * 100) / 100;
      phases[name] = { quiet, abused, p99Ratio, abuse: a.what };
      rows.push([
        `GetSandbox p50 / p99 quiet -> under ${name}`,
        `${quiet.p50Ms} / ${quiet.p99Ms} -> ${abused.p50Ms} / ${abused.p99Ms} ms (x${p99Ratio}; ${abused.failed} failed)`,
        'p99 <= 2x quiet',
        `server RSS ${quiet.serverRssPeakMiB} -> ${abused.serverRssPeakMiB} MiB; ${a.what}`,
      ]);
    }
  } finally {
    ch.close();
  }
  return { seconds, phases, goalP99Ratio: 2 };
}
