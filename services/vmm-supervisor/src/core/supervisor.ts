/**
 * Supervisor: the VM state machine. It owns the VM table (persisted before every transition is
 * acknowledged) and drives a {@link VmDriver}. Operations on one VM are serialised; different
 * VMs proceed concurrently.
 *
 *   CreateVm:  (none) -> creating -> running         (creating row dropped again on failure)
 *   PauseVm:   running -> paused                     (else FAILED_PRECONDITION)
 *   ResumeVm:  paused -> running                     (else FAILED_PRECONDITION)
 *   StopVm:    running | paused | stopped -> stopped
 *   DeleteVm:  any -> (none)
 *   live check: running | paused -> stopped when the process is gone or was replaced
 *
 * A supervisor restart never starts, restarts, pauses or resumes a VM: {@link Supervisor.adopt}
 * only reads the host and records what it finds.
 */
import { statusOf, type FreezeEnd, type FreezeStatus } from './freeze';
import { hostFailure } from './host-error';
import { AlreadyExistsError, FailedPreconditionError, InvalidArgumentError, NotFoundError, requireResourceId, VMM_FEATURES, KeyedMutex } from '@sandnode/shared';
import type { Logger } from '@sandnode/shared';
import type { LiveStatus, VmDriver, VmRef } from './driver';
import type { EffectiveResources, VmRecord, VmSpec, VmState } from './types';
import { VM_RECORD_SCHEMA } from './types';
import { canonicalSpec, checkHostPaths, DEFAULT_PIDS, validateVmSpec } from './validate';
import type { VmStore } from './vm-store';
import type { NetworkManager, VmNetworkInfo } from '../network/manager';

/** Node defaults applied to zero resource fields and zero stop timeouts. */
export interface SupervisorDefaults {
  /** vcpus when a spec says 0. */
  vcpus: number;
  /** Memory limit in MiB when a spec says 0. */
  memoryMib: number;
  /** pids limit when a spec says 0 (default 1024 if absent). */
  pids?: number;
  /** SIGTERM -> SIGKILL wait in ms when a StopVm says 0 (also used by DeleteVm). */
  stopTimeoutMs: number;
}

/** What adopt() found, for logs and tests. */
export interface AdoptionReport {
  /** VMs adopted with their live state (running or paused), unchanged. */
  adopted: string[];
  /** VMs whose processes were gone: now stopped, row kept. */
  stopped: string[];
  /** Half-created VMs that were undone and dropped. */
  undone: string[];
  /** VMs whose check or undo failed; they stay in the table as they were. */
  failed: string[];
  /** Versioned driver binary dirs removed because no VM uses them. */
  prunedBinaries: string[];
}

/**
 * DriverBinaryStore keeps versioned copies of driver binaries (implemented by
 * store/driver-binaries.ts on the state dir).
 */
export interface DriverBinaryStore {
  /** install copies source into the dir of driver+version if missing; returns the copy's path. */
  install(driver: string, version: string, source: string): string;
  /** prune removes every version dir no path of inUse lies in; returns the removed names. */
  prune(inUse: Iterable<string>): string[];
}

/** SupervisorOptions wire a Supervisor. */
export interface SupervisorOptions {
  store: VmStore;
  driver: VmDriver;
  defaults: SupervisorDefaults;
  log: Logger;
  /** Versioned driver binaries; without it VMs run with the configured binary itself. */
  binaries?: DriverBinaryStore;
  /** The node's network slots (docs/network.md); without it VmSpec.network is FAILED_PRECONDITION. */
  network?: NetworkManager;
}

/** Supervisor implements every VmService operation on domain types. */
export class Supervisor {
  private readonly store: VmStore;
  private readonly driver: VmDriver;
  private readonly defaults: SupervisorDefaults;
  private readonly log: Logger;
  private readonly locks = new KeyedMutex();
  private readonly binaries: DriverBinaryStore | undefined;
  private readonly network: NetworkManager | undefined;
  private driverVersion = '';

  constructor(opts: SupervisorOptions) {
    this.store = opts.store;
    this.driver = opts.driver;
    this.defaults = opts.defaults;
    this.log = opts.log;
    this.binaries = opts.binaries;
    this.network = opts.network;
  }

  /** driverName is the driver's name ("runc" or "firecracker"). */
  get driverName(): string {
    return this.driver.name;
  }

  /** net is the network manager (undefined: none configured). */
  get net(): NetworkManager | undefined {
    return this.network;
  }

  /** networkOf is vmId's network, or undefined. */
  networkOf(vmId: string): VmNetworkInfo | undefined {
    const row = this.network?.forVm(vmId);
    return row && this.network!.infoOf(row);
  }

  /** Feature strings of the supervisor with its driver, for GetVersion (all from VMM_FEATURES). */
  features(): string[] {
    const arm = this.driver.features.includes(VMM_FEATURES.freezePort) ? [VMM_FEATURES.freezeArm] : [];
    return [
      ...this.driver.features,
      VMM_FEATURES.adoption,
      VMM_FEATURES.epochFence,
      VMM_FEATURES.freezeStatus,
      ...(this.driver.thawFreeze ? [VMM_FEATURES.hostThaw] : []),
      VMM_FEATURES.fenceEpoch,
      VMM_FEATURES.quarantineReport,
      VMM_FEATURES.vmIsolation,
      ...arm,
      ...(this.network ? [VMM_FEATURES.network, VMM_FEATURES.slotQuarantineReport] : []),
    ];
  }

  /**
   * freezeStatus is vmId's current or latest filesystem freeze as the driver saw it (all zero
   * without a freeze port). NotFoundError when there is no such VM.
   */
  async freezeStatus(vmId: string): Promise<FreezeStatus> {
    requireResourceId('vm_id', vmId);
    this.require(vmId);
    return (await this.driver.freezeStatus?.(vmId)) ?? statusOf(undefined, Date.now());
  }

  /**
   * thawFreeze ends vmId's freeze named by token from the host (VmService.ThawVmFreeze; the
   * freeze port's thaw: a freeze that already ended answers how). InvalidArgumentError (bad
   * id, empty token), NotFoundError (no such VM), FailedPreconditionError (not the latest
   * freeze, or no freeze port for the VM), InternalError (a FITHAW failed).
   */
  async thawFreeze(vmId: string, token: string): Promise<{ endedBy: FreezeEnd; frozenMs: number }> {
    requireResourceId('vm_id', vmId);
    if (!token) throw new InvalidArgumentError('freeze_token: required');
    this.require(vmId);
    const r = await this.driver.thawFreeze?.(vmId, token);
    if (!r) throw new FailedPreconditionError(`vm ${vmId}: its driver has no freeze port; nothing to thaw`);
    return r;
  }

  /**
   * adopt runs once at start, before serving: every row is checked against the host.
   * A live VM whose pid and start ticks match is adopted as it is (running or paused, no
   * restart); a creating row (the supervisor died mid-create) is undone and dropped; a VM whose
   * processes are gone becomes stopped (row kept, logged).
   *
   * Before that, the configured driver binary is copied into its versioned dir (if missing) and
   * becomes the binary of new VMs; after it, version dirs no VM uses are pruned.
   */
  async adopt(): Promise<AdoptionReport> {
    this.driverVersion = await this.driver.version();
    if (this.binaries) {
      const copy = this.binaries.install(this.driver.name, this.driverVersion, this.driver.configuredBinary());
      this.driver.useBinary(copy);
      this.log.info({ binary: copy, driver_version: this.driverVersion }, 'driver binary in use');
    }
    const report: AdoptionReport = { adopted: [], stopped: [], undone: [], failed: [], prunedBinaries: [] };
    for (const rec of this.store.list()) {
      const log = this.log.child({ vm_id: rec.vmId });
      try {
        await this.locks.run(rec.vmId, async () => {
          if (rec.state === 'creating') {
            await this.driver.destroy(refOf(rec));
            this.store.delete(rec.vmId);
            report.undone.push(rec.vmId);
            log.warn('adopt: found a half-created VM; undone and dropped');
            return;
          }
          const before = rec.state;
          const after = await this.refresh(rec);
          await this.driver.adopt?.(refOf(after.state === 'stopped' ? rec : after), after.state !== 'stopped');
          if (after.state === 'stopped') {
            report.stopped.push(rec.vmId);
            if (before !== 'stopped') log.warn({ was: before }, 'adopt: VM processes are gone; marked stopped');
          } else {
            report.adopted.push(rec.vmId);
            log.info({ state: after.state, vm_pid: after.pid }, 'adopt: VM adopted');
          }
        });
      } catch (err) {
        report.failed.push(rec.vmId);
        log.error({ err }, 'adopt: could not check VM; left as recorded');
      }
    }
    report.prunedBinaries = this.pruneBinaries();
    // after the VM rows were settled: a slot whose VM is no longer in the table is freed
    await this.network?.start(new Map(this.store.list().map((r) => [r.vmId, r.state === 'running' || r.state === 'paused' ? r.pid : 0])));
    return report;
  }

  /**
   * pruneBinaries removes the versioned driver binary dirs that no VM in the table uses and
   * that are not the current one. Never throws (a failure is logged).
   */
  pruneBinaries(): string[] {
    if (!this.binaries) return [];
    try {
      const inUse = [this.driver.currentBinary(), ...this.store.list().map((r) => r.driverBinary ?? '')];
      const removed = this.binaries.prune(inUse);
      if (removed.length) this.log.info({ removed }, 'pruned unused driver binaries');
      return removed;
    } catch (err) {
      this.log.warn({ err }, 'could not prune driver binaries');
      return [];
    }
  }

  /**
   * create validates, persists a `creating` row, lets the driver start the VM and persists it
   * `running`. Idempotent on vmId: the same spec returns the existing VM; another spec throws
   * AlreadyExistsError. InvalidArgumentError for bad input, FailedPreconditionError when a
   * drive or the template is missing; a driver failure is undone (row dropped) and rethrown.
   */
  async create(vmId: string, spec: VmSpec | undefined): Promise<VmRecord> {
    validateVmSpec(vmId, spec);
    return this.locks.run(vmId, async () => {
      const existing = this.store.get(vmId);
      if (existing) {
        if (canonicalSpec(existing.spec) !== canonicalSpec(spec)) {
          throw new AlreadyExistsError(`vm ${vmId} exists with a different spec`);
        }
        return this.refresh(existing);
      }
      checkHostPaths(spec);
      const rec: VmRecord = {
        schema: VM_RECORD_SCHEMA,
        vmId,
        state: 'creating',
        pid: 0,
        startTimeTicks: 0,
        driver: this.driver.name,
        driverVersion: this.driverVersion,
        spec,
        createdAtMs: Date.now(),
        apiSocket: '',
        driverBinary: this.driver.currentBinary(),
      };
      if (spec.network && !this.network) throw new FailedPreconditionError(`spec.network: this supervisor has no network configured`);
      this.store.put(rec);
      const log = this.log.child({ vm_id: vmId });
      let net: VmNetworkInfo | undefined;
      let netFrom = '';
      try {
        if (spec.network) {
          netFrom = this.network!.forSlot(spec.network.slot)?.state ?? '';
          net = await this.network!.acquire(vmId, spec.network);
        }
      } catch (err) {
        this.store.delete(vmId);
        throw err;
      }
      try {
        const started = await this.driver.create(vmId, spec, this.effectiveResources(spec), net);
        const { pid, startTimeTicks } = started.process;
        const running: VmRecord = { ...rec, state: 'running', pid, startTimeTicks, apiSocket: started.apiSocket, isolation: [...(started.isolation ?? [])] };
        this.store.put(running);
        log.info({ vm_pid: pid, binary: rec.driverBinary }, 'vm created');
        return running;
      } catch (err) {
        // a slot that was reserved for the owner stays reserved; any other is freed
        if (net) await this.network!.release(vmId, netFrom === 'reserved').catch((e: unknown) => log.error({ err: e }, 'could not release the network slot of a failed create'));
        this.store.delete(vmId);
        log.warn('vm create failed; undone');
        throw hostFailure(log, err, `create vm ${vmId}`);
      }
    });
  }

  /** get returns vmId with its live state. NotFoundError when there is no such VM. */
  async get(vmId: string): Promise<VmRecord> {
    requireResourceId('vm_id', vmId);
    return this.refresh(this.require(vmId));
  }

  /**
   * requireArmable checks that vmId may be armed for a freeze (ArmFreeze): it is in the table
   * and RUNNING there (no driver call), and the driver serves freeze ports (hasPort).
   * InvalidArgumentError (vm_id), NotFoundError, FailedPreconditionError; nothing changes.
   */
  requireArmable(vmId: string, hasPort: boolean): void {
    requireResourceId('vm_id', vmId);
    const rec = this.require(vmId);
    if (!hasPort || !this.driver.features.includes(VMM_FEATURES.freezePort)) throw new FailedPreconditionError(`vm ${vmId}: the ${this.driver.name} driver has no freeze port; nothing armed`);
    if (rec.state !== 'running') throw new FailedPreconditionError(`vm ${vmId} is ${rec.state}, not running; nothing armed`);
  }

  /** hasVm says whether the VM table has a row for vmId (creating ones included: their row is written before their network slot). */
  hasVm(vmId: string): boolean {
    return this.store.get(vmId) !== undefined;
  }

  /** list returns every VM with its live state, ordered by vm id. */
  async list(): Promise<VmRecord[]> {
    const out: VmRecord[] = [];
    for (const rec of this.store.list()) out.push(await this.refresh(rec));
    return out;
  }

  /** pause freezes a running VM. NotFoundError; FailedPreconditionError unless running. */
  pause(vmId: string): Promise<VmRecord> {
    return this.transition(vmId, 'running', 'paused', (rec) => this.driver.pause(refOf(rec)));
  }

  /** resume thaws a paused VM. NotFoundError; FailedPreconditionError unless paused. */
  resume(vmId: string): Promise<VmRecord> {
    return this.transition(vmId, 'paused', 'running', (rec) => this.driver.resume(refOf(rec)));
  }

  /**
   * stop ends the VM's processes (SIGTERM, SIGKILL after timeoutMs; 0 = the default) and
   * records it stopped. Idempotent. NotFoundError when there is no such VM;
   * FailedPreconditionError while it is still being created. signal (the caller's) ends the
   * wait after SIGTERM with an AbortError (CANCELLED); a retry finishes the stop.
   */
  async stop(vmId: string, timeoutMs: number, signal?: AbortSignal): Promise<VmRecord> {
    requireResourceId('vm_id', vmId);
    return this.locks.run(vmId, async () => {
      const rec = await this.refresh(this.require(vmId));
      if (rec.state === 'creating') throw new FailedPreconditionError(`vm ${vmId} is CREATING`);
      if (rec.state === 'stopped') return rec;
      await this.onHost(`stop vm ${vmId}`, () => this.driver.stop(refOf(rec), timeoutMs > 0 ? timeoutMs : this.defaults.stopTimeoutMs, signal));
      const stopped: VmRecord = { ...rec, state: 'stopped', pid: 0, startTimeTicks: 0 };
      this.store.put(stopped);
      this.log.info({ vm_id: vmId }, 'vm stopped');
      return stopped;
    });
  }

  /**
   * delete stops the VM if needed, removes its host state and drops its row, then prunes the
   * driver binary dirs no VM uses any more when the VM used another binary than the current
   * one (only then can a dir have lost its last user: the current one is always kept; a drain
   * of N VMs read the whole table N times for nothing). Idempotent: returns false when no VM
   * had that id.
   */
  async delete(vmId: string, keepNetwork = false): Promise<boolean> {
    requireResourceId('vm_id', vmId);
    let binary: string | undefined;
    const existed = await this.locks.run(vmId, async () => {
      const rec = this.store.get(vmId);
      if (!rec) return false;
      binary = rec.driverBinary;
      if (rec.state !== 'creating') {
        const live = await this.refresh(rec);
        if (live.state !== 'stopped') await this.onHost(`delete vm ${vmId}`, () => this.driver.stop(refOf(rec), this.defaults.stopTimeoutMs));
      }
      await this.onHost(`delete vm ${vmId}`, () => this.driver.destroy(refOf(rec)));
      if (this.network) await this.onHost(`delete vm ${vmId}: network`, () => this.network!.release(vmId, keepNetwork));
      this.store.delete(vmId);
      this.log.info({ vm_id: vmId }, 'vm deleted');
      return true;
    });
    if (existed && this.binaries && binary !== this.driver.currentBinary()) this.pruneBinaries();
    return existed;
  }

  /**
   * updateNetwork replaces vmId's egress policy (persisted, then one nft transaction).
   * InvalidArgumentError (bad id or policy), NotFoundError (no VM), FailedPreconditionError (no network).
   */
  async updateNetwork(vmId: string, egress: VmNetworkInfo['egress'] | undefined): Promise<VmNetworkInfo> {
    requireResourceId('vm_id', vmId);
    return this.locks.run(vmId, async () => {
      this.require(vmId);
      if (!this.network) throw new FailedPreconditionError(`vm ${vmId} has no network (none configured)`);
      return this.network.update(vmId, egress);
    });
  }

  /** effectiveResources applies the node defaults to a spec's zero resource fields. */
  effectiveResources(spec: VmSpec): EffectiveResources {
    return {
      vcpus: spec.resources.vcpus || this.defaults.vcpus,
      memoryMib: spec.resources.memoryMib || this.defaults.memoryMib,
      pids: spec.resources.pids || this.defaults.pids || DEFAULT_PIDS,
    };
  }

  /** onHost runs a driver call; a host failure becomes a short INTERNAL, logged in full ({@link hostFailure}). */
  private async onHost<T>(what: string, fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (err) {
      throw hostFailure(this.log, err, what);
    }
  }

  private require(vmId: string): VmRecord {
    const rec = this.store.get(vmId);
    if (!rec) throw new NotFoundError(`vm ${vmId} not found`);
    return rec;
  }

  private async transition(vmId: string, from: VmState, to: VmState, act: (rec: VmRecord) => Promise<void>): Promise<VmRecord> {
    requireResourceId('vm_id', vmId);
    return this.locks.run(vmId, async () => {
      const rec = await this.refresh(this.require(vmId));
      if (rec.state !== from) {
        throw new FailedPreconditionError(`vm ${vmId} is ${rec.state.toUpperCase()}, not ${from.toUpperCase()}`);
      }
      await this.onHost(`${to === 'paused' ? 'pause' : 'resume'} vm ${vmId}`, () => act(rec));
      const next: VmRecord = { ...rec, state: to };
      this.store.put(next);
      this.log.info({ vm_id: vmId, state: to }, `vm ${to}`);
      return next;
    });
  }

  /**
   * refresh checks rec against the host and returns it with its live state. A changed state is
   * persisted only if the stored row is still the one that was read (a concurrent operation
   * persists its own result). Creating and stopped rows are returned as they are.
   */
  private async refresh(rec: VmRecord): Promise<VmRecord> {
    if (rec.state === 'creating' || rec.state === 'stopped') return rec;
    const live: LiveStatus = await this.onHost(`inspect vm ${rec.vmId}`, () => this.driver.inspect(refOf(rec)));
    const next: VmRecord =
      live.state === 'stopped' ? { ...rec, state: 'stopped', pid: 0, startTimeTicks: 0 } : { ...rec, state: live.state, pid: live.process.pid, startTimeTicks: live.process.startTimeTicks };
    if (next.state !== rec.state || next.pid !== rec.pid) {
      if (live.state === 'stopped') this.log.warn({ vm_id: rec.vmId, was: rec.state, detail: live.detail }, 'vm found stopped');
      else this.log.warn({ vm_id: rec.vmId, was: rec.state, now: next.state }, 'vm state changed outside the supervisor');
      this.persistIfCurrent(rec, next);
    }
    return next;
  }

  private persistIfCurrent(prev: VmRecord, next: VmRecord): void {
    const cur = this.store.get(prev.vmId);
    if (cur && cur.state === prev.state && cur.pid === prev.pid) this.store.put(next);
  }
}

/** refOf is what a driver call needs to know about the VM of rec. */
function refOf(rec: VmRecord): VmRef {
  return {
    vmId: rec.vmId,
    process: { pid: rec.pid, startTimeTicks: rec.startTimeTicks },
    binary: rec.driverBinary ?? '',
    apiSocket: rec.apiSocket ?? '',
  };
}
