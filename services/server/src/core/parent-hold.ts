/**
 * Holding a fork's parent still while its devices are cloned, so that the clones are one
 * point in time (see SandboxService.ForkSandbox):
 * - PAUSED parent: nothing to hold; the host's dirty pages are synced to its devices first.
 * - RUNNING parent whose podd lists "podd.quiesce": the supervisor arms the VM's freeze port
 *   for one freeze (ArmFreeze, when it lists "vmm.freeze-arm.v1": its ports refuse unarmed
 *   freezes), podd freezes its filesystems for at most max_freeze_ms, the clones run inside
 *   that window, the supervisor thaws (ThawVmFreeze, when it lists "vmm.host-thaw.v1"; else
 *   podd does), and the supervisor confirms that the freeze really held until the
 *   clones were done.
 * - otherwise (an older template's podd, or a freeze port that is not reachable): pause the
 *   VM, sync, clone, resume; the parent's record is marked (fork_paused_at_ms) meanwhile, so
 *   that adoption resumes it if this server dies before the resume.
 */
import { AbortedError, hasFeature, InternalError, isCode, MAX_FREEZE_MS, missingFeature, PODD_FEATURES, Status, type Logger } from '@sandnode/shared';
import type { CoreContext } from './context';
import type { PoddFreeze, SandboxRecord } from './types';

/**
 * How a fork held its parent: podd quiesce, pause (podd lacks podd.quiesce), nothing (parent
 * PAUSED), or "existing" (a repeated request_id: the first fork's child).
 */
export type ForkMethod = 'quiesce' | 'pause' | 'paused-parent' | 'existing';

/** What holding the parent cost. */
export interface ParentHold {
  method: ForkMethod;
  /** how long the parent was held (freeze window or pause), ms */
  parentHeldMs: number;
  /** the device clones, ms */
  cloneMs: number;
}

/**
 * CloneAll clones the parent's devices into the child and returns the time it took, ms;
 * deadlineMs bounds it (a frozen parent's remaining window).
 */
export type CloneAll = (deadlineMs?: number) => Promise<number>;

/**
 * syncHostMapped runs the host sync; a failure (the `sync` command's stderr) is logged and
 * becomes an INTERNAL that names no host detail.
 */
async function syncHostMapped(c: CoreContext, log: Logger): Promise<void> {
  try {
    await c.syncHost();
  } catch (err) {
    log.error({ err }, 'host sync before the clone failed');
    throw new InternalError('fork: syncing the host before the clone failed; the server log has the details');
  }
}

/**
 * holdParent holds parent (RUNNING or PAUSED, under its lock) while cloneAll runs, then
 * releases it. Throws AbortedError when the freeze ended before the clones finished (they may
 * be torn) or the clones did not finish within the window (their DEADLINE_EXCEEDED), with
 * advice (a larger max_freeze_ms, or fork it paused); any other clone error after the parent
 * was released.
 */
export async function holdParent(c: CoreContext, parent: SandboxRecord, maxFreezeMs: number, cloneAll: CloneAll, log: Logger): Promise<ParentHold> {
  const vmId = parent.vm?.vmId ?? parent.sandboxId;
  if (parent.state === 'PAUSED') {
    // a paused sandbox's last writes may still be dirty in the host's page cache, above its
    // devices: flush them, or the clones miss them
    await syncHostMapped(c, log);
    return { method: 'paused-parent', parentHeldMs: 0, cloneMs: await cloneAll() };
  }

  const podd = c.podd.connect(parent.poddAddress);
  const poddVersion = { component: 'podd', ...(await podd.version()) };
  if (!hasFeature(poddVersion, PODD_FEATURES.quiesce)) return pauseAndClone(c, parent, vmId, cloneAll, missingFeature(poddVersion, PODD_FEATURES.quiesce), log);
  // podd and its answers are the sandbox's: a freeze counts only if the supervisor can confirm
  // it afterwards (vmm.freeze-status.v1); without that, hold the parent by pausing it
  if ((await c.vms.freezeStatus(vmId)) === undefined) return pauseAndClone(c, parent, vmId, cloneAll, 'the vmm-supervisor cannot confirm a freeze (no vmm.freeze-status.v1)', log);

  // the freeze port lets in one freeze only while armed: arm it for this one
  const armed = (await c.vms.armFreeze?.(vmId, maxFreezeMs + ARM_MARGIN_MS)) ?? false;
  const tCall = c.now();
  let freeze: PoddFreeze;
  try {
    freeze = await podd.quiesce(maxFreezeMs);
  } catch (err) {
    // nothing was frozen by this fork: do not leave the port armed for the sandbox
    if (armed) await c.vms.disarmFreeze?.(vmId).catch((e: unknown) => log.warn({ err: e }, 'DisarmFreeze failed; the arm expires by itself'));
    // UNAVAILABLE is a documented runtime condition, not a missing feature: podd lists
    // "podd.quiesce" when the host's freeze port existed at its start, and answers UNAVAILABLE
    // when it cannot reach that port now (e.g. a supervisor rolled back to a release without
    // one). Nothing is frozen then, so the pause path is safe. A podd without the RPC does not
    // list the feature (checked above), so no other code is taken as "use the fallback".
    if (isCode(err, Status.UNAVAILABLE)) return pauseAndClone(c, parent, vmId, cloneAll, `podd Quiesce failed: ${(err as Error).message}`, log);
    throw err;
  }
  // the window podd names is the sandbox's word: never longer than what was asked, nor the longest freeze
  freeze = { ...freeze, maxFreezeMs: Math.min(freeze.maxFreezeMs, maxFreezeMs > 0 ? maxFreezeMs : MAX_FREEZE_MS, MAX_FREEZE_MS) };
  let cloneMs = 0;
  let cloneErr: unknown;
  try {
    cloneMs = await cloneAll(Math.max(1, freeze.maxFreezeMs - (c.now() - tCall)));
  } catch (err) {
    cloneErr = err;
  }
  const cloneEnd = c.now();
  let frozenMs = 0;
  let endedBy: string;
  try {
    // from the host when the supervisor can (no round trip through the sandbox's podd), else through podd
    const t =
      (await c.vms.thawFreeze?.(vmId, freeze.token).catch((err: unknown) => {
        log.warn({ err }, 'ThawVmFreeze failed; thawing through podd');
        return undefined;
      })) ?? (await podd.thaw(freeze.token));
    endedBy = t.endedBy;
    frozenMs = t.frozenMs;
  } catch (err) {
    // podd is gone or stuck: its watchdog thaws at the deadline by itself. The clones are
    // consistent if they ended before the earliest possible deadline.
    endedBy = cloneEnd - tCall < freeze.maxFreezeMs ? 'caller' : 'watchdog';
    log.warn({ err }, 'Thaw failed; the freeze ends by its watchdog');
  }
  // the clone carried the rest of the window as its deadline: DEADLINE_EXCEEDED is the window
  // running out (the ublk-manager undoes a cancelled clone), answered as the contract says
  if (isCode(cloneErr, Status.DEADLINE_EXCEEDED)) {
    throw new AbortedError(`fork of ${parent.sandboxId}: the clone did not finish within the parent's ${freeze.maxFreezeMs} ms freeze window; ${freezeAdvice(freeze.maxFreezeMs)}`);
  }
  if (cloneErr) throw cloneErr;
  // podd runs inside the sandbox, and so can anything that reaches the freeze port: ask the
  // supervisor whether this freeze really held until the clones were done
  // (freeze tokens are random: podd cannot name a freeze that began after its answer)
  const host = await c.vms.freezeStatus(vmId);
  const early = !host
    ? 'cannot be confirmed by the vmm-supervisor (it lost vmm.freeze-status.v1 during the fork)'
    : !freeze.token || host.token !== freeze.token
      ? 'was replaced by another freeze, or never made'
      : !host.frozen && host.endedBy !== 'watchdog' && host.endedAtMs < cloneEnd
        ? `ended ${cloneEnd - host.endedAtMs} ms before the clone finished`
        : '';
  if (early) throw new AbortedError(`fork of ${parent.sandboxId}: the parent's freeze ${early} (thawed from inside the sandbox?); the clones may be torn, retry`);
  if (host?.endedBy === 'watchdog') endedBy = 'watchdog';
  if (endedBy === 'watchdog') {
    throw new AbortedError(`fork of ${parent.sandboxId}: the parent's ${freeze.maxFreezeMs} ms freeze ran out before the clone finished (${cloneMs} ms); ${freezeAdvice(freeze.maxFreezeMs)}`);
  }
  return { method: 'quiesce', parentHeldMs: frozenMs, cloneMs };
}

/**
 * Time an arm gives podd beyond the freeze window, ms: its sync before the freeze (as the
 * Quiesce deadline's margin).
 */
export const ARM_MARGIN_MS = 10_000;

/** freezeAdvice is what a fork whose clone outlasted a maxFreezeMs window should do instead. */
function freezeAdvice(maxFreezeMs: number): string {
  return maxFreezeMs < MAX_FREEZE_MS ? `retry with a larger max_freeze_ms (at most ${MAX_FREEZE_MS})` : 'the clone takes longer than the longest freeze: pause the sandbox and fork it paused';
}

/**
 * pauseAndClone holds a RUNNING parent by pausing its VM (the record stays RUNNING, marked
 * with fork_paused_at_ms for adoption), syncs the host, clones, and resumes it whatever the
 * clones did.
 */
async function pauseAndClone(c: CoreContext, parent: SandboxRecord, vmId: string, cloneAll: CloneAll, why: string, log: Logger): Promise<ParentHold> {
  log.info({ why }, 'fork holds the parent by pausing it');
  parent.forkPausedAtMs = c.now();
  c.touch(parent);
  const t = c.now();
  await c.vms.pause(vmId);
  let cloneMs: number;
  try {
    await syncHostMapped(c, log); // as for a PAUSED parent: its dirty pages reach the devices first
    cloneMs = await cloneAll();
  } finally {
    await c.vms.resume(vmId);
    parent.forkPausedAtMs = 0;
    c.touch(parent);
  }
  return { method: 'pause', parentHeldMs: c.now() - t, cloneMs };
}
