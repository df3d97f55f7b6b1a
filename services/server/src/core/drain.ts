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
import { mapLimit, type Logger } from '@sandnode/shared';
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
  const results = await mapLimit(ids, Math.max(1, d.concurrency), async (id) => {
    const s0 = Date.now();
    const left = deadline - Date.now();
    if (left <= 0) return { sandboxId: id, outcome: DrainOutcome.DRAIN_OUTCOME_FAILED, resumeMethod: '', error: 'drain deadline passed before this sandbox was reached', ms: 0 };
    try {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        d.manager.drainOne(id),
        new Promise((_, reject) => (timer = setTimeout(() => reject(new Error(`drain deadline (${d.deadlineMs} ms) passed`)), left))),
      ]).finally(() => clearTimeout(timer));
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
    d.log.warn({ err: (err as Error).message }, 'drain: could not stop the device manager');
  }
  const out: DrainResponse = { sandboxes: results, durationMs: Date.now() - t0, deviceManagerStopped: stopped };
  d.log.info({ preserved: results.filter((r) => r.outcome === DrainOutcome.DRAIN_OUTCOME_PRESERVED).length, failed: results.filter((r) => r.outcome !== DrainOutcome.DRAIN_OUTCOME_PRESERVED).length, ms: out.durationMs }, 'drain finished');
  return out;
}
