/**
 * The reaper's checks (the server runs them every reaperIntervalMs): records whose VM died are
 * marked ERROR, teardowns a peer outage interrupted are retried, and sandboxes whose lifetime
 * passed are listed for deletion. Each takes the sandbox's lock and re-reads the record under
 * it; a sandbox with an operation running or waiting is skipped until the next round.
 */
import { isSameProcess, processState } from '@sandnode/shared';
import type { CoreContext } from './context';
import { teardown } from './provision';
import { isLive, transition } from './transitions';
import type { SandboxState } from './types';

/** How long a CREATING or DELETING record stays untouched before its teardown is retried, ms. */
export const DEFAULT_TEARDOWN_RETRY_AGE_MS = 2000;

/** The states whose sandboxes are deleted when their lifetime has passed. */
const EXPIRABLE: readonly SandboxState[] = ['RUNNING', 'PAUSED', 'ERROR', 'DRAINED'];
/** The states of an interrupted create or delete. */
const INTERRUPTED: readonly SandboxState[] = ['CREATING', 'DELETING'];

/** vmAlive: the process is the VM's (same start ticks) and not a zombie. */
function vmAlive(pid: number, ticks: number): boolean {
  return isSameProcess(pid, ticks) && processState(pid) !== 'Z';
}

/**
 * checkLiveness marks ERROR every RUNNING or PAUSED sandbox whose VM process is gone (pid +
 * start ticks no longer match, or a zombie), so that the API does not report a dead sandbox
 * as running. Cheap: reads /proc only. Returns the ids marked.
 */
export async function checkLiveness(c: CoreContext): Promise<string[]> {
  const marked: string[] = [];
  for (const r of c.store.list()) {
    if (!isLive(r) || !r.vm || c.locks.busy(r.sandboxId)) continue;
    if (vmAlive(r.vm.pid, r.vm.startTimeTicks)) continue;
    await c.locks.run(r.sandboxId, async () => {
      const rec = c.store.get(r.sandboxId);
      if (!rec?.vm || !isLive(rec) || vmAlive(rec.vm.pid, rec.vm.startTimeTicks)) return;
      transition(rec, 'ERROR');
      rec.errorMessage = `its VM process (pid ${rec.vm.pid}) is gone`;
      c.touch(rec);
      c.podd.forget(rec.poddAddress);
      marked.push(rec.sandboxId);
      c.log.error({ sandbox_id: rec.sandboxId, pid: rec.vm.pid }, 'sandbox VM process is gone: marked ERROR');
    });
  }
  return marked;
}

/**
 * retryTeardowns finishes sandboxes left DELETING (or CREATING) by a create or delete whose
 * teardown failed because a peer was unavailable: the teardown is tried again (it is
 * idempotent) for records untouched for at least minAgeMs. A CREATING record whose create is
 * still in flight is left alone. Returns the ids finished.
 */
export async function retryTeardowns(c: CoreContext, minAgeMs = DEFAULT_TEARDOWN_RETRY_AGE_MS): Promise<string[]> {
  const done: string[] = [];
  const now = c.now();
  for (const r of c.store.list()) {
    if (!INTERRUPTED.includes(r.state) || now - r.updatedAtMs < minAgeMs || c.locks.busy(r.sandboxId)) continue;
    if (r.state === 'CREATING' && c.requests.has(r.requestId)) continue;
    await c.locks
      .run(r.sandboxId, async () => {
        const rec = c.store.get(r.sandboxId);
        if (!rec || !INTERRUPTED.includes(rec.state) || c.now() - rec.updatedAtMs < minAgeMs) return;
        await teardown(c, rec);
        done.push(rec.sandboxId);
        c.log.info({ sandbox_id: rec.sandboxId }, 'finished an interrupted teardown');
      })
      .catch((err: unknown) => c.log.warn({ sandbox_id: r.sandboxId, err }, 'teardown retry failed; will try again'));
  }
  return done;
}

/** expired returns the ids whose lifetime has passed (RUNNING, PAUSED, ERROR or DRAINED). */
export function expired(c: CoreContext): string[] {
  const now = c.now();
  return c.store
    .list()
    .filter((r) => r.expiresAtMs > 0 && r.expiresAtMs <= now && EXPIRABLE.includes(r.state))
    .map((r) => r.sandboxId);
}
