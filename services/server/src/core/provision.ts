/**
 * Making and unmaking a sandbox's parts, the steps create, fork, resume, reset and the reaper
 * share: the CREATING record of a new id, booting its VM on the recorded devices until podd
 * answers (CREATING or DRAINED -> RUNNING), booting a DRAINED sandbox again on its own disks,
 * and the teardown (-> DELETING, then VM, devices, dir and record are removed).
 */
import { randomBytes } from 'node:crypto';
import { mkdir, rm } from 'node:fs/promises';
import { DeadlineExceededError, FailedPreconditionError, isCode, sandboxDir, Status, unixAddress } from '@sandnode/shared';
import type { CoreContext, RecordOrigin } from './context';
import { applyVmNetwork, nodeNetwork } from './network';
import { INITIAL_STATE, transition } from './transitions';
import { RECORD_SCHEMA, type DeviceRole, type SandboxRecord } from './types';

/** The env var that tells a fork child's init and podd its parent's sandbox id. */
export const FORKED_FROM_ENV = 'SANDNODE_FORKED_FROM';
/** Default size of a sandbox's rootfs upper device, bytes (sparse). */
export const DEFAULT_UPPER_BYTES = 1024 * 1024 * 1024;
/** Default time podd gets to answer Health after the VM starts, ms. */
export const DEFAULT_PODD_READY_TIMEOUT_MS = 20_000;
/** Timeout of one podd Health call while a boot waits for podd, ms. */
export const PODD_HEALTH_CALL_MS = 1000;
/** Pause between two podd Health calls while a boot waits for podd, ms. */
export const PODD_READY_POLL_MS = 25;

/** newSandboxId is a fresh sandbox id: "sb-" + 16 hex digits (SANDBOX_ID_RE of @sandnode/shared). */
export function newSandboxId(): string {
  return `sb-${randomBytes(8).toString('hex')}`;
}

/**
 * ownedDeviceIds are the devices a record owns: those it lists, the ids a create or fork makes
 * before it records them (`<id>-upper`, `<id>-ws`), and the fresh upper of a reset in progress.
 */
export function ownedDeviceIds(rec: SandboxRecord): string[] {
  const ids = new Set([...rec.devices.map((d) => d.deviceId), `${rec.sandboxId}-upper`, `${rec.sandboxId}-ws`]);
  if (rec.resetUpperDeviceId) ids.add(rec.resetUpperDeviceId);
  return [...ids];
}

/**
 * newRecord is the CREATING record of a new sandbox id made from `from` (a template, or a
 * fork's parent): no VM or device yet, its own podd address and a fresh machine id; it
 * expires timeoutSeconds from now (0: never). Not persisted.
 */
export function newRecord(c: Pick<CoreContext, 'now' | 'runDir'>, id: string, from: RecordOrigin, metadata: Record<string, string>, timeoutSeconds: number, requestId: string): SandboxRecord {
  const now = c.now();
  return {
    ...from,
    schema: RECORD_SCHEMA,
    sandboxId: id,
    state: INITIAL_STATE,
    vm: undefined,
    devices: [],
    poddAddress: unixAddress(`${sandboxDir(c.runDir, id)}/podd.sock`),
    createdAtMs: now,
    updatedAtMs: now,
    expiresAtMs: timeoutSeconds ? now + timeoutSeconds * 1000 : 0,
    metadata,
    requestId,
    errorMessage: '',
    resumeMethod: '',
    forkPausedAtMs: 0,
    machineId: randomBytes(16).toString('hex'),
    resetUpperDeviceId: '',
  };
}

/**
 * untilAborted settles as p does, or rejects with signal.reason as soon as signal aborts
 * (p then runs on unobserved); without a signal it is p.
 */
function untilAborted<T>(p: Promise<T>, signal: AbortSignal | undefined): Promise<T> {
  if (!signal) return p;
  if (signal.aborted) return Promise.reject(signal.reason as Error);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason as Error);
    signal.addEventListener('abort', onAbort, { once: true });
    p.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
  });
}

/**
 * waitForPodd polls podd Health until it answers. DeadlineExceededError (DEADLINE_EXCEEDED:
 * the sandbox did not come up in time; nothing is wrong with the request) after
 * c.poddReadyTimeoutMs; signal.reason as soon as signal aborts, also during a Health call or
 * the pause between two.
 */
async function waitForPodd(c: CoreContext, rec: SandboxRecord, signal?: AbortSignal): Promise<void> {
  const client = c.podd.connect(rec.poddAddress);
  const deadline = c.now() + c.poddReadyTimeoutMs;
  for (;;) {
    signal?.throwIfAborted();
    if (
      await untilAborted(
        client.health(PODD_HEALTH_CALL_MS).catch(() => false),
        signal,
      )
    )
      return;
    if (c.now() > deadline) {
      throw new DeadlineExceededError(`sandbox ${rec.sandboxId}: podd did not answer at ${rec.poddAddress} within ${c.poddReadyTimeoutMs} ms`);
    }
    await untilAborted(new Promise((r) => setTimeout(r, PODD_READY_POLL_MS)), signal);
  }
}

/**
 * bootVm starts rec's VM on the devices in its record (their paths must be current), records
 * the VM, waits for podd and persists RUNNING (from CREATING or DRAINED). The VM id is the
 * recorded one (or the sandbox id), its hostname the sandbox id, its /etc/machine-id the
 * record's; a fork child also gets env SANDNODE_FORKED_FROM=<parent id>. signal (the caller
 * went away) is looked at before every step and after the last one: once it fired, bootVm
 * throws signal.reason and does not persist RUNNING (the caller tears the sandbox down). The
 * last look and the RUNNING commit run in one synchronous stretch, so a caller of bootVm that
 * answers without another await answers only a boot whose caller was still there. mark(step)
 * is called as each step ends (runDir, vmCreate, recordVm, poddReady, recordRunning: the
 * create's step timings, see sandbox-manager.ts).
 */
export async function bootVm(c: CoreContext, rec: SandboxRecord, signal?: AbortSignal, mark: (step: string) => void = () => undefined): Promise<void> {
  const upper = rec.devices.find((d) => d.role === 'rootfs-upper');
  const ws = rec.devices.find((d) => d.role === 'workspace');
  if (!upper || !ws) throw new FailedPreconditionError(`sandbox ${rec.sandboxId}: its record lacks a device`);
  const dir = sandboxDir(c.runDir, rec.sandboxId);
  await mkdir(dir, { recursive: true, mode: 0o700 });
  mark('runDir');
  signal?.throwIfAborted();
  const vm = await c.vms.create({
    vmId: rec.vm?.vmId ?? rec.sandboxId,
    templateRootfs: rec.templateRootfs,
    upperPath: upper.path,
    workspacePath: ws.path,
    resources: rec.resources,
    poddSocketDir: dir,
    hostname: rec.sandboxId,
    env: rec.forkedFrom ? { [FORKED_FROM_ENV]: rec.forkedFrom } : {},
    machineId: rec.machineId,
    // slot -1 at create and fork (any free one); a DRAINED sandbox's own slot at resume
    ...(rec.network ? { network: { owner: rec.sandboxId, slot: rec.network.slot, egress: rec.network.egress } } : {}),
  });
  rec.vm = { vmId: vm.vmId, driver: vm.driver, pid: vm.pid, startTimeTicks: vm.startTimeTicks, driverVersion: vm.driverVersion, apiSocket: vm.apiSocket, isolation: [...(vm.isolation ?? [])] };
  try {
    applyVmNetwork(rec, vm);
  } catch (err) {
    // a VM without the network its record names is not this sandbox: it goes, the record stays as it was
    await c.vms.delete(vm.vmId).catch((e: unknown) => c.log.warn({ sandbox_id: rec.sandboxId, err: e }, 'could not delete a VM made without its network'));
    throw err;
  } finally {
    mark('vmCreate');
    c.touch(rec);
    mark('recordVm');
  }
  await waitForPodd(c, rec, signal);
  mark('poddReady');
  // no await from here to the return: the caller cannot go away between this look and RUNNING
  signal?.throwIfAborted();
  transition(rec, 'RUNNING');
  rec.resumeMethod = '';
  c.touch(rec);
  mark('recordRunning');
}

/**
 * requireDeviceManager asks the ublk-manager for its version before anything of a new sandbox
 * is made, so that a create on a drained node (a drain stops the ublk-manager) fails at once
 * with what to run and leaves nothing: it waited out the peer's retries, was retried by the
 * client and left a DELETING record per attempt (6 of them for one `sandbox create`).
 * Errors: FAILED_PRECONDITION when it does not answer; others as DevicePort.version.
 */
export async function requireDeviceManager(c: CoreContext, what: string): Promise<void> {
  try {
    await c.devices.version();
  } catch (err) {
    if (isCode(err, Status.UNAVAILABLE)) throw new FailedPreconditionError(`${what}: the ublk-manager does not answer (a drain stops it): start it with \`sandnode up\`; nothing was created`);
    throw err;
  }
}

/**
 * coldStart boots a DRAINED sandbox again on its own disks (their current paths from the
 * ublk-manager). FailedPreconditionError when a device is not attached or missing, or when the
 * ublk-manager does not answer (UNAVAILABLE: a drain stopped it; the message says what to run).
 */
export async function coldStart(c: CoreContext, rec: SandboxRecord): Promise<SandboxRecord> {
  const paths: Partial<Record<DeviceRole, string>> = {};
  for (const d of rec.devices) {
    const live = await c.devices.get(d.deviceId).catch((err: unknown) => {
      // a drain stops the ublk-manager: say what to run rather than a bare UNAVAILABLE
      if (isCode(err, Status.UNAVAILABLE))
        throw new FailedPreconditionError(
          `sandbox ${rec.sandboxId} is DRAINED and its disks need the ublk-manager, which does not answer (a drain stops it): start it with \`sandnode up\` (\`sandnode sandbox resume\` on the node starts it), then resume`,
        );
      throw err;
    });
    if (!live?.attached) throw new FailedPreconditionError(`sandbox ${rec.sandboxId}: device ${d.deviceId} is not attached (is ublk-manager running? \`sandnode up\` starts it)`);
    d.path = live.path;
    paths[d.role] = live.path;
  }
  if (!paths['rootfs-upper'] || !paths.workspace) throw new FailedPreconditionError(`sandbox ${rec.sandboxId}: its record lacks a device`);
  if (rec.network) {
    // its address is kept for it: a node that cannot give a network (a supervisor rolled back to 0.2.0, network off) boots nothing
    const node = await nodeNetwork(c.vms);
    if (!node.available) throw new FailedPreconditionError(`sandbox ${rec.sandboxId} has a network (slot ${rec.network.slot}, ${rec.network.address}), but ${node.reason}; it stays DRAINED`);
  }
  await bootVm(c, rec);
  c.log.info({ sandbox_id: rec.sandboxId, vm_pid: rec.vm?.pid }, 'drained sandbox started again on its disks');
  return rec;
}

/**
 * teardown removes VM, devices, runtime dir and finally the record (marked DELETING first,
 * so a crash in between is finished by adoption). A part another record also names (a copied
 * or replayed row listing a live sandbox's VM or devices) is left to that record: a teardown
 * removes only what rec alone owns. Idempotent: a retry after a peer outage finishes it.
 */
export async function teardown(c: CoreContext, rec: SandboxRecord): Promise<void> {
  transition(rec, 'DELETING');
  c.touch(rec);
  const others = othersParts(c, rec);
  const vmId = rec.vm?.vmId ?? rec.sandboxId;
  const shared: string[] = [];
  if (others.vms.has(vmId)) shared.push(`vm ${vmId}`);
  else await c.vms.delete(vmId);
  // DeleteVm frees the VM's slot; a slot kept for the sandbox without a VM (DRAINED, or a crash
  // between the two) is released by owner (a free slot or another owner's: nothing happens)
  const slot = rec.network?.slot ?? -1;
  if (slot >= 0 && !others.vms.has(vmId) && c.vms.releaseNetworkSlot) await c.vms.releaseNetworkSlot(slot, rec.sandboxId);
  if (!others.podd.has(rec.poddAddress)) c.podd.forget(rec.poddAddress);
  for (const d of ownedDeviceIds(rec)) {
    if (others.devices.has(d)) shared.push(`device ${d}`);
    else await c.devices.delete(d);
  }
  if (shared.length) c.log.error({ sandbox_id: rec.sandboxId, kept: shared }, 'teardown: left parts another record names');
  await rm(sandboxDir(c.runDir, rec.sandboxId), { recursive: true, force: true });
  c.store.delete(rec.sandboxId);
  c.directory.remove(rec.sandboxId);
}

/**
 * othersParts are the VM ids, device ids and podd addresses that records other than rec own,
 * of those rec names (only the records that mention one are read, see RecordStore.mentioning).
 */
function othersParts(c: Pick<CoreContext, 'store'>, rec: SandboxRecord): { vms: Set<string>; devices: Set<string>; podd: Set<string> } {
  const needles = [rec.vm?.vmId ?? rec.sandboxId, ...ownedDeviceIds(rec), rec.poddAddress];
  const others = c.store.mentioning ? c.store.mentioning(needles, rec.sandboxId) : c.store.list().filter((r) => r.sandboxId !== rec.sandboxId);
  const held = (c.store.quarantinedIds?.() ?? []).filter((id) => id !== rec.sandboxId);
  return {
    vms: new Set([...others.map((r) => r.vm?.vmId ?? r.sandboxId), ...held]),
    devices: new Set([...others.flatMap(ownedDeviceIds), ...held.flatMap((id) => [`${id}-upper`, `${id}-ws`])]),
    podd: new Set(others.map((r) => r.poddAddress)),
  };
}
