/**
 * Cost of the isolation (issue 10 §2, §6): on a node of its own, rounds alternate between three
 * vmm-supervisors, restarted between rounds (the server and ublk-manager stay): "bare" with
 * `seccompProfile` "unconfined" and `usernsRange` "" (the 0.2.0 isolation: the baseline of
 * both), "off" with the seccomp profile but no user namespace, and "on" with both (the
 * default). Each round makes BENCH_USERNS_CREATES sandboxes one at a time (create
 * latency), runs BENCH_USERNS_EXECS `true` execs over them (exec round trip) and deletes them.
 * A warm-up create in each mode comes first, so the one-time copy of the template into the
 * range (reported apart, from the supervisor's log) is not in the p50. BENCH_USERNS_ROUNDS
 * (default 3) rounds per mode.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { mapLimit, socketPath, unixAddress } from '@sandnode/shared';
import { COMPONENTS, connectServer, logFile, percentile, purgeNode, startComponent, stopComponent, type ServerApi, type StackDirs } from '@sandnode/node-stack';
import { spreadOf, type Spread } from './results';

const num = (k: string, d: number) => Number(process.env[k] ?? d);
const r1 = (x: number) => Math.round(x * 10) / 10;
/** signed shows a delta with its sign ("+3.1", "-2"). */
const signed = (x: number) => (x >= 0 ? `+${x}` : String(x));
/** The supervisor's env key of `usernsRange`. */
const USERNS_ENV = 'SANDNODE_VMM_SUPERVISOR_USERNS_RANGE';
/** The supervisor's env key of `seccompProfile`. */
const SECCOMP_ENV = 'SANDNODE_VMM_SUPERVISOR_SECCOMP_PROFILE';

/** One mode's figures over its rounds, ms. */
export interface UsernsModeBench {
  usernsRange: string;
  /** "unconfined", or "" for the shipped profile */
  seccompProfile: string;
  creates: number;
  execs: number;
  createP50Ms: number;
  createP95Ms: number;
  execP50Ms: number;
  execP95Ms: number;
  createSpreadMs: Spread;
  execSpreadMs: Spread;
}

/** What benchUserns measured. */
export interface UsernsBench {
  rounds: number;
  /** no seccomp, no user namespace (the 0.2.0 isolation) */
  bare: UsernsModeBench;
  /** seccomp, no user namespace */
  off: UsernsModeBench;
  /** seccomp and the user namespace (the default) */
  on: UsernsModeBench;
  /** on - off of the p50s, ms: the user namespace's cost */
  createP50DeltaMs: number;
  execP50DeltaMs: number;
  /** on - bare of the p50s, ms: the cost of all of it */
  createP50AllDeltaMs: number;
  execP50AllDeltaMs: number;
  /** the one-time copy of the template rootfs into the range, ms (the supervisor's log) */
  templateCopyMs: number | undefined;
}

async function execTrue(api: ServerApi, id: string): Promise<void> {
  for await (const _ of api.sandboxes.exec({ sandboxId: id, argv: ['true'] })) void _;
}

/** restartSupervisor starts the vmm-supervisor again with usernsRange = range and seccompProfile = seccomp ("" = the default). */
async function restartSupervisor(dirs: StackDirs, range: string, seccomp: string): Promise<void> {
  await stopComponent(dirs, 'vmm-supervisor');
  const saved = { [USERNS_ENV]: process.env[USERNS_ENV], [SECCOMP_ENV]: process.env[SECCOMP_ENV] };
  process.env[USERNS_ENV] = range;
  if (seccomp) process.env[SECCOMP_ENV] = seccomp;
  else delete process.env[SECCOMP_ENV];
  try {
    await startComponent(dirs, 'vmm-supervisor');
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  }
}

/** templateCopyMs reads the copy time of the template into the range from the supervisor's log. */
function templateCopyMs(dirs: StackDirs): number | undefined {
  for (const l of readFileSync(logFile(dirs, 'vmm-supervisor'), 'utf8').split('\n')) {
    try {
      const j = JSON.parse(l) as { msg?: string; ms?: number };
      if (j.msg === 'template rootfs copied into the user namespace range') return j.ms;
    } catch {
      /* not a log line */
    }
  }
  return undefined;
}

function summary(mode: { range: string; seccomp: string }, createMs: number[], execMs: number[]): UsernsModeBench {
  return {
    usernsRange: mode.range,
    seccompProfile: mode.seccomp,
    creates: createMs.length,
    execs: execMs.length,
    createP50Ms: r1(percentile(createMs, 50)),
    createP95Ms: r1(percentile(createMs, 95)),
    execP50Ms: r1(percentile(execMs, 50)),
    execP95Ms: r1(percentile(execMs, 95)),
    createSpreadMs: spreadOf(createMs),
    execSpreadMs: spreadOf(execMs),
  };
}

/** benchUserns measures create and exec p50 with no isolation layer, seccomp only, and seccomp + user namespace, in alternating rounds; rows get the table lines. */
export async function benchUserns(root: string, rows: (string | number)[][]): Promise<UsernsBench> {
  const dirs: StackDirs = { stateDir: path.join(root, 'userns-state'), runDir: path.join(root, 'userns-run'), listen: '' };
  const rounds = Math.max(1, num('BENCH_USERNS_ROUNDS', 3));
  const creates = Math.max(1, num('BENCH_USERNS_CREATES', 10));
  const execs = Math.max(1, num('BENCH_USERNS_EXECS', 50));
  const modes = { bare: { range: '', seccomp: 'unconfined' }, off: { range: '', seccomp: '' }, on: { range: '100000:65536', seccomp: '' } } as const;
  const MODES = ['bare', 'off', 'on'] as const;
  const samples = Object.fromEntries(MODES.map((m) => [m, { create: [] as number[], exec: [] as number[] }])) as Record<(typeof MODES)[number], { create: number[]; exec: number[] }>;
  try {
    for (const c of COMPONENTS) await startComponent(dirs, c);
    const api = connectServer(unixAddress(socketPath(dirs.runDir, 'server')));
    try {
      await api.templates.buildTemplate({ name: 'base', replace: false });
      for (let round = 0; round < rounds; round++) {
        for (const mode of MODES) {
          await restartSupervisor(dirs, modes[mode].range, modes[mode].seccomp);
          // warm-up (the first create of a mode copies the template into the range once)
          const warm = (await api.sandboxes.createSandbox({ template: 'base' })).sandbox!.sandboxId;
          await api.sandboxes.deleteSandbox({ sandboxId: warm });
          const ids: string[] = [];
          for (let i = 0; i < creates; i++) {
            const t0 = performance.now();
            ids.push((await api.sandboxes.createSandbox({ template: 'base' })).sandbox!.sandboxId);
            samples[mode].create.push(performance.now() - t0);
          }
          for (let i = 0; i < execs; i++) {
            const t0 = performance.now();
            await execTrue(api, ids[i % ids.length]!);
            samples[mode].exec.push(performance.now() - t0);
          }
          await mapLimit(ids, 4, (id) => api.sandboxes.deleteSandbox({ sandboxId: id }));
        }
      }
    } finally {
      api.close();
    }
    const bare = summary(modes.bare, samples.bare.create, samples.bare.exec);
    const off = summary(modes.off, samples.off.create, samples.off.exec);
    const on = summary(modes.on, samples.on.create, samples.on.exec);
    const r: UsernsBench = {
      rounds,
      bare,
      off,
      on,
      createP50DeltaMs: r1(on.createP50Ms - off.createP50Ms),
      execP50DeltaMs: r1(on.execP50Ms - off.execP50Ms),
      createP50AllDeltaMs: r1(on.createP50Ms - bare.createP50Ms),
      execP50AllDeltaMs: r1(on.execP50Ms - bare.execP50Ms),
      templateCopyMs: templateCopyMs(dirs),
    };
    rows.push([
      `create p50 with user namespace (baseline: without)`,
      `${on.createP50Ms} ms (without: ${off.createP50Ms} ms; ${signed(r.createP50DeltaMs)})`,
      'cost of isolation',
      `${on.createSpreadMs.text} / ${off.createSpreadMs.text} ms`,
    ]);
    rows.push([
      `exec p50 with user namespace (baseline: without)`,
      `${on.execP50Ms} ms (without: ${off.execP50Ms} ms; ${signed(r.execP50DeltaMs)})`,
      'cost of isolation',
      `${on.execSpreadMs.text} / ${off.execSpreadMs.text} ms`,
    ]);
    rows.push([
      `create p50 with seccomp + user namespace (baseline: neither, the 0.2.0 isolation)`,
      `${on.createP50Ms} ms (neither: ${bare.createP50Ms} ms; ${signed(r.createP50AllDeltaMs)})`,
      'cost of isolation',
      `${on.createSpreadMs.text} / ${bare.createSpreadMs.text} ms`,
    ]);
    rows.push([
      `exec p50 with seccomp + user namespace (baseline: neither)`,
      `${on.execP50Ms} ms (neither: ${bare.execP50Ms} ms; ${signed(r.execP50AllDeltaMs)})`,
      'cost of isolation',
      `${on.execSpreadMs.text} / ${bare.execSpreadMs.text} ms`,
    ]);
    rows.push(['template copy into the range (once per template build)', `${r.templateCopyMs ?? '?'} ms`, '-', 'one run']);
    return r;
  } finally {
    for (const c of [...COMPONENTS].reverse()) await stopComponent(dirs, c).catch(() => undefined);
    await purgeNode(dirs).catch(() => undefined);
  }
}
