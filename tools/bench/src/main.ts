#!/usr/bin/env node
/**
 * `npm run bench`: measures a real node (every component a process, runc containers on loop
 * devices) and writes bench/results/foundation.json, the HTML report of it beside it
 * (foundation.html, report.ts: plots of the raw samples the JSON keeps) and a table on stdout:
 * - sandbox create latency p50/p95 (goal p50 <= 300 ms),
 * - exec round trip p50 (`true`, goal <= 20 ms),
 * - GetSandbox unary throughput through the server (goal >= 3,000 calls/s), with the shared
 *   sandnode client and, as its baseline, a lean client without middleware, in alternating
 *   rounds after a warm-up, with the CPU time per call of client and server (getsandbox.ts),
 * - a well-behaved client's GetSandbox p50/p99 quiet and under abuse (held incomplete requests,
 *   preface-only connections, an Exec flood; goal p99 <= 2x quiet) and the server's RSS (abuse.ts),
 * - fork latency of a parent with 100 MB in /workspace (goal p50 <= 300 ms) and the parent's
 *   freeze window (goal p99 <= 50 ms), see fork.ts,
 * - adoption time of 50 sandboxes after kill -9 of the server (goal <= 2 s).
 * Then the device-handover stall with an fsync writer on every device (device-stall.ts) and the
 * live-upgrade measures of live-upgrade.ts (server handover vs restart, drain).
 * Each figure is printed with its spread over its repetitions (SPREAD: min–max over the samples
 * or rounds, n of them) beside its goal; a baseline from the same run sits beside the figure
 * where there is one (GetSandbox: the lean client; handover: the naive restart; device stall:
 * the writer's latency before the handover). The table ends with the bench's wall time and
 * the host's load average at the start and the end (other work on the host moves the figures).
 * Sizes can be lowered with BENCH_CREATES, BENCH_EXECS, BENCH_ADOPT, BENCH_SECONDS (per
 * GetSandbox round), BENCH_GETSANDBOX_ROUNDS, BENCH_HANDOVERS, BENCH_DRAIN, BENCH_FORKS (0 skips
 * the fork section), BENCH_FORK_MB, BENCH_DEVICE_ROUNDS, BENCH_DEVICE_SANDBOXES,
 * BENCH_CHAOS_SEED / BENCH_CHAOS_STEPS (a longer chaos run than CI's; 0 steps skips it).
 * Then the cost of the user namespace (userns.ts): create and exec p50 with and without it,
 * alternating rounds on a node of its own (BENCH_USERNS_ROUNDS, BENCH_USERNS_CREATES, BENCH_USERNS_EXECS).
 * Then sandbox networking (network.ts, issue 12 §6): slot setup, create with vs without network,
 * ingress vs direct and nginx, egress proxy vs kernel NAT, memory of 1000 ingress connections.
 * Then `sandbox cp` in and out (files.ts; BENCH_FILES_MB, default 1024) beside `exec cat` and a local copy.
 * BENCH_SECTIONS (comma list of create, exec, getsandbox, fork, adoption, device, live-upgrade, drain (the drain
 * of live-upgrade on nodes of its own, beside a baseline build: BENCH_BUILD_DIR, BENCH_DRAIN_ROUNDS; drain.ts),
 * chaos, userns, freeze-port, abuse, network, slots (network's slot setup only), reflink, files, pool;
 * default all but drain) runs only those (create runs whenever a section of the first node does: they
 * need its sandboxes) and writes bench/results/foundation-<a>+<b>.json instead;
 * BENCH_SKIP_LIVE_UPGRADE=1 skips live-upgrade.ts.
 */

import { chmodSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { socketPath, unixAddress, mapLimit } from '@sandnode/shared';
import { connectServer, table, type ServerApi, COMPONENTS, killComponent, logFile, purgeNode, startComponent, stopComponent, type StackDirs } from '@sandnode/node-stack';
import { benchFork } from './fork';
import { samples, spreadOf, writeBenchResults } from './results';
import { runChaos, type ChaosReport } from '@sandnode/chaos';
import { benchLiveUpgrade } from './live-upgrade';
import { benchDrainBuilds } from './drain';
import { benchDeviceStall } from './device-stall';
import { benchGetSandbox } from './getsandbox';
import { benchUserns } from './userns';
import { benchFreezePort } from './freeze-port';
import { benchAbuse } from './abuse';
import { benchFiles } from './files';
import { benchNetwork, benchSlots } from './network';
import { benchReflink } from './reflink';
import { benchPool } from './pool';
import { percentile } from '@sandnode/node-stack';

const num = (k: string, d: number) => Number(process.env[k] ?? d);

const r1 = (x: number) => Math.round(x * 10) / 10;

/** The sections BENCH_SECTIONS may name. */
const SECTIONS = [
  'create',
  'exec',
  'getsandbox',
  'fork',
  'adoption',
  'device',
  'live-upgrade',
  'drain',
  'chaos',
  'userns',
  'freeze-port',
  'abuse',
  'network',
  'slots',
  'reflink',
  'files',
  'pool',
] as const;
type Section = (typeof SECTIONS)[number];
/** The sections of a run without BENCH_SECTIONS: all but drain (live-upgrade drains on its own node already). */
const DEFAULT_SECTIONS = SECTIONS.filter((s) => s !== 'drain');

function wantedSections(): Set<Section> {
  const raw = process.env.BENCH_SECTIONS;
  if (!raw) return new Set(DEFAULT_SECTIONS);
  const names = raw.split(',').map((s) => s.trim());
  const bad = names.filter((n) => !(SECTIONS as readonly string[]).includes(n));
  if (bad.length) throw new Error(`BENCH_SECTIONS: unknown section(s) ${bad.join(', ')}; known: ${SECTIONS.join(', ')}`);
  return new Set(names as Section[]);
}

/** Sections that failed: the bench goes on with the next one and exits 1 at the end. */
const failedSections: string[] = [];

/**
 * section runs one section; when it fails (e.g. a fork that overran its freeze window on a
 * loaded host) its error goes into the results and the table, and the bench goes on.
 */
async function section<T>(name: string, rows: (string | number)[][], fn: () => Promise<T>): Promise<T | { error: string }> {
  try {
    return await fn();
  } catch (err) {
    const error = (err as Error).message ?? String(err);
    failedSections.push(name);
    rows.push([name, `FAILED: ${error.slice(0, 160)}`, '-', '-']);
    process.stderr.write(`bench: section ${name} failed: ${(err as Error).stack ?? error}\n`);
    return { error };
  }
}

async function execTrue(api: ServerApi, id: string): Promise<void> {
  for await (const _ of api.sandboxes.exec({ sandboxId: id, argv: ['true'] })) void _;
}

/** benchFirstNode runs sections 1-4 (create, exec, GetSandbox, fork, adoption) on a node of its own. */
async function benchFirstNode(root: string, want: Set<Section>, results: Record<string, unknown>, rows: (string | number)[][]): Promise<void> {
  const dirs: StackDirs = { stateDir: path.join(root, 'state'), runDir: path.join(root, 'run'), listen: '' };
  try {
    for (const c of COMPONENTS) await startComponent(dirs, c);
    const address = unixAddress(socketPath(dirs.runDir, 'server'));
    let api = connectServer(address);
    const t = (await api.templates.buildTemplate({ name: 'base', replace: false })).template!;
    results.templateBuildMs = t.buildMs;

    // 1. create latency (sequential, the sandbox stays)
    const creates = Math.max(1, num('BENCH_CREATES', 20));
    const createMs: number[] = [];
    const ids: string[] = [];
    for (let i = 0; i < creates; i++) {
      const t0 = performance.now();
      ids.push((await api.sandboxes.createSandbox({ template: 'base' })).sandbox!.sandboxId);
      createMs.push(performance.now() - t0);
    }
    if (want.has('create')) {
      const spread = spreadOf(createMs);
      results.create = { n: creates, p50Ms: r1(percentile(createMs, 50)), p95Ms: r1(percentile(createMs, 95)), spreadMs: spread, goalP50Ms: 300, samplesMs: samples(createMs) };
      rows.push(['sandbox create p50 / p95', `${r1(percentile(createMs, 50))} / ${r1(percentile(createMs, 95))} ms`, 'p50 <= 300 ms', `${spread.text} ms`]);
    }

    // 2. exec round trip
    if (want.has('exec')) {
      const execs = num('BENCH_EXECS', 100);
      const execMs: number[] = [];
      for (let i = 0; i < execs; i++) {
        const t0 = performance.now();
        await execTrue(api, ids[i % ids.length] as string);
        execMs.push(performance.now() - t0);
      }
      const spread = spreadOf(execMs);
      results.exec = { n: execs, p50Ms: r1(percentile(execMs, 50)), p95Ms: r1(percentile(execMs, 95)), spreadMs: spread, goalP50Ms: 20, samplesMs: samples(execMs) };
      rows.push(['exec round trip (true) p50 / p95', `${r1(percentile(execMs, 50))} / ${r1(percentile(execMs, 95))} ms`, 'p50 <= 20 ms', `${spread.text} ms`]);
    }

    // 3. GetSandbox throughput (getsandbox.ts)
    if (want.has('getsandbox')) results.getSandbox = await section('GetSandbox', rows, () => benchGetSandbox(address, ids, rows));

    // 3a. GetSandbox under abuse (abuse.ts)
    if (want.has('abuse')) results.abuse = await section('abuse', rows, () => benchAbuse(address, ids, rows));

    // 3c. sandbox cp in and out (bench/files.ts)
    if (want.has('files')) results.files = await section('files', rows, () => benchFiles(api, dirs, rows));

    // 3b. fork of a parent with 100 MB in /workspace (bench/fork.ts)
    if (want.has('fork') && num('BENCH_FORKS', 20) > 0) results.fork = await section('fork', rows, () => benchFork(api, rows));

    // 4. adoption of N sandboxes after kill -9 of the server
    if (want.has('adoption')) {
      const adoptN = num('BENCH_ADOPT', 50);
      await mapLimit(Array.from({ length: Math.max(0, adoptN - ids.length) }), 4, async () => {
        ids.push((await api.sandboxes.createSandbox({ template: 'base' })).sandbox!.sandboxId);
      });
      api.close();
      await killComponent(dirs, 'server');
      const t0 = performance.now();
      await startComponent(dirs, 'server');
      const restartMs = performance.now() - t0;
      const adoptLine = readFileSync(logFile(dirs, 'server'), 'utf8')
        .trim()
        .split('\n')
        .reverse()
        .map((l) => {
          try {
            return JSON.parse(l) as { msg?: string; ms?: number; adopted?: number };
          } catch {
            return {};
          }
        })
        .find((l) => l.msg === 'adoption finished');
      api = connectServer(address);
      const list = await api.sandboxes.listSandboxes({ pageSize: 1000 });
      results.adoption = { sandboxes: list.sandboxes.length, adopted: adoptLine?.adopted, adoptionMs: adoptLine?.ms, restartToServingMs: Math.round(restartMs), goalMs: 2000 };
      rows.push([`adoption of ${list.sandboxes.length} sandboxes after kill -9`, `${adoptLine?.ms} ms (restart to serving ${Math.round(restartMs)} ms)`, '<= 2000 ms', 'one run']);
    }

    await mapLimit(ids, 8, (id) => api.sandboxes.deleteSandbox({ sandboxId: id }));
    api.close();
    for (const c of [...COMPONENTS].reverse()) await stopComponent(dirs, c);
  } finally {
    for (const c of [...COMPONENTS].reverse()) await stopComponent(dirs, c).catch(() => undefined);
    await purgeNode(dirs).catch(() => undefined);
  }
}

/**
 * benchChaos runs a longer chaos run than CI's (BENCH_CHAOS_SEED, default 11; BENCH_CHAOS_STEPS,
 * default 300) and puts its figures in the table; a violation fails the section.
 */
async function benchChaos(rows: (string | number)[][]): Promise<ChaosReport> {
  const r = await runChaos({ seed: num('BENCH_CHAOS_SEED', 11), steps: num('BENCH_CHAOS_STEPS', 300) });
  const kills = Object.values(r.kills).reduce((a, b) => a + b, 0);
  rows.push([`chaos seed ${r.seed}: steps / kills / invariant checks`, `${r.stepsRun} / ${kills} / ${r.invariantChecks}`, 'no violation', r.ok ? 'ok' : `FAILED at step ${r.failure?.step}`]);
  rows.push(['chaos: convergence after a fault p50 / max', `${r.convergeMs.p50} / ${r.convergeMs.max} ms`, `<= ${r.convergeMs.boundMs} ms`, `${r.convergeMs.faults} faults`]);
  if (!r.ok) throw new Error(`chaos seed ${r.seed} failed at step ${r.failure?.step} (${r.failure?.action}): ${r.failure?.violations.join('; ')}`);
  return r;
}

async function main(): Promise<void> {
  const want = wantedSections();
  if (process.env.BENCH_SKIP_LIVE_UPGRADE === '1') want.delete('live-upgrade');
  const root = mkdtempSync(path.join(os.tmpdir(), 'sandnode-bench-'));
  chmodSync(root, 0o711); // others may pass (the sandboxes' user namespace root must reach <runDir>), not list
  const t0 = performance.now();
  const load0 = os.loadavg();
  const results: Record<string, unknown> = {
    date: new Date().toISOString(),
    host: { cpus: os.cpus().length, memGiB: Math.round(os.totalmem() / 2 ** 30), kernel: os.release() },
    sections: [...want],
  };
  const rows: (string | number)[][] = [];
  try {
    if (['create', 'exec', 'getsandbox', 'abuse', 'fork', 'adoption', 'files'].some((s) => want.has(s as Section))) await benchFirstNode(root, want, results, rows);
    if (want.has('device') && num('BENCH_DEVICE_ROUNDS', 3) > 0) results.deviceHandover = await section('device handover', rows, () => benchDeviceStall(root, rows));
    if (want.has('live-upgrade')) results.liveUpgrade = await section('live upgrade', rows, () => benchLiveUpgrade(root, rows));
    if (want.has('drain')) results.drain = await section('drain', rows, () => benchDrainBuilds(root, rows));
    if (want.has('chaos') && num('BENCH_CHAOS_STEPS', 300) > 0) results.chaos = await section('chaos', rows, () => benchChaos(rows));
    if (want.has('userns')) results.userns = await section('user namespace', rows, () => benchUserns(root, rows));
    if (want.has('freeze-port')) results.freezePort = await section('freeze port', rows, () => benchFreezePort(root, rows));
    if (want.has('network')) results.network = await section('network', rows, () => benchNetwork(rows));
    else if (want.has('slots')) results.slots = await section('slots', rows, () => benchSlots(rows));
    if (want.has('reflink')) results.reflink = await section('reflink', rows, () => benchReflink(root, rows));
    if (want.has('pool')) results.pool = await section('pool', rows, () => benchPool(root, rows));
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
  const load1 = os.loadavg();
  results.benchSeconds = Math.round((performance.now() - t0) / 1000);
  results.loadAverage1m = { start: r1(load0[0] ?? 0), end: r1(load1[0] ?? 0) };
  results.failedSections = failedSections;
  // a run of some sections only does not overwrite the full run's results
  const out = writeBenchResults(DEFAULT_SECTIONS.every((s) => want.has(s)) ? 'foundation' : `foundation-${[...want].join('+')}`, results);
  const body = rows.map((r) => [...r, ...Array.from({ length: Math.max(0, 4 - r.length) }, () => '-')]);
  process.stdout.write(
    `${table(['MEASURE', 'RESULT', 'GOAL', 'SPREAD (min–max, n)'], body)}\n\nbench took ${results.benchSeconds} s; load average (1 min) ${load0[0]?.toFixed(2)} at the start, ${load1[0]?.toFixed(2)} at the end (${os.cpus().length} cpus)\nwritten to ${out}\n`,
  );
  if (failedSections.length) {
    process.stderr.write(`bench: failed sections: ${failedSections.join(', ')}\n`);
    process.exitCode = 1;
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`bench: ${(err as Error).stack ?? String(err)}\n`);
  process.exit(1);
});
