/**
 * ForkSandbox: a RUNNING child whose rootfs upper (the parent's current generation) and
 * workspace are CoW clones of the parent's, taken at one point in time (see
 * SandboxService.ForkSandbox for the contract; how the parent is held: parent-hold.ts).
 * Order: check the ublk-manager's features (nothing made yet) -> persist the child CREATING ->
 * hold the parent -> SnapshotDevices upper and workspace (FICLONE only; a manager without
 * "ublk.clone-snapshot.v1": CloneDevice of both) -> release the parent -> CloneDevice of the
 * snapshots (attaches them) -> boot the child.
 * A failure after the child record exists tears the child down; a crash is finished by
 * adoption (CREATING -> torn down, a parent paused for the fork -> resumed, a parent frozen ->
 * thawed by podd's watchdog).
 */
import { FailedPreconditionError, hasFeature, InvalidArgumentError, isCode, requireFeature, requireSandboxId, Status, UBLK_FEATURES, UnavailableError, type Logger } from '@sandnode/shared';
import { failpoint } from '../handover/failpoints';
import type { CoreContext } from './context';
import { planNetwork, validateNetworkRequest, type NetworkChoice, type NetworkRequest } from './network';
import { newIdleRef, validateIdle, type IdleSettingsRequest } from './idle';
import { holdParent, type ParentHold } from './parent-hold';
import { bootVm, newRecord, newSandboxId, teardown } from './provision';
import type { IdleSettings, SandboxRecord } from './types';
import { validateMaxFreezeMs, validateMetadata, validateRequestId, validateTimeoutSeconds } from './validate';

export type { ForkMethod } from './parent-hold';

export interface ForkSandboxArgs {
  parentId: string;
  metadata: Record<string, string>;
  timeoutSeconds: number;
  /** 0 = 1500 ms */
  maxFreezeMs: number;
  requestId: string;
  /** ForkSandboxRequest.network; undefined: the parent's policy and publicness on a new slot (none if the parent has none) */
  network?: NetworkRequest;
  /** ForkSandboxRequest.idle; undefined: the parent's idle settings, timers from the fork */
  idle?: IdleSettingsRequest;
}

export interface ForkResult extends ParentHold {
  child: SandboxRecord;
  /** the whole fork until the child's podd answered, ms */
  forkMs: number;
}

/**
 * fork validates args and forks (or joins / answers a repeated request_id). signal: the caller
 * went away; it stops the wait to enter the handover gate and, for a fork without request_id
 * (no retry can join it), undoes the child if it fires at any point of its boot up to the
 * commit to RUNNING (bootVm; the child is torn down, the parent stays as it was). Errors:
 * INVALID_ARGUMENT, NOT_FOUND (parent), FAILED_PRECONDITION (parent not RUNNING or PAUSED, a
 * ublk-manager without "ublk.clone", request_id of a child that is gone), ABORTED (the freeze
 * ran out or was ended early), UNAVAILABLE naming ublk-manager (it went away during the clone;
 * the child is undone), and the peers'.
 */
export async function fork(c: CoreContext, args: ForkSandboxArgs, signal?: AbortSignal): Promise<ForkResult> {
  requireSandboxId('parent_id', args.parentId);
  const metadata = validateMetadata('metadata', args.metadata);
  const timeoutSeconds = validateTimeoutSeconds('timeout_seconds', args.timeoutSeconds);
  const maxFreezeMs = validateMaxFreezeMs('max_freeze_ms', args.maxFreezeMs);
  const requestId = validateRequestId('request_id', args.requestId);
  const network = validateNetworkRequest('network', args.network);
  const idle = validateIdle('idle', args.idle);
  const what = `a fork of ${args.parentId}`;
  if (requestId) {
    const inflight = c.requests.join<ForkResult>(requestId, what);
    if (inflight) return inflight;
    const existing = c.store.findByRequestId(requestId);
    if (existing) return existingFork(existing, args.parentId);
  }
  c.get(args.parentId);
  const bootSignal = requestId ? undefined : signal;
  const p = c.gate.run(() => forkNow(c, args.parentId, { metadata, timeoutSeconds, maxFreezeMs, requestId, network, idle }, bootSignal), signal);
  return c.requests.track(requestId, what, p);
}

/** existingFork answers a repeated request_id: the same child, if it still lives. */
function existingFork(rec: SandboxRecord, parentId: string): ForkResult {
  if (rec.forkedFrom !== parentId) {
    throw new InvalidArgumentError(`request_id: ${rec.requestId} was used for sandbox ${rec.sandboxId}, which is not a fork of ${parentId}`);
  }
  if (rec.state !== 'RUNNING' && rec.state !== 'PAUSED') {
    throw new FailedPreconditionError(`request_id: ${rec.requestId} made sandbox ${rec.sandboxId}, which is ${rec.state}`);
  }
  return { child: rec, method: 'existing', parentHeldMs: 0, cloneMs: 0, forkMs: 0 };
}

/** The validated fork arguments of forkNow. */
interface ForkPlan {
  metadata: Record<string, string>;
  timeoutSeconds: number;
  maxFreezeMs: number;
  requestId: string;
  network: NetworkChoice;
  /** undefined: the parent's */
  idle: IdleSettings | undefined;
}

async function forkNow(c: CoreContext, parentId: string, plan: ForkPlan, signal: AbortSignal | undefined): Promise<ForkResult> {
  const { metadata, timeoutSeconds, maxFreezeMs, requestId, network } = plan;
  const t0 = c.now();
  // Negotiation before anything is made: the device manager must clone (asked now, not from
  // a cache: a handover may have rolled it back).
  const ublk = { component: 'ublk-manager', ...(await c.devices.version()) };
  requireFeature(ublk, UBLK_FEATURES.clone, 'ForkSandbox');
  // a manager that snapshots (0.3.0) does only the FICLONEs while the parent is held; the
  // device registration waits until it is released (a 0.2.0 one clones and attaches in the window)
  const snapshot = hasFeature(ublk, UBLK_FEATURES.cloneSnapshot) && c.devices.snapshot !== undefined;
  const id = newSandboxId();
  const log = c.log.child({ sandbox_id: id, parent_id: parentId });
  return c.locks.run(id, async () => {
    let child: SandboxRecord | undefined;
    try {
      const { attach, ...held } = await c.locks.run(parentId, async () => {
        const parent = c.requireState(parentId, 'ForkSandbox');
        const { template, templatePoddVersion, templateRootfs, resources, rootfsGeneration } = parent;
        // the child keeps the parent's environment, as a forked process does
        const origin = { template, templatePoddVersion, templateRootfs, resources: { ...resources }, rootfsGeneration, forkedFrom: parentId, env: { ...(parent.env ?? {}) } };
        const rec = newRecord(c, id, origin, metadata, timeoutSeconds, requestId);
        // the child's idle settings: the request's, else the parent's; its own timers from now
        const idleSettings = plan.idle ?? (parent.idle ? { ...parent.idle.settings } : undefined);
        if (idleSettings) rec.idle = newIdleRef(idleSettings, c.now());
        // the child's own slot and token; the parent's policy and publicness unless overridden
        const inherited: NetworkChoice = parent.network ? { egress: parent.network.egress, public: parent.network.public } : 'disabled';
        // an inherited network is what the parent had, not what the caller asked for: on a node that
        // can give none now (its supervisor rolled back to one without "vmm.network.v1") the child
        // gets none, as a create that asks for nothing does
        rec.network = await planNetwork(c.vms, network ?? inherited, 'ForkSandbox', c.tokens, id, network === undefined);
        child = rec;
        c.touch(rec);
        return cloneParent(c, parent, rec, maxFreezeMs, snapshot, log);
      });
      const ch = child!;
      c.touch(ch);
      const tAttach = c.now();
      if (attach) await attach();
      const attachMs = c.now() - tAttach;
      await bootVm(c, ch, signal);
      const forkMs = c.now() - t0;
      log.info({ method: held.method, parent_held_ms: held.parentHeldMs, clone_ms: held.cloneMs, snapshot, attach_ms: attachMs, fork_ms: forkMs }, 'sandbox forked');
      return { child: ch, ...held, forkMs };
    } catch (err) {
      if (child) {
        log.warn({ err }, 'fork failed; tearing the child down');
        child.requestId = '';
        await teardown(c, child).catch((e: unknown) => log.error({ err: e }, 'teardown after failed fork failed; adoption will retry'));
      }
      throw err;
    }
  });
}

/**
 * ublkUnavailable is the answer to a fork whose clone failed because the ublk-manager is gone
 * (UNAVAILABLE): retry once it is back. Not the freeze advice (a larger max_freeze_ms would not
 * help); the fork undoes the child and the parent is released as it was held.
 */
function ublkUnavailable(parentId: string, err: unknown): UnavailableError {
  return new UnavailableError(
    `fork of ${parentId}: ublk-manager is unavailable, the clone failed (${(err as Error).message}); the fork was undone and the parent left as it was; retry once ublk-manager is back`,
  );
}

/**
 * cloneParent holds the parent still, clones its upper and workspace into the child's record
 * (not yet persisted) and releases the parent. With snapshot (the manager lists
 * "ublk.clone-snapshot.v1") only SnapshotDevices runs in the hold, and the answer's attach
 * (CloneDevice of the snapshots, which attaches them; called after the parent's lock is let
 * go) finishes the devices; without it both CloneDevice calls run in the hold. Throws
 * AbortedError when the freeze ran out before the clones finished (they may be torn),
 * UnavailableError naming ublk-manager when a clone failed UNAVAILABLE (the manager is gone:
 * DevicePeer.clone also reports its retries that ran into the deadline so).
 */
async function cloneParent(c: CoreContext, parent: SandboxRecord, child: SandboxRecord, maxFreezeMs: number, snapshot: boolean, log: Logger): Promise<ParentHold & { attach?: () => Promise<void> }> {
  const sources = (['rootfs-upper', 'workspace'] as const).map((role) => {
    const d = parent.devices.find((x) => x.role === role);
    if (!d) throw new FailedPreconditionError(`sandbox ${parent.sandboxId}: its record lacks a ${role} device`);
    return { role, sourceId: d.deviceId, deviceId: `${child.sandboxId}-${role === 'rootfs-upper' ? 'upper' : 'ws'}` };
  });
  /** cloneDevices is CloneDevice of both; sourceQuiesced false is for snapshots (a source that is not held is refused). */
  const cloneDevices = async (sourceQuiesced: boolean, deadlineMs?: number): Promise<void> => {
    // both at once: the parent is held for the longer clone, not for the sum
    const settled = await Promise.allSettled(sources.map((src) => c.devices.clone(src.deviceId, src.sourceId, sourceQuiesced, deadlineMs)));
    settled.forEach((r, i) => {
      if (r.status === 'fulfilled') child.devices.push({ deviceId: r.value.deviceId, role: sources[i]!.role, path: r.value.path, backingFile: r.value.backingFile, sizeBytes: r.value.sizeBytes });
    });
    throwFirst(
      parent.sandboxId,
      settled.filter((r): r is PromiseRejectedResult => r.status === 'rejected').map((r) => r.reason as unknown),
    );
  };
  /** deadlineMs: a frozen parent's remaining window (a clone past it is useless; fail fast and thaw) */
  const cloneAll = async (deadlineMs?: number): Promise<number> => {
    failpoint('fork.after-hold');
    const t = c.now();
    if (snapshot) {
      try {
        await c.devices.snapshot!(sources, true, deadlineMs);
      } catch (err) {
        throwFirst(parent.sandboxId, [err]);
      }
    } else {
      await cloneDevices(true, deadlineMs);
    }
    failpoint('fork.after-clone');
    return c.now() - t;
  };
  const held = await holdParent(c, parent, maxFreezeMs, cloneAll, log);
  return snapshot ? { ...held, attach: () => cloneDevices(false) } : held;
}

/** throwFirst throws the first of a clone's failures, the device manager gone before any other (a deadline, say). */
function throwFirst(parentId: string, failures: unknown[]): void {
  const gone = failures.find((e) => isCode(e, Status.UNAVAILABLE));
  if (gone) throw ublkUnavailable(parentId, gone);
  if (failures.length) throw failures[0];
}
