/**
 * Drain benchmark (part of live-upgrade.ts, on its node): drain of N sandboxes (BENCH_DRAIN,
 * default 50) at concurrency 8 vs 1: the Drain RPC's wall time, the server's own duration,
 * each sandbox's time (p50), how the device manager stopped, and, independent of the host's
 * load, what one sandbox's drain cost the vmm-supervisor: host processes started (by command)
 * and CPU ms of its process tree (vmm-cost.ts).
 */
import { createServer } from 'node:net';
import os from 'node:os';
import { createSandnodeChannel, createServiceClient, mapLimit } from '@sandnode/shared';
import { AdminServiceDefinition } from '@sandnode/shared/proto/server/v1/admin';
import { findRunning, percentile, startComponent, waitForActiveServer, type ServerApi, type StackDirs } from '@sandnode/node-stack';
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

/** benchDrain creates sandboxes up to BENCH_DRAIN on the node of dirs, drains them at concurrency 8 then 1 (resuming them in between), and adds its rows. */
export async function benchDrain(dirs: StackDirs, api: ServerApi, rows: (string | number)[][]): Promise<Record<string, unknown>> {
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
    const t0 = performance.now();
    const r = await createServiceClient(AdminServiceDefinition, ch, { timeoutMs: 600_000 }).drain({ deadlineMs: 600_000, concurrency: conc });
    drainMs[`c${conc}`] = Math.round(performance.now() - t0);
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
      // what one sandbox's drain cost the vmm-supervisor (independent of the host's load)
      perSandbox: before && after ? costPer(before, after, Math.max(1, r.sandboxes.length)) : undefined,
    };
    // bring the node back for the next round: device manager up, sandboxes resumed
    await startComponent(dirs, 'ublk-manager');
    await mapLimit(r.sandboxes, 8, (s) => api.sandboxes.resumeSandbox({ sandboxId: s.sandboxId }));
  }
  const ratio = r1((drainMs.c1 ?? 0) / (drainMs.c8 ?? 1));
  const load = os.loadavg().map(r1);
  rows.push([`drain of ${n} sandboxes: concurrency 8 vs 1`, `${drainMs.c8} ms vs ${drainMs.c1} ms (x${ratio}; load avg ${load.join(' ')})`, 'c=8 >= x3 faster']);
  for (const conc of [8, 1]) {
    const per = (drainDetail[`c${conc}`] as { perSandbox?: ReturnType<typeof costPer> }).perSandbox;
    if (!per) continue;
    const by = Object.entries(per.byCommand)
      .map(([k, v]) => `${k} ${v}`)
      .join(', ');
    rows.push([
      `  drain c=${conc}, per sandbox: vmm-supervisor process starts / CPU ms (kernel) / server CPU ms`,
      `${per.processStarts} / ${per.cpuMs} (${per.sysMs}) / ${per.serverCpuMs} ms`,
      '(load-independent)',
      by || 'none',
    ]);
  }
  return { sandboxes: n, ...drainMs, ratio, detail: drainDetail, loadAverage: load, goalRatio: 3 };
}
