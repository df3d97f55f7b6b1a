/**
 * Device-handover stall with I/O in flight (part of `npm run bench`): a node with BENCH_DEVICE_SANDBOXES
 * sandboxes (default 10, two devices each: rootfs upper + /workspace) moves every device to the
 * other ublk-manager slot (`upgrade ublk-manager`) BENCH_DEVICE_ROUNDS times (default 3). During
 * each round an fsync writer (fsync-writer.ts, its own process) writes 4 KiB + fdatasync in a loop
 * on every device's host mount (`<runDir>/vms/<id>/{upper-dev,workspace}`), pausing
 * BENCH_WRITER_PAUSE_MS (default 10; 0 = back to back, which on 2 cores loads the host far more
 * than a sandbox's workload does) after each write. Per round:
 * - stall: each device's stall as HandoverAll reports it (quiesce start to recover end), p50/p95/p99;
 * - writes: the writer's write + fdatasync latency of the writes that started during the
 *   handover (p50/p99/max), beside the same writer's latency over a quiet window of the same
 *   length just before it (the baseline, same run).
 * Goal: stall p99 <= 20 ms in every round; the write latency during the handover stays close to
 * its baseline.
 */
import { fork } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { mapLimit, socketPath, unixAddress } from '@sandnode/shared';
import { COMPONENTS, connectServer, percentile, purgeNode, startComponent, stopComponent, upgradeUblkManager, type StackDirs } from '@sandnode/node-stack';
import type { WriterReport } from './fsync-writer';
import { samples, spreadOf, type Spread } from './results';

const num = (k: string, d: number) => Number(process.env[k] ?? d);

/** Pause of the fsync writer after each write + fdatasync, ms (BENCH_WRITER_PAUSE_MS). */
export const DEFAULT_WRITER_PAUSE_MS = 10;
const r1 = (x: number) => Math.round(x * 10) / 10;

/** One round's figures, ms. */
export interface DeviceStallRound {
  devices: number;
  mode: string;
  stallP50Ms: number;
  stallP95Ms: number;
  stallP99Ms: number;
  /** the whole HandoverAll */
  totalMs: number;
  /** writes that started during the handover: count, latency p50/p99/max */
  writes: number;
  writeP50Ms: number;
  writeP99Ms: number;
  writeMaxMs: number;
  /** the same writer over a quiet window of the same length before the handover */
  baselineWrites: number;
  baselineWriteP99Ms: number;
  writeErrors: string[];
  /** raw figures (the HTML report plots them): each device's stall, ms, as HandoverAll reported it */
  deviceStallsMs: { deviceId: string; stallMs: number }[];
  /** write + fdatasync latencies, ms, of the writes during the handover and of the baseline window */
  writeSamplesMs: number[];
  baselineWriteSamplesMs: number[];
}

/** What benchDeviceStall measured. */
export interface DeviceStallBench {
  /** the writer's pause after each write, ms */
  writerPauseMs: number;
  rounds: DeviceStallRound[];
  /** spread over the rounds of each round's p99 */
  stallP99: Spread;
  writeP99: Spread;
  baselineWriteP99: Spread;
  goalStallP99Ms: number;
}

/** deviceMounts lists the host mount points of the sandboxes' devices (mountinfo field 5 under `<runDir>/vms`). */
function deviceMounts(runDir: string): string[] {
  const vms = path.join(path.resolve(runDir), 'vms');
  const mounted = new Set(
    readFileSync('/proc/self/mountinfo', 'utf8')
      .split('\n')
      .map((l) => l.split(' ')[4] ?? ''),
  );
  const out: string[] = [];
  for (const id of existsSync(vms) ? readdirSync(vms) : []) for (const sub of ['upper-dev', 'workspace']) if (mounted.has(path.join(vms, id, sub))) out.push(path.join(vms, id, sub));
  return out;
}

/** startWriter forks the fsync writer on one file per mount and resolves once every file is open. */
async function startWriter(mounts: string[]): Promise<{ stop(): Promise<WriterReport>; kill(): void }> {
  const child = fork(
    path.join(__dirname, 'fsync-writer.js'),
    mounts.map((m) => path.join(m, '.bench-fsync-writer')),
    {
      env: { ...process.env, UV_THREADPOOL_SIZE: String(mounts.length + 1), FSYNC_WRITER_PAUSE_MS: String(num('BENCH_WRITER_PAUSE_MS', DEFAULT_WRITER_PAUSE_MS)) },
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    },
  );
  const exited = new Promise<never>((_, reject) => child.once('exit', (code) => reject(new Error(`the fsync writer exited with code ${code}`))));
  exited.catch(() => undefined);
  await Promise.race([new Promise<void>((resolve) => child.once('message', () => resolve())), exited]);
  return {
    async stop() {
      const report = Promise.race([new Promise<WriterReport>((resolve) => child.once('message', (m) => resolve(m as WriterReport))), exited]);
      child.send('stop');
      return report;
    },
    /** kill ends the writer at once (a round that failed), so that its files do not keep the mounts busy. */
    kill() {
      if (child.exitCode === null) child.kill('SIGKILL');
    },
  };
}

/** latencies returns the latencies of the samples that started in [from, to) (epoch ms). */
function latencies(r: WriterReport, from: number, to: number): number[] {
  return r.files.flatMap((f) => f.samples.filter(([t]) => t >= from && t < to).map(([, ms]) => ms));
}

/** benchDeviceStall runs the rounds on a node of its own under root; rows get the table lines. */
export async function benchDeviceStall(root: string, rows: (string | number)[][]): Promise<DeviceStallBench> {
  const dirs: StackDirs = { stateDir: path.join(root, 'ds-state'), runDir: path.join(root, 'ds-run'), listen: '' };
  const roundsN = num('BENCH_DEVICE_ROUNDS', 3);
  const rounds: DeviceStallRound[] = [];
  try {
    for (const c of COMPONENTS) await startComponent(dirs, c);
    const api = connectServer(unixAddress(socketPath(dirs.runDir, 'server')));
    try {
      await api.templates.buildTemplate({ name: 'base', replace: false });
      const ids = await mapLimit(Array.from({ length: num('BENCH_DEVICE_SANDBOXES', 10) }), 3, async () => (await api.sandboxes.createSandbox({ template: 'base' })).sandbox!.sandboxId);
      const mounts = deviceMounts(dirs.runDir);
      for (let i = 0; i < roundsN; i++) {
        const writer = await startWriter(mounts);
        let u: Awaited<ReturnType<typeof upgradeUblkManager>>;
        let report: WriterReport;
        let q0: number;
        let h0: number;
        let h1: number;
        try {
          // quiet window first (the baseline), twice as long as the last handover took (1 s at least)
          const quietMs = Math.max(1000, 2 * Math.ceil(rounds.at(-1)?.totalMs ?? 0));
          q0 = performance.timeOrigin + performance.now();
          await new Promise((r) => setTimeout(r, quietMs));
          h0 = performance.timeOrigin + performance.now();
          u = await upgradeUblkManager(dirs, '.');
          h1 = performance.timeOrigin + performance.now();
          report = await writer.stop();
        } finally {
          writer.kill();
        }
        const during = latencies(report, h0, h1);
        const quiet = latencies(report, q0, q0 + Math.min(h1 - h0, h0 - q0));
        const stalls = u.devices.map((d) => d.stallMs);
        rounds.push({
          devices: stalls.length,
          mode: u.mode,
          stallP50Ms: r1(percentile(stalls, 50)),
          stallP95Ms: r1(percentile(stalls, 95)),
          stallP99Ms: r1(percentile(stalls, 99)),
          totalMs: Math.round(u.totalMs),
          writes: during.length,
          writeP50Ms: r1(percentile(during, 50)),
          writeP99Ms: r1(percentile(during, 99)),
          writeMaxMs: r1(Math.max(...during)),
          baselineWrites: quiet.length,
          baselineWriteP99Ms: r1(percentile(quiet, 99)),
          writeErrors: report.files.flatMap((f) => f.errors.map((e) => `${f.file}: ${e}`)),
          deviceStallsMs: u.devices.map((d) => ({ deviceId: d.deviceId, stallMs: Math.round(d.stallMs * 100) / 100 })),
          writeSamplesMs: samples(during),
          baselineWriteSamplesMs: samples(quiet),
        });
      }
      await mapLimit(ids, 4, (id) => api.sandboxes.deleteSandbox({ sandboxId: id }));
    } finally {
      api.close();
    }
  } finally {
    for (const c of [...COMPONENTS].reverse()) await stopComponent(dirs, c).catch(() => undefined);
    await purgeNode(dirs).catch(() => undefined);
  }
  const res: DeviceStallBench = {
    writerPauseMs: num('BENCH_WRITER_PAUSE_MS', DEFAULT_WRITER_PAUSE_MS),
    rounds,
    stallP99: spreadOf(rounds.map((r) => r.stallP99Ms)),
    writeP99: spreadOf(rounds.map((r) => r.writeP99Ms)),
    baselineWriteP99: spreadOf(rounds.map((r) => r.baselineWriteP99Ms)),
    goalStallP99Ms: 20,
  };
  const last = rounds.at(-1);
  rows.push([
    `device handover stall over ${last?.devices ?? 0} devices p99 (${last?.mode ?? '-'}, ${rounds.length} rounds)`,
    `${rounds.map((r) => r.stallP99Ms).join(' / ')} ms (p50 ${rounds.map((r) => r.stallP50Ms).join(' / ')})`,
    'p99 <= 20 ms each round',
    res.stallP99.text,
  ]);
  rows.push([
    `write+fdatasync latency during the handover p99 (baseline: before it; writer pause ${res.writerPauseMs} ms)`,
    `${rounds.map((r) => r.writeP99Ms).join(' / ')} ms (baseline ${rounds.map((r) => r.baselineWriteP99Ms).join(' / ')}; max ${rounds.map((r) => r.writeMaxMs).join(' / ')})`,
    'close to baseline',
    res.writeP99.text,
  ]);
  return res;
}
