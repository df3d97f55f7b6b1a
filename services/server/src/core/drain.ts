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
 * The defaults (DEFAULT_DRAIN_DEADLINE_MS, DEFAULT_DRAIN_CONCURRENCY) live in @sandnode/shared,
 * so the AdminService handler, the SIGTERM drain and the CLI agree on them.
 */
import { DEFAULT_DRAIN_CONCURRENCY, DEFAULT_DRAIN_DEADLINE_MS, isCode, mapLimit, Status, type Logger } from '@sandnode/shared';
import type { CoreContext } from './context';
import { isLive, transition } from './transitions';
import { COLD_START, type RecordStore } from './types';

export { DEFAULT_DRAIN_CONCURRENCY, DEFAULT_DRAIN_DEADLINE_MS } from '@sandnode/shared';

/** How one sandbox came out of a drain. */
export interface DrainedSandbox {
  sandboxId: string;
  /** preserved: DRAINED on its disks; failed: it keeps running (error says why) */
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
  /** the ublk-manager got SIGTERM (or was not running) */
  deviceManagerStopped: boolean;
}

/**
 * DeviceManagerProcess: how a drain finds the ublk-manager's pid: its GetVersion answer,
 * asked again after reset() (the DevicePeer's `features`). get() rejects UNAVAILABLE when the
 * ublk-manager is not running.
 */
export interface DeviceManagerProcess {
  features: { reset(): void; get(): Promise<{ pid: number }> };
}

export interface DrainDeps {
  manager: { drainOne(id: string): Promise<void> };
  store: RecordStore;
  devices: DeviceManagerProcess;
  log: Logger;
  /** time for the whole drain, ms; 0 or absent: DEFAULT_DRAIN_DEADLINE_MS */
  deadlineMs?: number;
  /** sandboxes drained at once; 0 or absent: DEFAULT_DRAIN_CONCURRENCY */
  concurrency?: number;
  /**
   * signal: the caller went away. Like the deadline, no further sandbox is started (those
   * started are waited for) and the device manager is not stopped.
   */
  signal?: AbortSignal;
}

/**
 * drainOne persists a live sandbox for a node drain: freeze, stop its VM (its filesystems are
 * unmounted, so flushed; its devices stay), record DRAINED with resume method "cold-start".
 * Errors: NOT_FOUND, FAILED_PRECONDITION (not RUNNING or PAUSED), and the peers'.
 */
export function drainOne(c: CoreContext, id: string): Promise<void> {
  return c.locks.run(id, async () => {
    const rec = c.requireState(id, 'Drain');
    const vmId = rec.vm?.vmId ?? id;
    if (rec.state === 'RUNNING') await c.vms.pause(vmId);
    await c.vms.delete(vmId);
    c.podd.forget(rec.poddAddress);
    transition(rec, 'DRAINED');
    rec.resumeMethod = COLD_START;
    c.touch(rec);
  });
}

/** drainNode drains every RUNNING or PAUSED sandbox, then stops the ublk-manager; see the file header. */
export async function drainNode(d: DrainDeps): Promise<DrainReport> {
  const deadlineMs = d.deadlineMs || DEFAULT_DRAIN_DEADLINE_MS;
  const concurrency = d.concurrency || DEFAULT_DRAIN_CONCURRENCY;
  const t0 = Date.now();
  const deadline = t0 + deadlineMs;
  const ids = d.store
    .list()
    .filter(isLive)
    .map((r) => r.sandboxId);
  // A sandbox is started only while time is left; one that was started is waited for and
  // reported as it ended (a freeze + stop takes well under a second), so the report never
  // says FAILED for a sandbox that ends up drained, or PRESERVED for one that does not.
  const results = await mapLimit(ids, Math.max(1, concurrency), async (id): Promise<DrainedSandbox> => {
    const s0 = Date.now();
    if (deadline - Date.now() <= 0) return { sandboxId: id, outcome: 'failed', resumeMethod: '', error: `not reached before the drain deadline (${deadlineMs} ms); it keeps running`, ms: 0 };
    if (d.signal?.aborted) return { sandboxId: id, outcome: 'failed', resumeMethod: '', error: 'not reached before the drain was cancelled by its caller; it keeps running', ms: 0 };
    try {
      await d.manager.drainOne(id);
      return { sandboxId: id, outcome: 'preserved', resumeMethod: COLD_START, error: '', ms: Date.now() - s0 };
    } catch (err) {
      d.log.warn({ sandbox_id: id, err }, 'drain: sandbox not preserved');
      return { sandboxId: id, outcome: 'failed', resumeMethod: '', error: (err as Error).message, ms: Date.now() - s0 };
    }
  });
  let stopped = false;
  if (d.signal?.aborted) d.log.warn('drain cancelled by its caller: the device manager is not stopped');
  else stopped = await stopDeviceManager(d, deadline);
  const out: DrainReport = { sandboxes: results, durationMs: Date.now() - t0, deviceManagerStopped: stopped };
  d.log.info({ preserved: results.filter((r) => r.outcome === 'preserved').length, failed: results.filter((r) => r.outcome !== 'preserved').length, ms: out.durationMs }, 'drain finished');
  return out;
}

/**
 * stopDeviceManager sends the ublk-manager SIGTERM while the deadline (epoch ms) has not passed.
 * Returns whether it is stopped (true too when it is not running).
 */
async function stopDeviceManager(d: DrainDeps, deadline: number): Promise<boolean> {
  try {
    // Ask now: the cached GetVersion answer may name a device manager that has been restarted
    // since (then its pid is gone, or worse, another process's).
    d.devices.features.reset();
    const v = await d.devices.features.get();
    if (v.pid > 0 && Date.now() < deadline) {
      process.kill(v.pid, 'SIGTERM');
      return true;
    }
    return false;
  } catch (err) {
    // not running: nothing to stop (a second drain, or it was stopped already)
    if (isCode(err, Status.UNAVAILABLE)) return true;
    d.log.warn({ err }, 'drain: could not stop the device manager');
    return false;
  }
}
