/**
 * Idle actions (issue 14 §3, feature "server.idle.v1"): a sandbox created with `idle` settings is
 * paused, hibernated or deleted when nothing has used it for a while, and an Exec, a file call or
 * an ingress request resumes it (auto-resume) and then proceeds.
 *
 * Timers: every one is an absolute time in the record (IdleRecord: last activity, the KeepAlive
 * lease's end, when it was paused or hibernated), never an in-memory countdown, so a handover, a
 * crash or a drain neither resets nor loses one; the next action is computed from them
 * ({@link nextIdleAction}). Activity is counted in memory ({@link IdleController.activity}, per
 * call, per ingress request and chunk) and written to the record at most every flushMs (and at
 * every transition of the sandbox, a handover and a drain), so the record is never written per
 * byte; a kill -9 loses at most flushMs of activity (the idle action then comes that much early).
 *
 * Actions (the reaper runs {@link IdleController.tick}): each goes through the handover gate and
 * the sandbox's lock, reads the record again under it, and is done only if it is still due and no
 * call of the sandbox is in flight; moves are the transition table's (transitions.ts):
 *   pause      RUNNING -> PAUSED (the PauseSandbox path: freeze)
 *   hibernate  RUNNING/PAUSED -> DRAINED, resume method "cold-start", hibernatedAtMs set: the
 *              VM is stopped (freeze first when RUNNING), disks and network slot kept (drain.ts)
 *   delete     PAUSED or hibernated longer than paused_ttl_s: teardown (provision.ts)
 *
 * A bulk transfer (sandbox cp through PrepareBulkTransfer) runs between the caller and podd,
 * where the server sees no byte: before it pauses or hibernates a RUNNING sandbox the action asks
 * podd (Health bulk_transfers, at most BULK_CHECK_TIMEOUT_MS) and waits while one runs, for at
 * most BULK_HOLD_MAX_MS after the sandbox's last activity (PrepareBulkTransfer is one; the bound
 * lives in the record, so no handover or restart starts it again: podd runs in the sandbox, and
 * a hostile one could claim a transfer forever; attacker). The end of a transfer this server saw
 * counts as activity. A podd that does not answer in time holds nothing.
 *
 * Races resolve to one transition: an action in progress is waited for by an auto-resume
 * (`acting`), an auto-resume in progress is joined by the next one (`resuming`), and an action
 * that finds a call in flight under the lock does nothing (the caller's entry is counted before
 * it looks at the state).
 */
import { FailedPreconditionError, InvalidArgumentError, SANDBOX_ID_RE, UnavailableError } from '@sandnode/shared';
import type { CoreContext } from './context';
import { stopVmKeepingSlot } from './network';
import { teardown } from './provision';
import { transition } from './transitions';
import { COLD_START, type IdleRef, type IdleSettings, type SandboxRecord } from './types';

/** Largest idle time or lease, seconds (30 days, as timeout_seconds). */
export const MAX_IDLE_SECONDS = 2_592_000;
/** Default of server key autoResumeTimeoutMs: how long a call waits for an auto-resume, ms. */
export const DEFAULT_AUTO_RESUME_TIMEOUT_MS = 30_000;
/** Default of server key idleActivityFlushMs: the in-memory activity is written to the record at most this often, ms. */
export const DEFAULT_IDLE_ACTIVITY_FLUSH_MS = 5_000;
/** What a caller past the auto-resume bound is told to wait before a retry, ms (trailer retry-after-ms). */
export const AUTO_RESUME_RETRY_AFTER_MS = 1_000;

/** How long an idle action waits for podd's count of bulk transfers, ms (no answer: the action goes on). */
export const BULK_CHECK_TIMEOUT_MS = 500;
/** Longest run of idle actions that podd's bulk transfers hold off, ms (1 h: 700 GB at 200 MB/s). */
export const BULK_HOLD_MAX_MS = 3_600_000;

/** An idle action. */
export type IdleAction = 'pause' | 'hibernate' | 'delete';

/** IdleSettings as a request gives them (sandbox.proto IdleSettings; auto_resume unset = true). */
export interface IdleSettingsRequest {
  pauseAfterS: number;
  hibernateAfterS: number;
  pausedTtlS: number;
  autoResume?: boolean;
}

/** ResumeWaitError: an auto-resume did not finish within the bound. UNAVAILABLE with trailer retry-after-ms. */
export class ResumeWaitError extends UnavailableError {
  constructor(
    message: string,
    /** how long the caller should wait before retrying, ms */
    readonly retryAfterMs: number,
  ) {
    super(message);
  }
}

function seconds(field: string, v: number): number {
  if (!Number.isInteger(v) || v < 0 || v > MAX_IDLE_SECONDS) throw new InvalidArgumentError(`${field}: ${v} is not a whole number of seconds in 0..${MAX_IDLE_SECONDS} (30 days)`);
  return v;
}

/**
 * validateIdle checks CreateSandboxRequest.idle: each time 0..MAX_IDLE_SECONDS, hibernate after
 * pause when both are set. undefined stays undefined (no idle actions). INVALID_ARGUMENT naming the field.
 */
export function validateIdle(field: string, req: IdleSettingsRequest | undefined): IdleSettings | undefined {
  if (!req) return undefined;
  const s: IdleSettings = {
    pauseAfterS: seconds(`${field}.pause_after_s`, req.pauseAfterS),
    hibernateAfterS: seconds(`${field}.hibernate_after_s`, req.hibernateAfterS),
    pausedTtlS: seconds(`${field}.paused_ttl_s`, req.pausedTtlS),
    autoResume: req.autoResume ?? true,
  };
  if (s.pauseAfterS > 0 && s.hibernateAfterS > 0 && s.hibernateAfterS <= s.pauseAfterS) {
    throw new InvalidArgumentError(`${field}.hibernate_after_s: ${s.hibernateAfterS} must be above pause_after_s (${s.pauseAfterS}): a sandbox is paused first, then hibernated`);
  }
  return s;
}

/** validateKeepAlive checks KeepAliveRequest.for_s (0..MAX_IDLE_SECONDS). INVALID_ARGUMENT. */
export function validateKeepAlive(field: string, forS: number): number {
  return seconds(field, forS);
}

/**
 * keepAlive holds off the idle actions of id until forS seconds from now (0: ends the lease),
 * persisted before it returns; a sandbox without idle settings is answered unchanged. Throws
 * INVALID_ARGUMENT (for_s) at once; the promise rejects NOT_FOUND.
 */
export function keepAlive(c: CoreContext, id: string, forS: number, signal?: AbortSignal): Promise<SandboxRecord> {
  validateKeepAlive('for_s', forS);
  c.get(id);
  return c.gated(
    id,
    async () => {
      const rec = c.get(id);
      if (!rec.idle) return rec;
      rec.idle.keepAliveUntilMs = forS ? c.now() + forS * 1000 : 0;
      c.touch(rec);
      return rec;
    },
    signal,
  );
}

/** newIdleRef is the idle part of a new record: activity now, no lease. */
export function newIdleRef(settings: IdleSettings, nowMs: number): IdleRef {
  return { settings, lastActivityMs: nowMs, keepAliveUntilMs: 0, pausedAtMs: 0, hibernatedAtMs: 0 };
}

/** isHibernated: DRAINED by its hibernate_after_s (not by a node drain). */
export function isHibernated(rec: SandboxRecord): boolean {
  return rec.state === 'DRAINED' && (rec.idle?.hibernatedAtMs ?? 0) > 0;
}

/**
 * nextIdleAction is the idle action due next for rec and when (epoch ms), given its last activity
 * (ms; the later of the record's and the in-memory one); undefined when none will come. Idle time
 * counts from the later of the last activity and the lease's end; the paused TTL from pausedAtMs,
 * held off by the lease too. Given nowMs (epoch ms), of several actions already due the last of the
 * chain pause -> hibernate -> delete is answered (no pause just before a hibernate).
 */
export function nextIdleAction(rec: SandboxRecord, lastActivityMs: number, nowMs?: number): { action: IdleAction; atMs: number } | undefined {
  const i = rec.idle;
  if (!i) return undefined;
  const s = i.settings;
  const base = Math.max(lastActivityMs, i.keepAliveUntilMs);
  const ttl = () => (s.pausedTtlS > 0 && i.pausedAtMs > 0 ? { action: 'delete' as const, atMs: Math.max(i.pausedAtMs + s.pausedTtlS * 1000, i.keepAliveUntilMs) } : undefined);
  const hibernate = s.hibernateAfterS > 0 ? { action: 'hibernate' as const, atMs: base + s.hibernateAfterS * 1000 } : undefined;
  const candidates: ({ action: IdleAction; atMs: number } | undefined)[] = [];
  if (rec.state === 'RUNNING') candidates.push(s.pauseAfterS > 0 ? { action: 'pause', atMs: base + s.pauseAfterS * 1000 } : undefined, hibernate);
  else if (rec.state === 'PAUSED') candidates.push(hibernate, ttl());
  else if (isHibernated(rec)) candidates.push(ttl());
  // of the actions already due at nowMs the last one of the chain (a pause and a hibernate both due: hibernate); else the earliest
  const order: IdleAction[] = ['pause', 'hibernate', 'delete'];
  let best: { action: IdleAction; atMs: number } | undefined;
  for (const c of candidates) {
    if (!c) continue;
    const bothDue = best && nowMs !== undefined && c.atMs <= nowMs && best.atMs <= nowMs;
    if (!best || (bothDue ? order.indexOf(c.action) > order.indexOf(best.action) : c.atMs < best.atMs)) best = c;
  }
  return best;
}

/** What an ingress request to a sandbox that is not RUNNING gets: go on, or the answer to give. */
export type IngressWake = { ok: true } | { ok: false; status: 409 | 503; reason: string; retryAfterS?: number };

export interface IdleControllerOptions {
  /** how long a call waits for an auto-resume, ms */
  autoResumeTimeoutMs: number;
  /** the in-memory activity is written at most this often, ms */
  flushMs: number;
  /** resume (SandboxManager.resume: gated, locked, PAUSED or DRAINED) */
  resume: (id: string) => Promise<SandboxRecord>;
}

/** IdleController: activity, auto-resume and idle actions of one active server (file header). */
export class IdleController {
  /** last activity seen, epoch ms, newer than the record's */
  private readonly seen = new Map<string, number>();
  /** calls in flight per sandbox (an idle action waits for none to run) */
  private readonly inflight = new Map<string, number>();
  /** idle actions in progress */
  private readonly acting = new Map<string, Promise<unknown>>();
  /** auto-resumes in progress (the next caller joins) */
  private readonly resuming = new Map<string, Promise<void>>();
  /** sandboxes whose idle action this server held off for a bulk transfer (its end is activity) */
  private readonly bulkHeld = new Set<string>();

  constructor(
    private readonly c: CoreContext,
    private readonly o: IdleControllerOptions,
  ) {}

  /** activity notes that sandbox id was used now (cheap: a map write). */
  activity(id: string): void {
    this.seen.set(id, this.c.now());
  }

  /** enter counts a call of sandbox id in flight (and activity); call the returned leave exactly once. */
  enter(id: string): () => void {
    this.activity(id);
    this.inflight.set(id, (this.inflight.get(id) ?? 0) + 1);
    let left = false;
    return () => {
      if (left) return;
      left = true;
      this.activity(id);
      const n = (this.inflight.get(id) ?? 1) - 1;
      if (n <= 0) this.inflight.delete(id);
      else this.inflight.set(id, n);
    };
  }

  /** lastActivityMs of rec: the later of the record's and the in-memory one, epoch ms. */
  lastActivityMs(rec: SandboxRecord): number {
    return Math.max(rec.idle?.lastActivityMs ?? 0, this.seen.get(rec.sandboxId) ?? 0);
  }

  /**
   * onTouch (SandboxManager.touch, before every persist): the in-memory activity goes into the
   * record, pausedAtMs follows the state (set when PAUSED or hibernated, 0 when RUNNING), and a
   * sandbox that comes back to RUNNING counts that as activity.
   */
  onTouch(rec: SandboxRecord): void {
    const i = rec.idle;
    if (!i) return;
    const now = this.c.now();
    i.lastActivityMs = this.lastActivityMs(rec);
    if (rec.state === 'PAUSED' || isHibernated(rec)) {
      if (i.pausedAtMs === 0) i.pausedAtMs = now;
    } else if (rec.state === 'RUNNING') {
      if (i.pausedAtMs > 0 || i.hibernatedAtMs > 0) i.lastActivityMs = Math.max(i.lastActivityMs, now);
      i.pausedAtMs = 0;
      i.hibernatedAtMs = 0;
    }
    if (rec.state === 'DELETING') this.forget(rec.sandboxId);
  }

  /** forget drops what is kept in memory of a sandbox (it is gone). */
  private forget(id: string): void {
    this.seen.delete(id);
    this.bulkHeld.delete(id);
  }

  /**
   * bulkState: 'hold' while podd of rec says a bulk transfer runs and the sandbox's last
   * activity (the record's, which a handover keeps) is less than BULK_HOLD_MAX_MS ago; 'ended'
   * when a transfer this server held for has ended; else 'none' (also when podd does not
   * answer within BULK_CHECK_TIMEOUT_MS, fails, or has no such count).
   */
  private async bulkState(rec: SandboxRecord): Promise<'hold' | 'ended' | 'none'> {
    const id = rec.sandboxId;
    const client = this.c.podd.connect(rec.poddAddress);
    const n = await Promise.resolve(client.bulkTransfers?.(BULK_CHECK_TIMEOUT_MS)).then(
      (v) => v ?? 0,
      () => 0,
    );
    if (n > 0 && this.c.now() - this.lastActivityMs(rec) < BULK_HOLD_MAX_MS) {
      this.bulkHeld.add(id);
      return 'hold';
    }
    const ended = n <= 0 && this.bulkHeld.has(id);
    this.bulkHeld.delete(id);
    return ended ? 'ended' : 'none';
  }

  /**
   * flush writes the in-memory activity into the records: those at least flushMs newer than the
   * record's (all: every newer one, for a handover or a drain). A sandbox whose lock is held is
   * left to its holder's touch (onTouch). Synchronous: no operation can run between read and write.
   * Returns the ids written.
   */
  flush(all = false): string[] {
    const written: string[] = [];
    for (const [id, ms] of this.seen) {
      if (this.c.locks.busy(id)) continue;
      const rec = this.c.store.get(id);
      if (!rec?.idle) {
        this.seen.delete(id);
        continue;
      }
      if (ms <= rec.idle.lastActivityMs || (!all && ms - rec.idle.lastActivityMs < this.o.flushMs)) continue;
      rec.idle.lastActivityMs = ms;
      this.c.store.put(rec);
      written.push(id);
    }
    return written;
  }

  /**
   * ensureRunning is what an Exec, a file call or an ingress request does first: a sandbox with
   * idle settings that is PAUSED or hibernated is resumed (one resume however many callers; an
   * idle action in progress is waited for first) and waited for at most autoResumeTimeoutMs.
   * Any other state, and a malformed or unknown id, is left for the operation's own checks. Errors: FAILED_PRECONDITION
   * (auto_resume off, naming the state), UNAVAILABLE (ResumeWaitError: not RUNNING within the
   * bound, retry after AUTO_RESUME_RETRY_AFTER_MS), the resume's own (NOT_FOUND, ...).
   */
  async ensureRunning(id: string, op: string, signal?: AbortSignal): Promise<void> {
    const acting = this.acting.get(id);
    if (acting) await acting.catch(() => undefined);
    // a malformed or unknown id is left to the operation: its own checks (and their order) answer
    const rec = SANDBOX_ID_RE.test(id) ? this.c.store.get(id) : undefined;
    if (!rec || rec.state === 'RUNNING' || !rec.idle || !(rec.state === 'PAUSED' || isHibernated(rec))) return;
    const what = rec.state === 'PAUSED' ? 'PAUSED' : 'hibernated (DRAINED)';
    if (!rec.idle.settings.autoResume) throw new FailedPreconditionError(`sandbox ${id} is ${what} and its idle.auto_resume is off: ResumeSandbox it first (${op} needs RUNNING)`);
    let p = this.resuming.get(id);
    if (!p) {
      p = this.o
        .resume(id)
        .then(
          (r) => this.c.log.info({ sandbox_id: id, vm_pid: r.vm?.pid, op }, `auto-resumed a ${what} sandbox`),
          (err: unknown) => {
            // another caller's resume (ResumeSandbox) won: it runs
            if (this.c.store.get(id)?.state === 'RUNNING') return;
            throw err;
          },
        )
        .finally(() => this.resuming.delete(id));
      this.resuming.set(id, p);
    }
    await bounded(
      p,
      this.o.autoResumeTimeoutMs,
      signal,
      () =>
        new ResumeWaitError(
          `sandbox ${id} is being resumed from ${what} and did not come up within ${this.o.autoResumeTimeoutMs} ms (server key autoResumeTimeoutMs): retry`,
          AUTO_RESUME_RETRY_AFTER_MS,
        ),
    );
  }

  /**
   * refuseAsleep is what a read-role caller's call does instead of ensureRunning (rpc/idle-hooks.ts;
   * a read caller is no activity and wakes nothing, so a read-only observer can neither keep a
   * sandbox from its idle actions nor resume it at its owner's cost): an idle action in progress
   * is waited for, then a PAUSED or hibernated sandbox is refused. Any other state, and a malformed
   * or unknown id, is left for the operation's own checks. Errors: FAILED_PRECONDITION naming the
   * state and what resumes it.
   */
  async refuseAsleep(id: string, op: string): Promise<void> {
    const acting = this.acting.get(id);
    if (acting) await acting.catch(() => undefined);
    const rec = SANDBOX_ID_RE.test(id) ? this.c.store.get(id) : undefined;
    if (!rec || !(rec.state === 'PAUSED' || isHibernated(rec))) return;
    const what = rec.state === 'PAUSED' ? 'PAUSED' : 'hibernated (DRAINED)';
    throw new FailedPreconditionError(
      `sandbox ${id} is ${what} and ${op} needs RUNNING: a read-role caller does not resume a sandbox; ResumeSandbox it, or call with an admin-role token (which auto-resumes it)`,
    );
  }

  /** wakeForIngress: ensureRunning for an ingress request, its answer as HTTP (409: auto_resume off; 503: not up within the bound, or the resume failed). */
  async wakeForIngress(id: string): Promise<IngressWake> {
    const leave = this.enter(id);
    try {
      await this.ensureRunning(id, 'an ingress request');
      return { ok: true };
    } catch (err) {
      if (err instanceof FailedPreconditionError) return { ok: false, status: 409, reason: err.message };
      return { ok: false, status: 503, reason: (err as Error).message, retryAfterS: Math.ceil(AUTO_RESUME_RETRY_AFTER_MS / 1000) };
    } finally {
      leave();
    }
  }

  /**
   * tick runs the idle actions that are due (the reaper calls it every reaperIntervalMs) and
   * flushes the activity. A sandbox with a call in flight, an auto-resume or an operation
   * running is skipped until the next tick. Returns what was done.
   */
  async tick(): Promise<{ sandboxId: string; action: IdleAction }[]> {
    this.flush();
    // a handover holds the gate: the next server acts on the same record times
    if (!this.c.gate.isOpen) return [];
    const done: { sandboxId: string; action: IdleAction }[] = [];
    const now = this.c.now();
    for (const r of this.c.store.list()) {
      if (!r.idle) continue;
      const due = nextIdleAction(r, this.lastActivityMs(r), now);
      if (!due || due.atMs > now) continue;
      const id = r.sandboxId;
      if (this.c.locks.busy(id) || this.inflight.has(id) || this.resuming.has(id) || this.acting.has(id)) continue;
      const p = this.c.gated(id, () => this.act(id));
      // set before any await: an auto-resume that comes now waits for this action
      this.acting.set(id, p);
      try {
        const action = await p;
        if (action) done.push({ sandboxId: id, action });
      } catch (err) {
        this.c.log.warn({ sandbox_id: id, err, action: due.action }, 'idle action failed; will try again');
      } finally {
        this.acting.delete(id);
      }
    }
    return done;
  }

  /** act does the due idle action of id under its lock (re-checked: still due, nothing in flight). */
  private async act(id: string): Promise<IdleAction | undefined> {
    const rec = this.c.store.get(id);
    if (!rec?.idle || this.inflight.has(id)) return undefined;
    const due = nextIdleAction(rec, this.lastActivityMs(rec), this.c.now());
    if (!due || due.atMs > this.c.now()) return undefined;
    const log = this.c.log.child({ sandbox_id: id });
    if (due.action !== 'delete' && rec.state === 'RUNNING') {
      const bulk = await this.bulkState(rec);
      if (bulk === 'ended') this.activity(id);
      if (bulk !== 'none') {
        log.debug({ action: due.action, bulk }, 'idle: a bulk transfer runs (or just ended) in the sandbox; the action waits');
        return undefined;
      }
    }
    const vmId = rec.vm?.vmId ?? id;
    switch (due.action) {
      case 'pause':
        await this.c.vms.pause(vmId);
        transition(rec, 'PAUSED');
        this.c.touch(rec);
        break;
      case 'hibernate':
        if (rec.state === 'RUNNING') await this.c.vms.pause(vmId);
        // processes stopped, disks kept, network slot reserved for it: it resumes on the same address
        await stopVmKeepingSlot(this.c.vms, rec);
        this.c.podd.forget(rec.poddAddress);
        transition(rec, 'DRAINED');
        rec.resumeMethod = COLD_START;
        rec.idle.hibernatedAtMs = this.c.now();
        this.c.touch(rec);
        break;
      case 'delete':
        await teardown(this.c, rec);
        this.forget(id);
        break;
    }
    log.info(
      { action: due.action, due_at_ms: due.atMs, last_activity_ms: this.lastActivityMs(rec) },
      `idle: sandbox ${due.action === 'delete' ? 'deleted (paused_ttl_s)' : due.action === 'pause' ? 'paused' : 'hibernated'}`,
    );
    return due.action;
  }
}

/** bounded waits for p at most ms (then rejects with timeout()), or until signal aborts (its reason); p runs on. */
function bounded(p: Promise<void>, ms: number, signal: AbortSignal | undefined, timeout: () => Error): Promise<void> {
  signal?.throwIfAborted();
  return new Promise<void>((resolve, reject) => {
    const done = () => {
      clearTimeout(t);
      signal?.removeEventListener('abort', onAbort);
    };
    const onAbort = () => {
      done();
      reject(signal?.reason as Error);
    };
    const t = setTimeout(() => {
      done();
      reject(timeout());
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
    p.then(
      () => {
        done();
        resolve();
      },
      (e: unknown) => {
        done();
        reject(e as Error);
      },
    );
  });
}
