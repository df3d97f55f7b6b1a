/**
 * Fork benchmark: a RUNNING parent with 100 MB written in /workspace (BENCH_FORK_MB) is forked
 * BENCH_FORKS times (default 20), one at a time; each child is deleted after its fork.
 * Measures the fork latency as the client sees it (goal p50 <= 300 ms on this host), the
 * parent's freeze window as podd reports it (first FIFREEZE to last FITHAW; goal p99 <= 50
 * ms) and the clone time of the two devices.
 *
 * Run alone: `node tools/bench/dist/fork.js` (after `npm run build`) writes
 * bench/results/fork.json; `npm run bench` runs it as one section of foundation.json.
 */
import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { socketPath, unixAddress } from '@sandnode/shared';
import { ForkMethod } from '@sandnode/shared/proto/server/v1/sandbox';
import { connectServer, table, type ServerApi, COMPONENTS, purgeNode, startComponent, stopComponent, type StackDirs } from '@sandnode/node-stack';
import { percentile } from '@sandnode/node-stack';
import { samples, spreadOf, writeBenchResults, type Spread } from './results';

const r1 = (x: number) => Math.round(x * 10) / 10;

/** ForkBench is what benchFork measured (all times in ms). */
export interface ForkBench {
  forks: number;
  parentWorkspaceMB: number;
  method: string;
  forkP50Ms: number;
  forkP95Ms: number;
  freezeWindowP50Ms: number;
  freezeWindowP99Ms: number;
  cloneP50Ms: number;
  goalForkP50Ms: number;
  goalFreezeWindowP99Ms: number;
  /** spread over the forks */
  forkSpreadMs: Spread;
  freezeWindowSpreadMs: Spread;
  /** the raw figures, one per fork in order, ms (the HTML report plots them) */
  forkSamplesMs: number[];
  freezeWindowSamplesMs: number[];
}

/** benchFork forks a parent with BENCH_FORK_MB in /workspace BENCH_FORKS times; rows get the table lines. */
export async function benchFork(api: ServerApi, rows: (string | number)[][]): Promise<ForkBench> {
  const forks = Number(process.env.BENCH_FORKS ?? 20);
  const mb = Number(process.env.BENCH_FORK_MB ?? 100);
  const parent = (await api.sandboxes.createSandbox({ template: 'base' })).sandbox!.sandboxId;
  try {
    for await (const ev of api.sandboxes.exec({ sandboxId: parent, argv: ['dd', 'if=/dev/urandom', 'of=/workspace/blob', 'bs=1M', `count=${mb}`, 'conv=fsync'] })) {
      if (ev.event?.$case === 'exit' && ev.event.value.exitCode !== 0) throw new Error(`dd in the parent exited ${ev.event.value.exitCode}`);
    }
    const forkMs: number[] = [];
    const heldMs: number[] = [];
    const cloneMs: number[] = [];
    let method = '';
    for (let i = 0; i < forks; i++) {
      const t0 = performance.now();
      const r = await api.sandboxes.forkSandbox({ parentId: parent });
      forkMs.push(performance.now() - t0);
      heldMs.push(r.parentHeldMs);
      cloneMs.push(r.cloneMs);
      method = ForkMethod[r.method].replace(/^FORK_METHOD_/, '').toLowerCase();
      await api.sandboxes.deleteSandbox({ sandboxId: r.sandbox!.sandboxId });
    }
    const res: ForkBench = {
      forks,
      parentWorkspaceMB: mb,
      method,
      forkP50Ms: r1(percentile(forkMs, 50)),
      forkP95Ms: r1(percentile(forkMs, 95)),
      freezeWindowP50Ms: r1(percentile(heldMs, 50)),
      freezeWindowP99Ms: r1(percentile(heldMs, 99)),
      cloneP50Ms: r1(percentile(cloneMs, 50)),
      goalForkP50Ms: 300,
      goalFreezeWindowP99Ms: 50,
      forkSpreadMs: spreadOf(forkMs),
      freezeWindowSpreadMs: spreadOf(heldMs),
      forkSamplesMs: samples(forkMs),
      freezeWindowSamplesMs: samples(heldMs),
    };
    rows.push([
      `fork (parent with ${mb} MB in /workspace, ${method}) p50 / p95`,
      `${res.forkP50Ms} / ${res.forkP95Ms} ms (clone p50 ${res.cloneP50Ms} ms)`,
      'p50 <= 300 ms',
      `${res.forkSpreadMs.text} ms`,
    ]);
    rows.push(["parent's freeze window p50 / p99", `${res.freezeWindowP50Ms} / ${res.freezeWindowP99Ms} ms`, 'p99 <= 50 ms', `${res.freezeWindowSpreadMs.text} ms`]);
    return res;
  } finally {
    await api.sandboxes.deleteSandbox({ sandboxId: parent });
  }
}

/** standalone: a fresh node, the fork benchmark alone, bench/results/fork.json. */
async function main(): Promise<void> {
  const root = mkdtempSync(path.join(os.tmpdir(), 'sandnode-bench-fork-'));
  chmodSync(root, 0o711); // others may pass (the sandboxes' user namespace root must reach <runDir>), not list
  const dirs: StackDirs = { stateDir: path.join(root, 'state'), runDir: path.join(root, 'run'), listen: '' };
  const rows: (string | number)[][] = [];
  let result: ForkBench;
  try {
    for (const c of COMPONENTS) await startComponent(dirs, c);
    const api = connectServer(unixAddress(socketPath(dirs.runDir, 'server')));
    try {
      await api.templates.buildTemplate({ name: 'base', replace: false });
      result = await benchFork(api, rows);
    } finally {
      api.close();
    }
  } finally {
    for (const c of [...COMPONENTS].reverse()) await stopComponent(dirs, c).catch(() => undefined);
    await purgeNode(dirs).catch(() => undefined);
    rmSync(root, { recursive: true, force: true });
  }
  const out = writeBenchResults('fork', { date: new Date().toISOString(), host: { cpus: os.cpus().length, kernel: os.release() }, fork: result });
  process.stdout.write(`${table(['MEASURE', 'RESULT', 'GOAL', 'SPREAD (min–max, n)'], rows)}\n\nwritten to ${out}\n`);
}

if (require.main === module) {
  main().catch((err: unknown) => {
    process.stderr.write(`bench fork: ${(err as Error).stack ?? String(err)}\n`);
    process.exit(1);
  });
}
