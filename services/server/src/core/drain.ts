/**
 * Drain (pod deletion, node shutdown; ARCHITECTURE.md section 4): pause and persist every live
 * sandbox with bounded concurrency, then stop the device manager gracefully, all inside the
 * deadline; report what was preserved and what was not, never silently lose one.
 *
 * Persisted, on the runc driver: the sandbox's processes are stopped after a freeze, its
 * filesystems unmounted (flushed) by the supervisor, its devices stay as images (the device
 * manager re-attaches them when it starts again), and the record says DRAINED with resume
 * method "cold-start": ResumeSandbox boots it again on the same disks (same id, metadata and
 * /workspace; a new pid). CRIU checkpoints are not used: criu is not installed by default.
 *
 * Bounds, all inside the deadline (a sandbox whose process does not die on SIGKILL, e.g. one
 * blocked in D state on a frozen filesystem, must not hold the drain or the device manager):
 *   deadline = t0 + deadlineMs
 *   component reserve R = deadlineMs / 5, at least 50 ms, at most 2 s: kept for the device manager
 *   sandboxes are started while the phase end (deadline - R) is more than the slowest sandbox so far
 *     (DRAIN_SANDBOX_ESTIMATE_MS before the first ends) away; each is waited for until
 *     min(its start + sandboxTimeoutMs, deadline - R), then reported FAILED naming the step it was in
 *     (lock, freeze, stop, record); it goes on in the background and its record says how it ended
 *     (a freeze that ends after the report is undone, so "keeps running" stays true)
 *   device manager: its pid asked, SIGTERM, its exit waited for; SIGKILL after TERM_GRACE_MS or 100 ms
 *     before the deadline, whichever is first (a call or a client's stream can hold its graceful
 *     stop), its exit waited for
 *
 * The defaults (DEFAULT_DRAIN_DEADLINE_MS, DEFAULT_DRAIN_CONCURRENCY) live in @sandnode/shared,
 * so the AdminService handler, the SIGTERM drain and the CLI agree on them.
 */
import { AbortedError, DEFAULT_DRAIN_CONCURRENCY, DEFAULT_DRAIN_DEADLINE_MS, isCode, mapLimit, processLiveness, processStartTicks, Status, type Logger } from '@sandnode/shared';
import { stopVmKeepingSlot } from './network';
import type { CoreContext } from './context';
import { isLive, transition } from './transitions';
import { COLD_START, type RecordStore } from './types';

export { DEFAULT_DRAIN_CONCURRENCY, DEFAULT_DRAIN_DEADLINE_MS } from '@sandnode/shared';

/** Default of the longest one sandbox's drain (lock, freeze, stop, record) is waited for, ms. */
export const DEFAULT_DRAIN_SANDBOX_TIMEOUT_MS = 5_000;
/** What a sandbox's drain is assumed to take before one has ended, ms: none is started with less time left. */
export const DRAIN_SANDBOX_ESTIMATE_MS = 250;
/** Share of the deadline kept for stopping the device manager, and its floor and cap, ms. */
const RESERVE_SHARE = 0.2;
const RESERVE_MIN_MS = 50;
const RESERVE_MAX_MS = 2_000;
/** How often the device manager's exit is checked after SIGTERM, ms. */
const EXIT_POLL_MS = 10;
/** How long before the deadline a device manager that ignored SIGTERM gets SIGKILL, ms (at most half the time left). */
const KILL_MARGIN_MS = 100;
/** Longest a device manager gets to exit on SIGTERM before SIGKILL, however long the deadline, ms. */
export const TERM_GRACE_MS = 2_000;

/** How one sandbox came out of a drain. */
export interface DrainedSandbox {
  sandboxId: string;
  /** preserved: DRAINED on its disks; failed: not preserved (error says at which step and why, and what it is left as) */
  outcome: 'preserved' | 'failed';
  /** "cold-start" when preserved; else "" */
  resumeMethod: string;
  error: string;
  ms: number;
}

/** DrainReport is what a drain did (AdminService.Drain's answer, before conversion). */
export interface DrainReport {
  sandboxes: DrainedSandbox[];
  durationMs: number;
  /** the ublk-manager exited within the deadline (or was not running) */
  deviceManagerStopped: boolean;
  /** why the device manager was not stopped, or that it had to be killed (SIGKILL); "" when SIGTERM stopped it */
  deviceManagerError: string;
}

/**
 * DeviceManagerProcess: how a drain finds the ublk-manager's pid: its GetVersion answer,
 * asked again after reset() (the DevicePeer's `features`). get() rejects UNAVAILABLE when the
 * ublk-manager is not running.
 */
export interface DeviceManagerProcess {
  features: { reset(): void; get(): Promise<{ pid: number }> };
}

/** The step a sandbox's drain is in, and whether the drain gave up waiting for it. */
export interface DrainProgress {
  step: 'lock' | 'freeze' | 'stop' | 'record' | 'done';
  /** set by drainNode when the sandbox's bound passed: drainOne then starts no further step */
  abandoned: boolean;
}

export interface DrainDeps {
  manager: { drainOne(id: string, progress?: DrainProgress): Promise<void> };
  store: RecordStore;
  devices: DeviceManagerProcess;
  log: Logger;
  /** time for the whole drain, ms; 0 or absent: DEFAULT_DRAIN_DEADLINE_MS */
  deadlineMs?: number;
  /** sandboxes drained at once; 0 or absent: DEFAULT_DRAIN_CONCURRENCY */
  concurrency?: number;
  /** longest one sandbox is waited for, ms (capped by the deadline); 0 or absent: DEFAULT_DRAIN_SANDBOX_TIMEOUT_MS */
  sandboxTimeoutMs?: number;
  /**
   * signal: the caller went away. Like the deadline, no further sandbox is started (those
   * started are waited for within their bound) and the device manager is not stopped.
   */
  signal?: AbortSignal;
  /** signals a pid (process.kill; tests pass their own) */
  kill?: (pid: number, sig: NodeJS.Signals) => void;
  /** progress (AdminService.DrainStream): told how many sandboxes it drains, before the first starts (a throw is logged, never stops the drain) */
  onStart?: (start: { sandboxes: number; deadlineMs: number; concurrency: number }) => void;
  /** progress: told each sandbox's outcome as soon as it is known, in the order they end (a throw is logged) */
  onSandbox?: (s: DrainedSandbox) => void;
}

/** tell calls a progress callback; a throw is logged and never stops the drain. */
function tell<T>(d: DrainDeps, f: ((x: T) => void) | undefined, x: T): void {
  try {
    f?.(x);
  } catch (err) {
    d.log.warn({ err }, 'drain: a progress listener threw; the drain goes on');
  }
}

/** What each step of drainOne does, for a report of a sandbox that did not finish. */
const STEP_TEXT: Record<DrainProgress['step'], string> = {
  lock: 'waiting for another operation on it to end',
  freeze: 'freeze (PauseVm)',
  stop: 'stop (SIGKILL, unmount; DeleteVm)',
  record: 'record DRAINED',
  done: 'done',
};

/** What a sandbox left behind at each step is, and where it goes from there. */
const STEP_AFTER: Record<DrainProgress['step'], string> = {
  lock: 'nothing was done to it; it keeps running',
  freeze: 'it keeps running (a freeze that ends later is undone)',
  stop: 'a process of it does not die on SIGKILL (D state: blocked on a frozen filesystem or a hung device?); its processes were sent SIGKILL, its disks are kept, the stop goes on in the background and `sandnode sandbox get` shows how it ended',
  record: 'its VM is stopped and its disks are kept; the record is written in the background',
  done: '',
};

/**
 * drainOne persists a live sandbox for a node drain: freeze, stop its VM (its filesystems are
 * unmounted, so flushed; its devices stay; its network slot stays reserved for it), record
 * DRAINED with resume method "cold-start".
 * progress (optional) says the step it is in; once progress.abandoned is set no further step
 * starts, and a freeze that ended after it is undone (the VM resumed). Errors: NOT_FOUND,
 * FAILED_PRECONDITION (not RUNNING or PAUSED), ABORTED (abandoned), and the peers'.
 */
export function drainOne(c: CoreContext, id: string, progress: DrainProgress = { step: 'lock', abandoned: false }): Promise<void> {
  return c.locks.run(id, async () => {
    if (progress.abandoned) throw new AbortedError(`drain of ${id} abandoned before it started`);
    const rec = c.requireState(id, 'Drain');
    const vmId = rec.vm?.vmId ?? id;
    if (rec.state === 'RUNNING') {
      progress.step = 'freeze';
      await c.vms.pause(vmId);
      if (progress.abandoned) {
        // the report said it keeps running: make it so
        await c.vms.resume(vmId).catch((err: unknown) => c.log.warn({ sandbox_id: id, err }, 'drain: could not undo the freeze of an abandoned sandbox'));
        throw new AbortedError(`drain of ${id} abandoned after its freeze; it was resumed`);
      }
    }
    progress.step = 'stop';
    // a networked sandbox keeps its slot (reserved for it, forwarding off): it resumes on the same address
    await stopVmKeepingSlot(c.vms, rec);
    progress.step = 'record';
    c.podd.forget(rec.poddAddress);
    transition(rec, 'DRAINED');
    rec.resumeMethod = COLD_START;
    c.touch(rec);
    progress.step = 'done';
    if (progress.abandoned) c.log.info({ sandbox_id: id }, 'drain: sandbox reported not preserved was drained after the report');
  });
}

/** reserveMs is the time kept at the end of a drain of deadlineMs for the device manager, ms. */
export function reserveMs(deadlineMs: number): number {
  return Math.min(RESERVE_MAX_MS, Math.max(RESERVE_MIN_MS, Math.round(deadlineMs * RESERVE_SHARE)));
}

/** failed is the report of a sandbox that was not preserved. */
function failed(sandboxId: string, error: string, ms = 0): DrainedSandbox {
  return { sandboxId, outcome: 'failed', resumeMethod: '', error, ms };
}

/** drainNode drains every RUNNING or PAUSED sandbox, then stops the ublk-manager; see the file header for the bounds. */
export async function drainNode(d: DrainDeps): Promise<DrainReport> {
  const deadlineMs = d.deadlineMs || DEFAULT_DRAIN_DEADLINE_MS;
  const concurrency = d.concurrency || DEFAULT_DRAIN_CONCURRENCY;
  const sandboxTimeoutMs = d.sandboxTimeoutMs || DEFAULT_DRAIN_SANDBOX_TIMEOUT_MS;
  const t0 = Date.now();
  const deadline = t0 + deadlineMs;
  const phaseEnd = deadline - reserveMs(deadlineMs);
  let slowestMs = 0;
  const ids = d.store
    .list()
    .filter(isLive)
    .map((r) => r.sandboxId);
  /** drainWithin drains one sandbox within its bound (see the file header) and says how it came out. */
  async function drainWithin(id: string): Promise<DrainedSandbox> {
    const s0 = Date.now();
    // started only while it can end before the phase end (as the slowest so far did)
    if (phaseEnd - s0 <= (slowestMs || DRAIN_SANDBOX_ESTIMATE_MS)) return failed(id, `not reached before the drain deadline (${deadlineMs} ms); it keeps running`);
    if (d.signal?.aborted) return failed(id, 'not reached before the drain was cancelled by its caller; it keeps running');
    const progress: DrainProgress = { step: 'lock', abandoned: false };
    const boundMs = Math.min(sandboxTimeoutMs, phaseEnd - s0);
    let timer: NodeJS.Timeout | undefined;
    const work = d.manager.drainOne(id, progress).then(
      () => undefined,
      (err: unknown) => err as Error,
    );
    const bound = new Promise<'bound'>((r) => (timer = setTimeout(() => r('bound'), boundMs)));
    const r = await Promise.race([work, bound]);
    clearTimeout(timer);
    const ms = Date.now() - s0;
    if (r === 'bound') {
      progress.abandoned = true;
      const step = progress.step;
      d.log.warn({ sandbox_id: id, step, bound_ms: boundMs }, 'drain: sandbox did not finish within its bound; not preserved');
      void work.then((err) => err && d.log.warn({ sandbox_id: id, err }, 'drain: abandoned sandbox ended with an error'));
      return failed(id, `step ${STEP_TEXT[step]} did not finish within ${boundMs} ms: ${STEP_AFTER[step]}`, ms);
    }
    slowestMs = Math.max(slowestMs, ms);
    if (r === undefined) return { sandboxId: id, outcome: 'preserved', resumeMethod: COLD_START, error: '', ms };
    d.log.warn({ sandbox_id: id, err: r, step: progress.step }, 'drain: sandbox not preserved');
    return failed(id, `step ${STEP_TEXT[progress.step]} failed: ${r.message}`, ms);
  }
  tell(d, d.onStart, { sandboxes: ids.length, deadlineMs, concurrency });
  const results = await mapLimit(ids, Math.max(1, concurrency), async (id): Promise<DrainedSandbox> => {
    const s = await drainWithin(id);
    tell(d, d.onSandbox, s);
    return s;
  });
  let stop = { stopped: false, error: 'the drain was cancelled by its caller: the device manager is not stopped' };
  if (d.signal?.aborted) d.log.warn('drain cancelled by its caller: the device manager is not stopped');
  else stop = await stopDeviceManager(d, deadline);
  const out: DrainReport = { sandboxes: results, durationMs: Date.now() - t0, deviceManagerStopped: stop.stopped, deviceManagerError: stop.error };
  const notPreserved = results.filter((r) => r.outcome !== 'preserved');
  d.log.info(
    { preserved: results.length - notPreserved.length, failed: notPreserved.length, not_preserved: notPreserved.map((r) => r.sandboxId), device_manager_stopped: stop.stopped, ms: out.durationMs },
    'drain finished',
  );
  return out;
}

/** withBound resolves with p's value, or with undefined once the epoch-ms deadline has passed. */
async function withBound<T>(p: Promise<T>, deadline: number): Promise<T | undefined> {
  let timer: NodeJS.Timeout | undefined;
  const t = new Promise<undefined>((r) => (timer = setTimeout(() => r(undefined), Math.max(0, deadline - Date.now()))));
  try {
    return await Promise.race([p, t]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * stopDeviceManager asks the ublk-manager's pid, sends it SIGTERM and waits for it to exit, then
 * SIGKILL shortly before the deadline (epoch ms). stopped is true when it exited (or was not
 * running); error says which step did not finish in time or failed, or that it had to be killed.
 */
async function stopDeviceManager(d: DrainDeps, deadline: number): Promise<{ stopped: boolean; error: string }> {
  const kill = d.kill ?? ((pid: number, sig: NodeJS.Signals) => process.kill(pid, sig));
  let pid: number;
  try {
    // Ask now: the cached GetVersion answer may name a device manager that has been restarted
    // since (then its pid is gone, or worse, another process's).
    d.devices.features.reset();
    const v = await withBound(d.devices.features.get(), deadline);
    if (!v) return { stopped: false, error: 'the device manager did not say its pid before the drain deadline; it keeps running' };
    pid = v.pid;
  } catch (err) {
    // not running: nothing to stop (a second drain, or it was stopped already)
    if (isCode(err, Status.UNAVAILABLE)) return { stopped: true, error: '' };
    d.log.warn({ err }, 'drain: could not stop the device manager');
    return { stopped: false, error: `could not ask the device manager its pid: ${(err as Error).message}` };
  }
  if (pid <= 0) return { stopped: false, error: 'the device manager did not say its pid' };
  if (Date.now() >= deadline) return { stopped: false, error: 'no time left before the drain deadline; the device manager keeps running' };
  const ticks = processStartTicks(pid);
  // processLiveness(pid, -1) reads /proc once more only to tell "no such process" from "could not read"
  if (ticks === undefined && processLiveness(pid, -1) === 'unknown')
    return { stopped: false, error: `could not read /proc/${pid}/stat of the device manager (out of file descriptors?); it keeps running` };
  // a /proc read that fails for another reason than "no such process" is not an exit: the
  // server short of descriptors (a sandbox flooding the egress proxy) must not report a device
  // manager that still runs as stopped
  let unreadable = false;
  const alive = () => {
    if (ticks === undefined) return false;
    const l = processLiveness(pid, ticks);
    unreadable = l === 'unknown';
    return l !== 'gone';
  };
  const why = () => (unreadable ? ` (its /proc/${pid}/stat could not be read: out of file descriptors?)` : '');
  // SIGTERM first; a stop that a call or an idle client connection holds (its graceful stop
  // waits for them) gets SIGKILL shortly before the deadline: the ublk-manager survives kill -9
  // by design (devices stay attached; the next one adopts its table)
  const killAt = Math.min(Date.now() + TERM_GRACE_MS, deadline - Math.min(KILL_MARGIN_MS, Math.floor((deadline - Date.now()) / 2)));
  try {
    kill(pid, 'SIGTERM');
  } catch (err) {
    return { stopped: false, error: `SIGTERM to the device manager (pid ${pid}) failed: ${(err as Error).message}` };
  }
  const t0 = Date.now();
  while (alive() && Date.now() < killAt) await new Promise((r) => setTimeout(r, EXIT_POLL_MS));
  if (!alive()) return { stopped: true, error: '' };
  const termMs = Date.now() - t0;
  d.log.warn({ device_manager_pid: pid, term_ms: termMs }, 'drain: the device manager did not exit on SIGTERM in time; SIGKILL');
  try {
    kill(pid, 'SIGKILL');
  } catch (err) {
    return { stopped: false, error: `the device manager (pid ${pid}) did not exit within ${termMs} ms of SIGTERM and SIGKILL failed: ${(err as Error).message}` };
  }
  while (alive()) {
    if (Date.now() >= deadline) return { stopped: false, error: `the device manager (pid ${pid}) got SIGTERM, then SIGKILL, and did not exit before the drain deadline${why()}` };
    await new Promise((r) => setTimeout(r, EXIT_POLL_MS));
  }
  return {
    stopped: true,
    error: `the device manager (pid ${pid}) did not exit within ${termMs} ms of SIGTERM (a call or client connection held its graceful stop) and was killed (SIGKILL); its devices stay attached`,
  };
}
