/**
 * Adoption: what a server does with the node's runtime records when it becomes active
 * (ARCHITECTURE.md section 3). For every record:
 * - RUNNING / PAUSED: verify the VM (pid + start ticks as the supervisor reports them), the
 *   devices, and podd health (RUNNING only: a paused sandbox cannot answer). A verified
 *   sandbox is registered with no state change and no restart. If the VM's real pause state
 *   differs (a crash between the supervisor call and the record write), the record follows
 *   the VM. A VM that is gone or is another process -> ERROR with the reason (never dropped).
 * - CREATING / DELETING: a crash interrupted the operation -> tear down what exists.
 * - ERROR: kept as is for the operator to delete.
 */
import type { Logger } from '@sandnode/shared';
import { mapLimit } from '@sandnode/shared';
import type { SandboxManager } from './sandbox-manager';
import { networkMismatch, rebuildDirectory, stopVmKeepingSlot } from './network';
import { isPoolMember } from './pool-config';
import { isLive, transition } from './transitions';
import type { DevicePort, EgressPolicyWire, PoddConnector, RecordStore, SandboxRecord, VmPort } from './types';

export interface AdoptionReport {
  /** users' sandboxes verified and registered unchanged (warm-pool members are counted in poolMembers) */
  adopted: string[];
  /** warm-pool members (READY or CLAIMING, pool-config.ts isPoolMember) verified and registered unchanged; ListSandboxes never shows them */
  poolMembers: string[];
  /** records whose state was corrected to the VM's real state */
  reconciled: string[];
  /** CREATING/DELETING records torn down */
  tornDown: string[];
  /** records marked ERROR, with reasons */
  failed: { sandboxId: string; reason: string }[];
  /** podd did not answer Health (the sandbox stays RUNNING; its init respawns podd); filled by checkPodds when deferred */
  poddUnhealthy: string[];
  /** the RUNNING sandboxes whose podd is still to be asked (deferPoddChecks); checkPodds asks them */
  poddToCheck?: { sandboxId: string; poddAddress: string }[];
  /** live sandboxes whose VM's network differs from the record (slot or address), with how; kept as they are */
  networkMismatch: { sandboxId: string; reason: string }[];
  durationMs: number;
}

export interface AdoptionDeps {
  store: RecordStore;
  vms: VmPort;
  devices: DevicePort;
  podd: PoddConnector;
  manager: SandboxManager;
  log: Logger;
  /** how many records are checked at once (default DEFAULT_ADOPT_CONCURRENCY) */
  concurrency?: number;
  /** podd Health timeout per sandbox, ms (default DEFAULT_ADOPT_PODD_TIMEOUT_MS) */
  poddTimeoutMs?: number;
  /**
   * leave the podd Health calls to checkPodds (report.poddToCheck) instead of making them inside
   * adoption: a server taking over adopts while lifecycle calls are held, and a sandbox that
   * stops its podd (SIGSTOP: the connect succeeds, the call hangs) made each handover's hold
   * poddTimeoutMs longer. The answer changes nothing (the sandbox stays RUNNING either way).
   */
  deferPoddChecks?: boolean;
}

/** Records checked at once during adoption (config key adoptConcurrency). */
export const DEFAULT_ADOPT_CONCURRENCY = 16;
/** Timeout of the podd Health call adoption makes per RUNNING sandbox, ms. */
export const DEFAULT_ADOPT_PODD_TIMEOUT_MS = 2000;

/** adoptAll adopts every record; it never restarts or pauses a sandbox. */
export async function adoptAll(d: AdoptionDeps): Promise<AdoptionReport> {
  const t0 = Date.now();
  const report: AdoptionReport = { adopted: [], poolMembers: [], reconciled: [], tornDown: [], failed: [], poddUnhealthy: [], networkMismatch: [], durationMs: 0 };
  const records = d.store.list();
  const vms = new Map((await d.vms.list()).map((v) => [v.vmId, v]));
  const devices = new Map((await d.devices.list()).map((x) => [x.deviceId, x]));

  await mapLimit(records, d.concurrency ?? DEFAULT_ADOPT_CONCURRENCY, (rec) =>
    d.manager
      .withLock(rec.sandboxId, () => adoptOne(d, rec, vms, devices, report))
      .catch((err: unknown) => {
        report.failed.push({ sandboxId: rec.sandboxId, reason: (err as Error).message });
        d.log.error({ sandbox_id: rec.sandboxId, err }, 'adoption failed');
      }),
  );
  // the proxies' view follows the records as adopted (every touch above already set its own)
  rebuildDirectory(d.manager.directory, d.store.list());
  report.durationMs = Date.now() - t0;
  d.log.info(
    {
      adopted: report.adopted.length,
      pool_members: report.poolMembers.length,
      reconciled: report.reconciled.length,
      torn_down: report.tornDown.length,
      failed: report.failed.length,
      podd_unhealthy: report.poddUnhealthy.length,
      network_mismatch: report.networkMismatch.length,
      ms: report.durationMs,
    },
    'adoption finished',
  );
  return report;
}

/**
 * finishReset ends a ResetRootfs a crash interrupted. The VM still alive (same process): the
 * reset never stopped it, so it is undone (the fresh upper deleted, the mark cleared) and
 * adoption goes on (returns false). The VM gone: the fresh upper becomes the upper and the
 * sandbox is DRAINED with resume method "cold-start" (returns true); ResumeSandbox boots it.
 */
async function finishReset(
  d: AdoptionDeps,
  rec: SandboxRecord,
  vm: Awaited<ReturnType<VmPort['list']>>[number] | undefined,
  devices: Map<string, Awaited<ReturnType<DevicePort['list']>>[number]>,
  log: Logger,
): Promise<boolean> {
  const fresh = devices.get(rec.resetUpperDeviceId);
  const alive = rec.vm && vm && vm.pid === rec.vm.pid && vm.startTimeTicks === rec.vm.startTimeTicks && (vm.state === 'RUNNING' || vm.state === 'PAUSED');
  if (alive || !fresh?.attached) {
    log.warn({ device_id: rec.resetUpperDeviceId, vm_alive: Boolean(alive) }, 'undoing an interrupted rootfs reset');
    await d.devices.delete(rec.resetUpperDeviceId);
    rec.resetUpperDeviceId = '';
    d.manager.touch(rec);
    return false;
  }
  const old = rec.devices.find((x) => x.role === 'rootfs-upper');
  await stopVmKeepingSlot(d.vms, rec);
  d.manager.switchUpper(rec, fresh, (rec.rootfsGeneration || 1) + 1);
  if (old) await d.devices.delete(old.deviceId);
  log.warn({ device_id: fresh.deviceId, generation: rec.rootfsGeneration }, 'finished an interrupted rootfs reset: DRAINED on the new rootfs');
  return true;
}

async function adoptOne(
  d: AdoptionDeps,
  rec: SandboxRecord,
  vms: Map<string, Awaited<ReturnType<VmPort['list']>>[number]>,
  devices: Map<string, Awaited<ReturnType<DevicePort['list']>>[number]>,
  report: AdoptionReport,
): Promise<void> {
  const log = d.log.child({ sandbox_id: rec.sandboxId });
  if (rec.state === 'CREATING' || rec.state === 'DELETING') {
    log.warn({ state: rec.state }, 'interrupted operation: tearing down');
    await d.manager.teardown(rec);
    report.tornDown.push(rec.sandboxId);
    return;
  }
  if (rec.state === 'DRAINED') {
    // a DRAINED sandbox has no VM: one under its id is what a resume booted before its server
    // died, unanswered (the caller saw the call fail) and not recorded: stopped, its disks and
    // network slot kept, so the record holds and a retried resume boots it again (attacker:
    // the container ran on, hidden, with the record DRAINED pid 0)
    const vmId = rec.vm?.vmId ?? rec.sandboxId;
    if (vms.has(vmId)) {
      log.warn({ vm_pid: vms.get(vmId)!.pid }, 'a DRAINED sandbox had a VM (a resume interrupted before it was recorded): stopped, disks and slot kept');
      await stopVmKeepingSlot(d.vms, rec);
      report.reconciled.push(rec.sandboxId);
    }
    return;
  }
  if (!isLive(rec)) return;

  const fail = (reason: string) => {
    transition(rec, 'ERROR');
    rec.errorMessage = reason;
    d.manager.touch(rec);
    report.failed.push({ sandboxId: rec.sandboxId, reason });
    log.error({ reason }, 'sandbox cannot be adopted; marked ERROR');
  };
  const vm = rec.vm ? vms.get(rec.vm.vmId) : undefined;
  if (rec.resetUpperDeviceId && (await finishReset(d, rec, vm, devices, log))) {
    report.reconciled.push(rec.sandboxId);
    return;
  }
  if (!rec.vm || !vm) return fail('its VM is gone');
  if (vm.pid !== rec.vm.pid || vm.startTimeTicks !== rec.vm.startTimeTicks) {
    return fail(`its VM is another process now (record pid ${rec.vm.pid}, supervisor pid ${vm.pid})`);
  }
  if (vm.state !== 'RUNNING' && vm.state !== 'PAUSED') return fail(`its VM is ${vm.state}`);
  let changed = false;
  for (const dev of rec.devices) {
    const live = devices.get(dev.deviceId);
    if (!live || !live.attached) return fail(`device ${dev.deviceId} is gone`);
    if (live.path !== dev.path) {
      dev.path = live.path;
      changed = true;
    }
  }
  if (rec.forkPausedAtMs) {
    // the server died while a fork held this sandbox paused: end the hold
    if (rec.state === 'RUNNING' && vm.state === 'PAUSED') {
      await d.vms.resume(rec.vm.vmId);
      vm.state = 'RUNNING';
      log.warn({ paused_at_ms: rec.forkPausedAtMs }, 'resumed a sandbox paused by an interrupted fork');
    }
    rec.forkPausedAtMs = 0;
    changed = true;
  }
  if (vm.state !== rec.state) {
    log.warn({ record: rec.state, vm: vm.state }, 'record follows the VM state');
    transition(rec, vm.state);
    changed = true;
    report.reconciled.push(rec.sandboxId);
  }
  if (changed) d.manager.touch(rec);
  const mismatch = networkMismatch(rec, vm);
  if (mismatch) {
    report.networkMismatch.push({ sandboxId: rec.sandboxId, reason: mismatch });
    log.error({ reason: mismatch }, 'adoption: the VM network differs from the record; kept as is');
  } else if (rec.network && vm.network && rec.vm && !samePolicy(rec.network.egress, vm.network.egress)) {
    // a server that died between the supervisor's UpdateVmNetwork and its record: its caller was
    // told the call failed, so the record's policy is put back (else GetSandbox would name one
    // policy while the kernel enforces another)
    try {
      if (!d.vms.updateNetwork) throw new Error('the vmm-supervisor cannot change a network');
      await d.vms.updateNetwork(rec.vm.vmId, rec.network.egress);
      log.warn({ record: rec.network.egress, vm: vm.network.egress }, 'adoption: the VM egress policy differed from the record; the record applied');
      report.reconciled.push(rec.sandboxId);
    } catch (err) {
      report.networkMismatch.push({ sandboxId: rec.sandboxId, reason: `its VM's egress policy differs from the record and could not be set back: ${(err as Error).message}` });
      log.error({ err }, 'adoption: the VM egress policy differs from the record; could not apply the record');
    }
  }
  if (rec.state === 'RUNNING') {
    if (d.deferPoddChecks) (report.poddToCheck ??= []).push({ sandboxId: rec.sandboxId, poddAddress: rec.poddAddress });
    else await checkPodd(d, rec.sandboxId, rec.poddAddress, report, log);
  }
  (isPoolMember(rec) ? report.poolMembers : report.adopted).push(rec.sandboxId);
}

/** checkPodd asks one sandbox's podd for Health (poddTimeoutMs); no answer is recorded in report.poddUnhealthy and logged. */
async function checkPodd(d: Pick<AdoptionDeps, 'podd' | 'poddTimeoutMs'>, sandboxId: string, poddAddress: string, report: AdoptionReport, log: Logger): Promise<void> {
  const ok = await d.podd
    .connect(poddAddress)
    .health(d.poddTimeoutMs ?? DEFAULT_ADOPT_PODD_TIMEOUT_MS)
    .catch(() => false);
  if (!ok) {
    report.poddUnhealthy.push(sandboxId);
    log.warn({ sandbox_id: sandboxId }, 'podd did not answer Health; sandbox kept RUNNING');
  }
}

/**
 * checkPodds makes the podd Health calls an adoption with deferPoddChecks left
 * (report.poddToCheck, emptied), concurrency at a time; never throws. Returns how many did not
 * answer (also in report.poddUnhealthy).
 */
export async function checkPodds(d: Pick<AdoptionDeps, 'podd' | 'poddTimeoutMs' | 'concurrency' | 'log'>, report: AdoptionReport): Promise<number> {
  const todo = report.poddToCheck ?? [];
  report.poddToCheck = [];
  const before = report.poddUnhealthy.length;
  await mapLimit(todo, d.concurrency ?? DEFAULT_ADOPT_CONCURRENCY, (t) => checkPodd(d, t.sandboxId, t.poddAddress, report, d.log).catch(() => undefined));
  const unhealthy = report.poddUnhealthy.length - before;
  if (todo.length) d.log.info({ asked: todo.length, podd_unhealthy: unhealthy }, 'podd health after adoption');
  return unhealthy;
}

/** samePolicy compares two canonical egress policies (wire shape; both sides store formatEgressPolicy's order). */
function samePolicy(a: EgressPolicyWire, b: EgressPolicyWire): boolean {
  const key = (p: EgressPolicyWire) => JSON.stringify([p.allowOut, p.denyOut, p.blockAll]);
  return key(a) === key(b);
}
