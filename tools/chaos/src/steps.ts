/**
 * One step of a chaos run: the action's calls, with its kill -9 at a random delay or its
 * handover failpoint, and what the calls' answers promise (the model). A call may fail only
 * in a step with a fault, and then with a clear code (never UNKNOWN, never a hang); a stream
 * either brings every byte or fails so.
 */
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { MAX_FREEZE_MS, processState } from '@sandnode/shared';
import { killComponent, upgradeServer, upgradeUblkManager, waitForActiveServer, type Component, type ServerApi, type StackDirs } from '@sandnode/node-stack';
import { call, execStream, type CallLog, type StreamResult } from './calls';
import { REQUEST_KEY, type Model } from './model';
import type { Action, HandoverFailpoint, PlannedKill } from './plan';

/** Most sandboxes (with the failed creates that may exist) a run keeps at once: a create beyond deletes instead. */
export const MAX_SANDBOXES = 4;
/** Time one upgrade (server or ublk-manager) may take, ms. */
export const UPGRADE_TIMEOUT_MS = 60_000;

/** The figures the steps count. */
export interface StepFigures {
  kills: Record<Component, number>;
  handovers: { server: { ok: number; failed: number }; ublk: { ok: number; failed: number } };
  /** armed: handovers run with a failpoint; fired: those whose process it stopped (the upgrade failed); notFired: the others, named */
  failpoints: { armed: number; fired: number; notFired: string[] };
  streams: { ok: number; failed: number; bytes: number };
  /** forks ABORTED twice (the clone outlasted even the longest freeze window): nothing made, the parent runs on */
  forksAborted: number;
}

/** What a step works with. */
export interface StepContext {
  dirs: StackDirs;
  api: ServerApi;
  calls: CallLog;
  model: Model;
  figures: StepFigures;
  seed: number;
}

/** What a step did. */
export interface StepResult {
  /** what the action did: its kind, or the create or delete it became for want of a target */
  kind: Action['kind'];
  /** a kill or failpoint fired: the node converges with the operator's help */
  fault: boolean;
  /** what the step's own calls violated */
  violations: string[];
  summary: string;
}

/** How long the process armed with an old-side failpoint gets to be gone after the upgrade, ms. */
const FIRED_WAIT_MS = 3000;

/** goneWithin: pid is gone (or a zombie) within ms. */
async function goneWithin(pid: number, ms: number): Promise<boolean> {
  const end = Date.now() + ms;
  for (;;) {
    const st = processState(pid);
    if (st === undefined || st === 'Z') return true;
    if (Date.now() > end) return false;
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** retiredIn: the log of the server pid says it retired (a clean exit, not the failpoint's kill); ublk-manager: false. */
function retiredIn(ctx: StepContext, kind: string, pid: number): boolean {
  if (kind !== 'upgrade-server') return false;
  const logs = path.join(path.resolve(ctx.dirs.runDir), 'logs');
  for (const f of readdirSync(logs).filter((n) => n.startsWith('server'))) {
    for (const line of readFileSync(path.join(logs, f), 'utf8').split('\n')) if (line.includes(`"pid":${pid},`) && line.includes('"msg":"retired"')) return true;
  }
  return false;
}

/** How long a failed upgrade's claim that the old server stays active may take to be true, ms. */
const CLAIM_WAIT_MS = 3000;

/** The env var of each service's failpoints. */
const FAILPOINT_ENV: Record<HandoverFailpoint['service'], string> = { server: 'SANDNODE_SERVER_FAILPOINTS', 'ublk-manager': 'SANDNODE_UBLK_MANAGER_FAILPOINTS' };

/** runStep runs action a. */
export async function runStep(ctx: StepContext, a: Action): Promise<StepResult> {
  const kind = resolveKind(ctx.model, a);
  const res: StepResult = { kind, fault: false, violations: [], summary: '' };
  const faulty = () => res.fault || a.kill !== undefined || a.failpoint !== undefined;
  /** check says whether a failed call is fine: only in a step with a fault, and with a clear code */
  const check = (what: string, r: { ok: boolean; outcome?: string; message?: string }) => {
    if (r.ok) return;
    if (r.outcome === 'UNKNOWN' || r.outcome === 'HANG' || r.outcome === 'CORRUPT') res.violations.push(`${what}: ${r.outcome}: ${r.message}`);
    else if (!faulty()) res.violations.push(`${what} failed without a fault: ${r.outcome}: ${r.message}`);
  };
  const work = async (): Promise<string> => {
    const rid = `chaos-${ctx.seed}-${a.step}`;
    const running = ctx.model.inState('RUNNING');
    switch (kind) {
      case 'create': {
        const r = await call(ctx.calls, 'CreateSandbox', (o) => ctx.api.sandboxes.createSandbox({ template: 'base', requestId: rid, metadata: { [REQUEST_KEY]: rid } }, o));
        if (r.ok) ctx.model.made(r.value.sandbox!.sandboxId, r.value.sandbox!.pid);
        else ctx.model.failedToMake(rid);
        check('CreateSandbox', r);
        return r.ok ? `created ${r.value.sandbox!.sandboxId}` : `create failed: ${r.outcome}`;
      }
      case 'exec': {
        const id = pickOf(running, a.pick);
        const s = await execStream(ctx.calls, ctx.api, id, a);
        countStream(ctx, s);
        check(`Exec in ${id}`, { ok: s.outcome === 'OK', outcome: s.outcome, message: s.message });
        return `exec ${id}: ${s.outcome} ${s.bytes} bytes in ${s.ms} ms`;
      }
      case 'fork': {
        const parent = pickOf(running, a.pick);
        const fork = (maxFreezeMs: number) =>
          call(ctx.calls, 'ForkSandbox', (o) => ctx.api.sandboxes.forkSandbox({ parentId: parent, requestId: rid, metadata: { [REQUEST_KEY]: rid }, maxFreezeMs }, o));
        let r = await fork(0);
        // ABORTED is the documented answer of a clone that outlasts the freeze window (a loaded host): retry as it advises
        if (!r.ok && r.outcome === 'ABORTED') r = await fork(MAX_FREEZE_MS);
        if (!r.ok && r.outcome === 'ABORTED') {
          ctx.figures.forksAborted++;
          return `fork of ${parent}: ABORTED twice (freeze window): ${r.message}`;
        }
        if (r.ok) ctx.model.made(r.value.sandbox!.sandboxId, r.value.sandbox!.pid);
        else ctx.model.failedToMake(rid);
        check(`ForkSandbox of ${parent}`, r);
        return r.ok ? `forked ${parent} -> ${r.value.sandbox!.sandboxId}` : `fork of ${parent} failed: ${r.outcome}`;
      }
      case 'pause':
      case 'resume': {
        const id = pickOf(ctx.model.inState(kind === 'pause' ? 'RUNNING' : 'PAUSED'), a.pick);
        const r = await call(ctx.calls, kind === 'pause' ? 'PauseSandbox' : 'ResumeSandbox', (o) =>
          kind === 'pause' ? ctx.api.sandboxes.pauseSandbox({ sandboxId: id }, o) : ctx.api.sandboxes.resumeSandbox({ sandboxId: id }, o),
        );
        if (r.ok) ctx.model.now(id, kind === 'pause' ? 'PAUSED' : 'RUNNING');
        else ctx.model.maybe(id, ['RUNNING', 'PAUSED']);
        check(`${kind} ${id}`, r);
        return `${kind} ${id}: ${r.ok ? 'OK' : r.outcome}`;
      }
      case 'delete': {
        const id = pickOf(ctx.model.ids(), a.pick);
        const r = await call(ctx.calls, 'DeleteSandbox', (o) => ctx.api.sandboxes.deleteSandbox({ sandboxId: id }, o));
        if (r.ok) ctx.model.gone(id);
        else ctx.model.maybe(id, [], true);
        check(`DeleteSandbox ${id}`, r);
        return `delete ${id}: ${r.ok ? 'OK' : r.outcome}`;
      }
      case 'upgrade-server':
      case 'upgrade-ublk':
        return handover(ctx, a, kind, res, check);
    }
  };
  res.summary = await withKill(ctx, a.kill, work, res);
  return res;
}

/** resolveKind turns an action without a target into a create (or a delete at MAX_SANDBOXES), so that every step acts. */
function resolveKind(m: Model, a: Action): Action['kind'] {
  const need: Partial<Record<Action['kind'], string[]>> = { exec: m.inState('RUNNING'), fork: m.inState('RUNNING'), pause: m.inState('RUNNING'), resume: m.inState('PAUSED'), delete: m.ids() };
  const targets = need[a.kind];
  const full = m.size() >= MAX_SANDBOXES;
  if (a.kind === 'create' || a.kind === 'fork') {
    if (full) return m.ids().length ? 'delete' : 'exec';
    if (a.kind === 'fork' && !targets?.length) return 'create';
    return a.kind;
  }
  if (targets && !targets.length) return full ? 'delete' : 'create';
  return a.kind;
}

function pickOf(ids: string[], pick: number): string {
  return ids[pick % ids.length]!;
}

function countStream(ctx: StepContext, s: StreamResult): void {
  if (s.outcome === 'OK') ctx.figures.streams.ok++;
  else ctx.figures.streams.failed++;
  ctx.figures.streams.bytes += s.bytes;
}

/** withKill runs work and, when kill is set, kill -9 of its component after its delay (counted; the step has a fault). */
async function withKill(ctx: StepContext, kill: PlannedKill | undefined, work: () => Promise<string>, res: StepResult): Promise<string> {
  if (!kill) return work();
  const killer = (async () => {
    await new Promise((r) => setTimeout(r, kill.delayMs));
    const pid = await killComponent(ctx.dirs, kill.component);
    if (pid) {
      ctx.figures.kills[kill.component]++;
      res.fault = true;
    }
    return pid;
  })();
  const [summary, pid] = await Promise.all([work(), killer]);
  return `${summary}; kill -9 ${kill.component} ${pid ? `pid ${pid}` : '(not running)'}`;
}

/**
 * handover runs `upgrade server` or `upgrade ublk-manager` from this build, with an exec
 * stream across it when a sandbox runs. A failpoint of the side that takes over is set in the
 * environment of the process the upgrade starts; one of the side that hands over is armed by a
 * clean upgrade first (its new process is the next one's old one).
 */
async function handover(
  ctx: StepContext,
  a: Action,
  kind: 'upgrade-server' | 'upgrade-ublk',
  res: StepResult,
  check: (what: string, r: { ok: boolean; outcome?: string; message?: string }) => void,
): Promise<string> {
  const fp = a.failpoint;
  const figures = kind === 'upgrade-server' ? ctx.figures.handovers.server : ctx.figures.handovers.ublk;
  const upgrade = async (env: string | undefined): Promise<{ ok: boolean; message: string; pid: number }> => {
    const key = fp ? FAILPOINT_ENV[fp.service] : '';
    if (env) process.env[key] = env;
    try {
      // upgradeUblkManager reads the environment after its first await: the env stays set until it returns
      const pid = kind === 'upgrade-server' ? (await upgradeServer(ctx.dirs, '.', UPGRADE_TIMEOUT_MS)).newPid : (await upgradeUblkManager(ctx.dirs, '.', UPGRADE_TIMEOUT_MS)).newPid;
      figures.ok++;
      return { ok: true, message: '', pid };
    } catch (err) {
      figures.failed++;
      return { ok: false, message: String((err as Error).message).split('\n')[0] ?? '', pid: 0 };
    } finally {
      if (env) delete process.env[key];
    }
  };
  const notes: string[] = [];
  let armedPid = 0;
  if (fp?.side === 'old') {
    const armed = await upgrade(`${fp.name}=kill`);
    if (!armed.ok) {
      res.violations.push(`the clean ${kind} that arms ${fp.name} failed: ${armed.message}`);
      return `arming ${fp.name} failed`;
    }
    armedPid = armed.pid;
    notes.push(`armed ${fp.name} in pid ${armedPid}`);
  }
  const running = ctx.model.inState('RUNNING');
  const stream = running.length ? execStream(ctx.calls, ctx.api, pickOf(running, a.pick), a) : undefined;
  const r = await upgrade(fp?.side === 'new' ? `${fp.name}=kill` : undefined);
  if (fp) {
    // the old side's process may die at its step and the takeover still succeed (after the lease was released)
    ctx.figures.failpoints.armed++;
    const fired = !r.ok || (armedPid > 0 && (await goneWithin(armedPid, FIRED_WAIT_MS)) && !retiredIn(ctx, kind, armedPid));
    if (fired) ctx.figures.failpoints.fired++;
    else ctx.figures.failpoints.notFired.push(`step ${a.step} ${fp.service}:${fp.name}`);
    res.fault = true;
  } else if (!r.ok && !a.kill) res.violations.push(`${kind} failed without a fault: ${r.message}`);
  // what a failed upgrade says about the node must be true (with no kill of ours racing it)
  const stays = /the old server \(pid (\d+)\) stays active/.exec(r.ok || a.kill ? '' : r.message);
  if (stays) {
    const active = await waitForActiveServer(ctx.dirs.runDir, CLAIM_WAIT_MS).catch(() => undefined);
    if (active?.holderPid !== Number(stays[1]))
      res.violations.push(`${kind} said "the old server (pid ${stays[1]}) stays active", but ${active ? `pid ${active.holderPid} is` : 'no server is'} active`);
  }
  if (!r.ok && a.kill) res.fault = true;
  const s = stream ? await stream : undefined;
  if (s) {
    countStream(ctx, s);
    check(`Exec across ${kind}`, { ok: s.outcome === 'OK', outcome: s.outcome, message: s.message });
    notes.push(`stream ${s.outcome} ${s.bytes} bytes`);
  }
  return `${kind}: ${r.ok ? 'OK' : `failed: ${r.message}`}${notes.length ? ` (${notes.join(', ')})` : ''}`;
}
