/**
 * The reaper's checks (the server runs them every reaperIntervalMs): records whose VM died are
 * marked ERROR, teardowns a peer outage interrupted are retried, and sandboxes whose lifetime
 * passed are listed for deletion. Each takes the sandbox's lock and re-reads the record under
 * it; a sandbox with an operation running or waiting is skipped until the next round.
 */
import { processLiveness, type Liveness } from '@sandnode/shared';
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

/**
 * checkLiveness marks ERROR every RUNNING or PAUSED sandbox whose VM process is gone (pid +
 * start ticks no longer match, or a zombie), so that the API does not report a dead sandbox
 * as running. Cheap: reads /proc only. A VM whose /proc entry cannot be read (processLiveness
 * `unknown`: the server is out of file descriptors, say) is left as it is until a round that
 * can tell; it is logged, once per round. Returns the ids marked.
 */
export async function checkLiveness(c: CoreContext): Promise<string[]> {
  const marked: string[] = [];
  const unknown: string[] = [];
  const liveness = (vm: { pid: number; startTimeTicks: number }, id: string): Liveness => {
    const l = processLiveness(vm.pid, vm.startTimeTicks);
    if (l === 'unknown' && !unknown.includes(id)) unknown.push(id);
    return l;
  };
  for (const r of c.store.list()) {
    if (!isLive(r) || !r.vm || c.locks.busy(r.sandboxId)) continue;
    if (liveness(r.vm, r.sandboxId) !== 'gone') continue;
    await c.locks.run(r.sandboxId, async () => {
      const rec = c.store.get(r.sandboxId);
      if (!rec?.vm || !isLive(rec) || liveness(rec.vm, rec.sandboxId) !== 'gone') return;
      transition(rec, 'ERROR');
      rec.errorMessage = `its VM process (pid ${rec.vm.pid}) is gone`;
      c.touch(rec);
      c.podd.forget(rec.poddAddress);
      marked.push(rec.sandboxId);
      c.log.error({ sandbox_id: rec.sandboxId, pid: rec.vm.pid }, 'sandbox VM process is gone: marked ERROR');
    });
  }
  if (unknown.length) c.log.warn({ sandbox_ids: unknown }, 'liveness: /proc could not be read for these VMs (out of file descriptors?); left as they are until it can');
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
