/**
 * runChaos: a real node (every component a process on unix sockets, in temp dirs), a seeded
 * plan of actions (plan.ts) run against it one step at a time, kill -9 of components at random
 * points and inside handover steps (failpoints), and the invariants (invariants.ts) checked
 * after every step. After a fault the operator's remedy (`sandnode up`, as its own process) is
 * applied and the node must converge within a bound. Ends at the first violation, with the
 * step, the actions so far and what was violated; cleans up the node in every case.
 */
import { chmodSync, cpSync, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { socketPath, unixAddress } from '@sandnode/shared';
import { COMPONENTS, percentile, purgeNode, sandnodeProcesses, startStack, stopComponent, stopProcess, type Component, type ServerApi, type StackDirs } from '@sandnode/node-stack';
import { CallLog } from './calls';
import { connectApi, operatorUp } from './client';
import { checkInvariants } from './invariants';
import { Model } from './model';
import { describeAction, planActions, type Action } from './plan';
import { snapshot } from './snapshot';
import { runStep, type StepContext, type StepFigures } from './steps';

/** How long the node may take to converge after a fault (kill, failed handover), ms. */
export const DEFAULT_CONVERGE_MS = 30_000;
/** How long the invariants may take to hold after a step without a fault (the reaper finishing a teardown), ms. */
export const DEFAULT_QUIET_SETTLE_MS = 5000;
/** Time `up` waits for a component to answer during convergence, ms. */
const UP_TIMEOUT_MS = 15_000;
/** Poll interval while the node converges, ms. */
const SETTLE_POLL_MS = 250;

/** Options of {@link runChaos}. */
export interface ChaosOptions {
  /** the PRNG's seed (any 32-bit integer) */
  seed: number;
  /** number of actions */
  steps: number;
  /** each progress line (default: none) */
  log?: (line: string) => void;
  /** convergence bound after a fault, ms (default {@link DEFAULT_CONVERGE_MS}) */
  convergeMs?: number;
  /** settle bound after a quiet step, ms (default {@link DEFAULT_QUIET_SETTLE_MS}) */
  quietSettleMs?: number;
  /** the dir the node's dirs are made in (default: a new temp dir, removed at the end) */
  root?: string;
  /** where the daemons' logs are copied when the run fails (default: not kept) */
  logsDir?: string;
}

/** The first violation of a run. */
export interface ChaosFailure {
  step: number;
  action: string;
  /** the violated invariants, one line each */
  violations: string[];
  /** every action up to and including the failing one */
  actions: string[];
  /** where the daemons' logs were copied (opts.logsDir), when they were */
  logs?: string;
}

/** What a run did (bench/results/chaos.json). */
export interface ChaosReport {
  seed: number;
  steps: number;
  stepsRun: number;
  ok: boolean;
  failure?: ChaosFailure;
  actions: Record<string, number>;
  kills: Record<Component, number>;
  handovers: StepFigures['handovers'];
  failpoints: StepFigures['failpoints'];
  invariantChecks: number;
  /** checks that found a violation while the node was still converging */
  transientViolations: number;
  convergeMs: { faults: number; p50: number; max: number; boundMs: number };
  calls: { total: number; ok: number; failedByCode: Record<string, number> };
  streams: StepFigures['streams'];
  forksAborted: number;
  /** how long after a fault the run's long-lived client (one channel for the whole run) answered again, ms */
  clientBackMs: { p50: number; max: number };
  durationMs: number;
}

/** runChaos runs opts.steps actions of seed opts.seed on a fresh node and reports; never throws for a violation (ok: false says it). */
export async function runChaos(opts: ChaosOptions): Promise<ChaosReport> {
  const log = opts.log ?? (() => undefined);
  const convergeMs = opts.convergeMs ?? DEFAULT_CONVERGE_MS;
  const quietMs = opts.quietSettleMs ?? DEFAULT_QUIET_SETTLE_MS;
  const plan = planActions(opts.seed, opts.steps);
  const t0 = Date.now();
  const root = opts.root ?? passableTempDir();
  const dirs: StackDirs = { stateDir: path.join(root, 'state'), runDir: path.join(root, 'run'), listen: '' };
  const calls = new CallLog();
  const figures: StepFigures = {
    kills: { 'vmm-supervisor': 0, 'ublk-manager': 0, server: 0 },
    handovers: { server: { ok: 0, failed: 0 }, ublk: { ok: 0, failed: 0 } },
    failpoints: { armed: 0, fired: 0, notFired: [] },
    streams: { ok: 0, failed: 0, bytes: 0 },
    forksAborted: 0,
  };
  const report: ChaosReport = {
    seed: opts.seed,
    steps: opts.steps,
    stepsRun: 0,
    ok: true,
    actions: {},
    kills: figures.kills,
    handovers: figures.handovers,
    failpoints: figures.failpoints,
    invariantChecks: 0,
    transientViolations: 0,
    convergeMs: { faults: 0, p50: 0, max: 0, boundMs: convergeMs },
    calls: { total: 0, ok: 0, failedByCode: {} },
    streams: figures.streams,
    forksAborted: 0,
    clientBackMs: { p50: 0, max: 0 },
    durationMs: 0,
  };
  const converged: number[] = [];
  const staleSince = new Map<string, number>();
  const clientBackMs: number[] = [];
  const done: string[] = [];
  let api: ServerApi | undefined;
  try {
    log(`chaos: node in ${root}`);
    await startStack(dirs);
    api = connectApi(unixAddress(socketPath(dirs.runDir, 'server')));
    await api.templates.buildTemplate({ name: 'base', replace: false });
    const ctx: StepContext = { dirs, api, calls, model: new Model(), figures, seed: opts.seed };
    const settle = async (bound: number, operator: boolean) => {
      const s0 = Date.now();
      let failed = 0;
      for (;;) {
        if (operator) await operatorUp(dirs, UP_TIMEOUT_MS).catch((err: Error) => log(`  up: ${err.message.split('\n')[0]}`));
        const snap = await snapshot(dirs, staleSince);
        report.invariantChecks++;
        const v = [...ctx.model.adopt(snap), ...checkInvariants(snap, ctx.model.expectations())];
        if (!v.length) {
          ctx.model.settle(snap);
          // and the run's own long-lived client (a user's) reaches the server again
          const back = await clientBack(ctx.api, s0 + bound);
          if (back) return { ms: Date.now() - s0, violations: [back] };
          if (operator) clientBackMs.push(Date.now() - s0);
          return { ms: Date.now() - s0, violations: [] };
        }
        report.transientViolations++;
        // what the node still lacked at the first check, for the log
        if (failed++ === 0) log(`  settling: ${v.slice(0, 3).join('; ')}${v.length > 3 ? ` (+${v.length - 3} more)` : ''}`);
        if (Date.now() - s0 > bound) return { ms: Date.now() - s0, violations: v };
        await new Promise((r) => setTimeout(r, SETTLE_POLL_MS));
      }
    };
    const first = await settle(quietMs, false);
    if (first.violations.length) throw new Failure({ step: 0, action: 'start', violations: first.violations, actions: [] });
    for (const a of plan) {
      const line = describeAction(a);
      done.push(line);
      const st = await runStep(ctx, a);
      report.actions[st.kind] = (report.actions[st.kind] ?? 0) + 1;
      log(`step ${line}: ${st.summary}`);
      if (st.violations.length) throw new Failure({ step: a.step, action: line, violations: st.violations, actions: [...done] });
      const r = await settle(st.fault ? convergeMs : quietMs, st.fault);
      if (st.fault) converged.push(r.ms);
      if (r.violations.length) {
        const what = st.fault ? `the node did not converge within ${convergeMs} ms after the fault` : `the invariants did not hold within ${quietMs} ms after a step without a fault`;
        throw new Failure({ step: a.step, action: line, violations: [what, ...r.violations], actions: [...done] });
      }
      // the next step starts at once, as a user's next call would: the server waits for a restarted peer itself (shared peer-connect.ts)
      if (st.fault) log(`  converged in ${r.ms} ms`);
      report.stepsRun = a.step;
    }
    // the end: every sandbox deleted, and the node empty
    for (const id of ctx.model.ids()) {
      const r = await ctx.api.sandboxes.deleteSandbox({ sandboxId: id }).catch((err: Error) => err);
      if (r instanceof Error) throw new Failure({ step: plan.length + 1, action: 'delete all', violations: [`DeleteSandbox ${id}: ${r.message}`], actions: [...done] });
      ctx.model.gone(id);
    }
    const end = await settle(quietMs, false);
    if (end.violations.length) throw new Failure({ step: plan.length + 1, action: 'delete all', violations: end.violations, actions: [...done] });
  } catch (err) {
    report.ok = false;
    report.failure =
      err instanceof Failure
        ? err.failure
        : {
            step: report.stepsRun + 1,
            action: plan[report.stepsRun]?.step ? describeAction(plan[report.stepsRun] as Action) : 'start',
            violations: [`the run failed: ${(err as Error).stack ?? String(err)}`],
            actions: [...done],
          };
  } finally {
    api?.close();
    if (!report.ok && report.failure && opts.logsDir) {
      try {
        cpSync(path.join(dirs.runDir, 'logs'), opts.logsDir, { recursive: true });
        report.failure.logs = path.resolve(opts.logsDir);
      } catch (err) {
        log(`chaos: could not keep the logs: ${(err as Error).message}`);
      }
    }
    await cleanUp(dirs).catch((err: Error) => log(`chaos: clean-up: ${err.message}`));
    if (!opts.root) rmSync(root, { recursive: true, force: true });
  }
  const t = calls.totals();
  report.calls = { total: t.calls, ok: t.ok, failedByCode: calls.failedByCode() };
  report.convergeMs = { faults: converged.length, p50: Math.round(percentile(converged, 50) || 0), max: Math.max(0, ...converged), boundMs: convergeMs };
  report.forksAborted = figures.forksAborted;
  report.clientBackMs = { p50: Math.round(percentile(clientBackMs, 50) || 0), max: Math.max(0, ...clientBackMs) };
  report.durationMs = Date.now() - t0;
  return report;
}

/** Deadline of one call of {@link clientBack}, ms. */
const CLIENT_PROBE_MS = 2000;

/**
 * clientBack waits until the run's long-lived client answers ListSandboxes (until endMs, epoch
 * ms); undefined when it does, else the violation.
 */
async function clientBack(api: ServerApi, endMs: number): Promise<string | undefined> {
  let last: string;
  for (;;) {
    try {
      await api.sandboxes.listSandboxes({ pageSize: 1 }, { deadline: new Date(Date.now() + CLIENT_PROBE_MS), retry: false });
      return undefined;
    } catch (err) {
      last = String((err as Error).message).split('\n')[0] ?? '';
    }
    if (Date.now() > endMs) return `the run's client (one channel since the start) does not reach the server, which answers on a new channel: ${last}`;
    await new Promise((r) => setTimeout(r, SETTLE_POLL_MS));
  }
}

/** A violation that ends the run. */
class Failure extends Error {
  constructor(readonly failure: ChaosFailure) {
    super(failure.violations.join('; '));
  }
}

/** cleanUp stops every daemon of the node (those in no pid file too: a standby, an old slot) and purges what they left. */
async function cleanUp(dirs: StackDirs): Promise<void> {
  for (const c of [...COMPONENTS].reverse()) await stopComponent(dirs, c, 5000).catch(() => undefined);
  for (const p of sandnodeProcesses(dirs.runDir)) await stopProcess(p.pid, { signal: 'SIGKILL' });
  await purgeNode(dirs);
}

/** passableTempDir makes a fresh root in the temp dir, mode 0711: others may pass (the sandboxes' user namespace root must reach <runDir>), not list. */
function passableTempDir(): string {
  const root = mkdtempSync(path.join(os.tmpdir(), 'sandnode-chaos-'));
  chmodSync(root, 0o711);
  return root;
}
