/**
 * Cost of the user namespace (issue 10 §2): on a node of its own, rounds alternate between a
 * vmm-supervisor with `usernsRange` "" (no user namespace: the 0.2.0 isolation, the baseline)
 * and one with the default range, the supervisor restarted between rounds (the server and
 * ublk-manager stay). Each round makes BENCH_USERNS_CREATES sandboxes one at a time (create
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
/** The supervisor's env key of `usernsRange`. */
const USERNS_ENV = 'SANDNODE_VMM_SUPERVISOR_USERNS_RANGE';

/** One mode's figures over its rounds, ms. */
export interface UsernsModeBench {
  usernsRange: string;
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
  off: UsernsModeBench;
  on: UsernsModeBench;
  /** on - off of the p50s, ms */
  createP50DeltaMs: number;
  execP50DeltaMs: number;
  /** the one-time copy of the template rootfs into the range, ms (the supervisor's log) */
  templateCopyMs: number | undefined;
}

async function execTrue(api: ServerApi, id: string): Promise<void> {
  for await (const _ of api.sandboxes.exec({ sandboxId: id, argv: ['true'] })) void _;
}

/** restartSupervisor starts the vmm-supervisor again with usernsRange = range. */
async function restartSupervisor(dirs: StackDirs, range: string): Promise<void> {
  await stopComponent(dirs, 'vmm-supervisor');
  const saved = process.env[USERNS_ENV];
  process.env[USERNS_ENV] = range;
  try {
    await startComponent(dirs, 'vmm-supervisor');
  } finally {
    if (saved === undefined) delete process.env[USERNS_ENV];
    else process.env[USERNS_ENV] = saved;
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

function summary(range: string, createMs: number[], execMs: number[]): UsernsModeBench {
  return {
    usernsRange: range,
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

/** benchUserns measures create and exec p50 with the user namespace off and on in alternating rounds; rows get the table lines. */
export async function benchUserns(root: string, rows: (string | number)[][]): Promise<UsernsBench> {
  const dirs: StackDirs = { stateDir: path.join(root, 'userns-state'), runDir: path.join(root, 'userns-run'), listen: '' };
  const rounds = Math.max(1, num('BENCH_USERNS_ROUNDS', 3));
  const creates = Math.max(1, num('BENCH_USERNS_CREATES', 10));
  const execs = Math.max(1, num('BENCH_USERNS_EXECS', 50));
  const modes = { off: '', on: '100000:65536' } as const;
  const samples = { off: { create: [] as number[], exec: [] as number[] }, on: { create: [] as number[], exec: [] as number[] } };
  try {
    for (const c of COMPONENTS) await startComponent(dirs, c);
    const api = connectServer(unixAddress(socketPath(dirs.runDir, 'server')));
    try {
      await api.templates.buildTemplate({ name: 'base', replace: false });
      for (let round = 0; round < rounds; round++) {
        for (const mode of ['off', 'on'] as const) {
          await restartSupervisor(dirs, modes[mode]);
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
    const off = summary(modes.off, samples.off.create, samples.off.exec);
    const on = summary(modes.on, samples.on.create, samples.on.exec);
    const r: UsernsBench = {
      rounds,
      off,
      on,
      createP50DeltaMs: r1(on.createP50Ms - off.createP50Ms),
      execP50DeltaMs: r1(on.execP50Ms - off.execP50Ms),
      templateCopyMs: templateCopyMs(dirs),
    };
    rows.push([
      `create p50 with user namespace (baseline: without)`,
      `${on.createP50Ms} ms (without: ${off.createP50Ms} ms; +${r.createP50DeltaMs})`,
      'cost of isolation',
      `${on.createSpreadMs.text} / ${off.createSpreadMs.text} ms`,
    ]);
    rows.push([
      `exec p50 with user namespace (baseline: without)`,
      `${on.execP50Ms} ms (without: ${off.execP50Ms} ms; +${r.execP50DeltaMs})`,
      'cost of isolation',
      `${on.execSpreadMs.text} / ${off.execSpreadMs.text} ms`,
    ]);
    rows.push(['template copy into the range (once per template build)', `${r.templateCopyMs ?? '?'} ms`, '-', 'one run']);
    return r;
  } finally {
    for (const c of [...COMPONENTS].reverse()) await stopComponent(dirs, c).catch(() => undefined);
    await purgeNode(dirs).catch(() => undefined);
  }
}
