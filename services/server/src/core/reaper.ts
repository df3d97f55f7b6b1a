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
import type { SandboxRecord, SandboxState } from './types';

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
      rec.errorMessage = livenessError(rec.vm.pid);
      c.touch(rec);
      c.podd.forget(rec.poddAddress);
      marked.push(rec.sandboxId);
      c.log.error({ sandbox_id: rec.sandboxId, vm_pid: rec.vm.pid }, 'sandbox VM process is gone: marked ERROR');
    });
  }
  if (unknown.length) c.log.warn({ sandbox_ids: unknown }, 'liveness: /proc could not be read for these VMs (out of file descriptors?); left as they are until it can');
  return marked;
}

/** livenessError is the errorMessage checkLiveness writes (servers before this one wrote the same text). */
export function livenessError(pid: number): string {
  return `its VM process (pid ${pid}) is gone`;
}

/** LIVENESS_ERROR_RE matches exactly a {@link livenessError} message; group 1 is the pid. */
const LIVENESS_ERROR_RE = /^its VM process \(pid (\d+)\) is gone$/;

/** What {@link recoverLiveness} did: the ids brought back, and the ids it kept ERROR with why. */
export interface LivenessRecovery {
  recovered: string[];
  kept: { sandboxId: string; reason: string }[];
}

/**
 * recoverLiveness brings back ERROR records that checkLiveness (or an older server, which took
 * a failed /proc read for "gone": attacker finding, descriptor exhaustion) marked while their VM
 * still ran. Only a record whose errorMessage is exactly the liveness one for its own VM pid is
 * considered, and only when all hold: /proc shows that pid with the record's start ticks alive
 * (`unknown` decides nothing), the vmm-supervisor's GetVm names the same VM with the same pid and
 * start ticks RUNNING or PAUSED, and every device of the record is attached at its path. Then the
 * record follows the VM (RUNNING or PAUSED) and its error is cleared. A record that fails a check
 * after the /proc one stays ERROR and its errorMessage says why it was not recovered (so it is
 * asked about once, not every round). A sandbox torn down is never in ERROR (DELETING, then
 * gone), and other errors (adoption's "its VM is gone", a device lost) are never undone.
 */
export async function recoverLiveness(c: CoreContext): Promise<LivenessRecovery> {
  const out: LivenessRecovery = { recovered: [], kept: [] };
  const candidate = (r: SandboxRecord): r is SandboxRecord & { vm: NonNullable<SandboxRecord['vm']> } => {
    if (r.state !== 'ERROR' || !r.vm) return false;
    const m = LIVENESS_ERROR_RE.exec(r.errorMessage);
    return m !== null && Number(m[1]) === r.vm.pid && processLiveness(r.vm.pid, r.vm.startTimeTicks) === 'alive';
  };
  for (const r of c.store.list()) {
    if (c.locks.busy(r.sandboxId) || !candidate(r)) continue;
    await c.locks
      .run(r.sandboxId, async () => {
        const rec = c.store.get(r.sandboxId);
        if (!rec || !candidate(rec)) return;
        const why = await whyNotRecoverable(c, rec);
        if (why) {
          rec.errorMessage = `${rec.errorMessage}; its process runs again but it was not recovered: ${why}`.slice(0, 1000);
          c.touch(rec);
          out.kept.push({ sandboxId: rec.sandboxId, reason: why });
          c.log.warn({ sandbox_id: rec.sandboxId, reason: why }, 'liveness recovery: the VM process runs, but the sandbox stays ERROR');
          return;
        }
        const vm = (await c.vms.get(rec.vm.vmId))!;
        transition(rec, vm.state as 'RUNNING' | 'PAUSED');
        rec.errorMessage = '';
        c.touch(rec);
        out.recovered.push(rec.sandboxId);
        c.log.warn({ sandbox_id: rec.sandboxId, vm_pid: rec.vm.pid, state: rec.state }, 'liveness recovery: the VM was wrongly taken for gone (a /proc read that failed); back to its state');
      })
      .catch((err: unknown) => c.log.warn({ sandbox_id: r.sandboxId, err }, 'liveness recovery failed; will try again'));
  }
  return out;
}

/** whyNotRecoverable: '' when rec's VM and devices are all there (see recoverLiveness), else what is not. Peer errors are thrown (tried again next round). */
async function whyNotRecoverable(c: CoreContext, rec: SandboxRecord & { vm: NonNullable<SandboxRecord['vm']> }): Promise<string> {
  const vm = await c.vms.get(rec.vm.vmId);
  if (!vm) return `the vmm-supervisor has no VM ${rec.vm.vmId}`;
  if (vm.pid !== rec.vm.pid || vm.startTimeTicks !== rec.vm.startTimeTicks) return `the vmm-supervisor's VM ${rec.vm.vmId} is another process (pid ${vm.pid})`;
  if (vm.state !== 'RUNNING' && vm.state !== 'PAUSED') return `its VM is ${vm.state}`;
  if (rec.devices.length) {
    const devices = new Map((await c.devices.list()).map((x) => [x.deviceId, x]));
    for (const dev of rec.devices) {
      const live = devices.get(dev.deviceId);
      if (!live?.attached) return `device ${dev.deviceId} is gone`;
      if (live.path !== dev.path) return `device ${dev.deviceId} is at ${live.path}, the record names ${dev.path}`;
    }
  }
  return '';
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
