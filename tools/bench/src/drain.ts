/**
 * Drain benchmark (part of live-upgrade.ts, on its node; and BENCH_SECTIONS=drain on nodes of
 * its own, see benchDrainBuilds): drain of N sandboxes (BENCH_DRAIN, default 50) at
 * concurrency 8 vs 1: the Drain RPC's wall time, the server's own duration,
 * each sandbox's time (p50), how the device manager stopped, and, independent of the host's
 * load, what one sandbox's drain cost the vmm-supervisor: host processes started (by command)
 * and CPU ms of its process tree (vmm-cost.ts).
 */
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { createSandnodeChannel, createServiceClient, mapLimit, socketPath, unixAddress } from '@sandnode/shared';
import { AdminServiceDefinition } from '@sandnode/shared/proto/server/v1/admin';
import { COMPONENTS, connectServer, findRunning, percentile, purgeNode, startComponent, stopComponent, waitForActiveServer, type ServerApi, type StackDirs } from '@sandnode/node-stack';
import { spreadOf } from './results';
import { costPer, vmmCost } from './vmm-cost';

const num = (k: string, d: number) => Number(process.env[k] ?? d);
const r1 = (x: number) => Math.round(x * 10) / 10;
const METRICS_ENV = 'SANDNODE_VMM_SUPERVISOR_METRICS_LISTEN';

/** freePort is a TCP port on 127.0.0.1 nothing listened on a moment ago. */
async function freePort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const port = (srv.address() as { port: number }).port;
  await new Promise((r) => srv.close(r));
  return port;
}

let metricsAddress: string | undefined;

/** cpuTimes: the host's busy and total CPU time so far (/proc/stat "cpu" line, clock ticks; busy = all but idle and iowait). */
export function cpuTimes(stat = readFileSync('/proc/stat', 'utf8')): { busy: number; total: number } {
  const f = stat.split('\n')[0]!.trim().split(/\s+/).slice(1).map(Number);
  const total = f.reduce((a, b) => a + b, 0);
  const idle = (f[3] ?? 0) + (f[4] ?? 0);
  return { busy: total - idle, total };
}

/** busyCores is how many of the host's cores were busy on average between two cpuTimes readings. */
export function busyCores(a: { busy: number; total: number }, b: { busy: number; total: number }, cores = os.cpus().length): number {
  const dt = b.total - a.total;
  return dt > 0 ? ((b.busy - a.busy) / dt) * cores : 0;
}

/**
 * withVmmMetrics runs start (which starts the node's components) with the vmm-supervisor's
 * /metrics on a free local port (unless the caller's env set one), then restores the env.
 */
export async function withVmmMetrics(start: () => Promise<void>): Promise<void> {
  const had = process.env[METRICS_ENV];
  metricsAddress = had || `127.0.0.1:${await freePort()}`;
  process.env[METRICS_ENV] = metricsAddress;
  try {
    await start();
  } finally {
    if (had === undefined) delete process.env[METRICS_ENV];
    else process.env[METRICS_ENV] = had;
  }
}

/** DrainFigures: what benchDrain measured (wall ms per concurrency, their ratio, the rest in detail). */
export interface DrainFigures {
  sandboxes: number;
  c8?: number;
  c1?: number;
  ratio: number;
  [k: string]: unknown;
}

/**
 * benchDrain creates sandboxes up to BENCH_DRAIN on the node of dirs, drains them at
 * concurrency 8 then 1 (resuming them in between; the ublk-manager is started again from
 * buildDir, default this build), and adds its rows (their names start with label).
 */
export async function benchDrain(dirs: StackDirs, api: ServerApi, rows: (string | number)[][], label = '', buildDir?: string): Promise<DrainFigures> {
  const n = num('BENCH_DRAIN', 50);
  const have = (await api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes.length;
  await mapLimit(Array.from({ length: Math.max(0, n - have) }), 4, () => api.sandboxes.createSandbox({ template: 'base' }));
  const drainMs: Record<string, number> = {};
  const drainDetail: Record<string, unknown> = {};
  const vmmPid = findRunning(dirs, 'vmm-supervisor')?.pid;
  for (const conc of [8, 1]) {
    const holder = await waitForActiveServer(dirs.runDir);
    const ch = createSandnodeChannel(holder.admin);
    const before = vmmPid && metricsAddress ? await vmmCost(vmmPid, metricsAddress, holder.holderPid) : undefined;
    const cpu0 = cpuTimes();
    const t0 = performance.now();
    const r = await createServiceClient(AdminServiceDefinition, ch, { timeoutMs: 600_000 }).drain({ deadlineMs: 600_000, concurrency: conc });
    drainMs[`c${conc}`] = Math.round(performance.now() - t0);
    // how much of the host the drain kept busy: at c=1 it bounds what concurrency can give here
    const cores = busyCores(cpu0, cpuTimes());
    const after = before ? await vmmCost(vmmPid!, metricsAddress!, holder.holderPid) : undefined;
    ch.close();
    drainMs[`c${conc}Preserved`] = r.sandboxes.filter((s) => s.outcome === 1).length;
    drainDetail[`c${conc}`] = {
      serverMs: r.durationMs,
      sandboxP50Ms: r1(
        percentile(
          r.sandboxes.map((s) => s.ms),
          50,
        ),
      ),
      sandboxMaxMs: Math.max(0, ...r.sandboxes.map((s) => s.ms)),
      deviceManagerStopped: r.deviceManagerStopped,
      deviceManagerError: r.deviceManagerError,
      busyCores: Math.round(cores * 100) / 100,
      // what one sandbox's drain cost the vmm-supervisor (independent of the host's load)
      perSandbox: before && after ? costPer(before, after, Math.max(1, r.sandboxes.length)) : undefined,
    };
    // bring the node back: device manager up (the caller deletes the sandboxes after the last
    // round), sandboxes resumed for the next round (once more after a failure: a podd booting
    // on a host with a load of 60 may not answer within its 20 s)
    await startComponent(dirs, 'ublk-manager', { buildDir });
    if (conc === 1) continue;
    await mapLimit(r.sandboxes, 8, (s) => api.sandboxes.resumeSandbox({ sandboxId: s.sandboxId }).catch(() => api.sandboxes.resumeSandbox({ sandboxId: s.sandboxId })));
  }
  const ratio = r1((drainMs.c1 ?? 0) / (drainMs.c8 ?? 1));
  const load = os.loadavg().map(r1);
  rows.push([`${label}drain of ${n} sandboxes: concurrency 8 vs 1`, `${drainMs.c8} ms vs ${drainMs.c1} ms (x${ratio}; load avg ${load.join(' ')})`, 'c=8 >= x3 faster']);
  const c1Busy = (drainDetail.c1 as { busyCores?: number } | undefined)?.busyCores ?? 0;
  const cores = os.cpus().length;
  // the drain's work is CPU (runc, mounts, the services): c=1 keeping b of the host's n cores busy leaves concurrency at most n/b
  const cpuBound = c1Busy > 0 ? r1(cores / c1Busy) : undefined;
  rows.push([
    `  ${label}drain: host cores busy at c=8 / c=1 (of ${cores})`,
    `${(drainDetail.c8 as { busyCores?: number } | undefined)?.busyCores ?? '-'} / ${c1Busy}`,
    cpuBound ? `concurrency gives at most x${cpuBound} here` : '',
  ]);
  for (const conc of [8, 1]) {
    const per = (drainDetail[`c${conc}`] as { perSandbox?: ReturnType<typeof costPer> }).perSandbox;
    if (!per) continue;
    const by = Object.entries(per.byCommand)
      .map(([k, v]) => `${k} ${v}`)
      .join(', ');
    rows.push([
      `  ${label}drain c=${conc}, per sandbox: vmm-supervisor process starts / CPU ms (kernel) / server CPU ms`,
      `${per.processStarts} / ${per.cpuMs} (${per.sysMs}) / ${per.serverCpuMs} ms`,
      '(load-independent)',
      by || 'none',
    ]);
  }
  return { sandboxes: n, ...drainMs, ratio, detail: drainDetail, loadAverage: load, goalRatio: 3, cores, cpuBoundRatio: cpuBound };
}

/**
 * benchDrainBuilds is BENCH_SECTIONS=drain: benchDrain on a node of its own (under root) per
 * build, this checkout's and, when BENCH_BUILD_DIR names another built checkout (the baseline,
 * e.g. a worktree of main after `npm run build`), that one's, in BENCH_DRAIN_ROUNDS (default 2)
 * alternating rounds so that both see the same host; each round's node is started, given the
 * base template and BENCH_DRAIN sandboxes, drained at 8 and 1, and purged. Rows: each round's,
 * then per build the spread of c=8, c=1 and their ratio over the rounds.
 */
export async function benchDrainBuilds(root: string, rows: (string | number)[][]): Promise<Record<string, unknown>> {
  const base = process.env.BENCH_BUILD_DIR;
  const builds: { name: string; dir?: string }[] = [{ name: 'this build' }, ...(base ? [{ name: `baseline ${path.resolve(base)}`, dir: path.resolve(base) }] : [])];
  const rounds = Math.max(1, num('BENCH_DRAIN_ROUNDS', 2));
  const runs: Record<string, DrainFigures[]> = Object.fromEntries(builds.map((b) => [b.name, []]));
  for (let round = 0; round < rounds; round++) {
    // alternate which build goes first: a host that slows down during the run hits both
    for (const b of round % 2 ? [...builds].reverse() : builds) {
      const dirs: StackDirs = { stateDir: path.join(root, `drain-${round}-state`), runDir: path.join(root, `drain-${round}-run`), listen: '' };
      try {
        await withVmmMetrics(async () => {
          for (const c of COMPONENTS) await startComponent(dirs, c, { buildDir: b.dir });
        });
        const api = connectServer(unixAddress(socketPath(dirs.runDir, 'server')));
        try {
          await api.templates.buildTemplate({ name: 'base', replace: false });
          runs[b.name]!.push(await benchDrain(dirs, api, rows, `${b.name}, round ${round + 1}: `, b.dir));
        } finally {
          api.close();
        }
      } finally {
        for (const c of [...COMPONENTS].reverse()) await stopComponent(dirs, c).catch(() => undefined);
        await purgeNode(dirs).catch(() => undefined);
      }
    }
  }
  const out: Record<string, unknown> = { rounds, builds: builds.map((b) => b.name), goalRatio: 3 };
  for (const b of builds) {
    const rs = runs[b.name]!;
    const c8 = spreadOf(rs.map((r) => r.c8 ?? 0));
    const c1 = spreadOf(rs.map((r) => r.c1 ?? 0));
    const ratio = spreadOf(rs.map((r) => r.ratio));
    out[b.name] = { runs: rs, c8SpreadMs: c8, c1SpreadMs: c1, ratioSpread: ratio };
    rows.push([
      `drain (${b.name}): c=8 / c=1 / ratio over ${rs.length} rounds`,
      `${c8.text} ms / ${c1.text} ms / x${ratio.text}`,
      'c=8 >= x3 faster',
      base ? 'baseline from the same run' : 'no BENCH_BUILD_DIR: no baseline',
    ]);
  }
  return out;
}
