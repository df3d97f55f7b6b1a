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
 */
import { isCode, mapLimit, Status, type Logger } from '@sandnode/shared';
import { DrainOutcome, type DrainResponse } from '@sandnode/shared/proto/server/v1/admin';
import type { DevicePeer } from '../peers/device-peer';
import type { SandboxManager } from './sandbox-manager';
import type { RecordStore } from './types';

export async function drainNode(d: { manager: SandboxManager; store: RecordStore; devices: DevicePeer; log: Logger; deadlineMs: number; concurrency: number }): Promise<DrainResponse> {
  const t0 = Date.now();
  const deadline = t0 + d.deadlineMs;
  const ids = d.store
    .list()
    .filter((r) => r.state === 'RUNNING' || r.state === 'PAUSED')
    .map((r) => r.sandboxId);
  // A sandbox is started only while time is left; one that was started is waited for and
  // reported as it ended (a freeze + stop takes well under a second), so the report never
  // says FAILED for a sandbox that ends up drained, or PRESERVED for one that does not.
  const results = await mapLimit(ids, Math.max(1, d.concurrency), async (id) => {
    const s0 = Date.now();
    if (deadline - Date.now() <= 0) return { sandboxId: id, outcome: DrainOutcome.DRAIN_OUTCOME_FAILED, resumeMethod: '', error: `not reached before the drain deadline (${d.deadlineMs} ms); it keeps running`, ms: 0 };
    try {
      await d.manager.drainOne(id);
      return { sandboxId: id, outcome: DrainOutcome.DRAIN_OUTCOME_PRESERVED, resumeMethod: 'cold-start', error: '', ms: Date.now() - s0 };
    } catch (err) {
      return { sandboxId: id, outcome: DrainOutcome.DRAIN_OUTCOME_FAILED, resumeMethod: '', error: (err as Error).message, ms: Date.now() - s0 };
    }
  });
  let stopped = false;
  try {
    // Ask now: the cached GetVersion answer may name a device manager that has been restarted
    // since (then its pid is gone, or worse, another process's).
    d.devices.features.reset();
    const v = await d.devices.features.get();
    if (v.pid > 0 && Date.now() < deadline) {
      process.kill(v.pid, 'SIGTERM');
      stopped = true;
    }
  } catch (err) {
    if (isCode(err, Status.UNAVAILABLE)) {
      stopped = true; // not running: nothing to stop (a second drain, or it was stopped already)
    } else {
      d.log.warn({ err: (err as Error).message }, 'drain: could not stop the device manager');
    }
  }
  const out: DrainResponse = { sandboxes: results, durationMs: Date.now() - t0, deviceManagerStopped: stopped };
  d.log.info({ preserved: results.filter((r) => r.outcome === DrainOutcome.DRAIN_OUTCOME_PRESERVED).length, failed: results.filter((r) => r.outcome !== DrainOutcome.DRAIN_OUTCOME_PRESERVED).length, ms: out.durationMs }, 'drain finished');
  return out;
}
