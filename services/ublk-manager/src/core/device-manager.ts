/**
 * DeviceManager: the state logic of the ublk-manager, and here its CRUD: CreateDevice,
 * GetDevice, ListDevices, DeleteDevice. The other concepts are their own files, on one shared
 * {@link DeviceCore} (table, driver, images, locks, handover state):
 *
 * - clone.ts: CloneDevice;
 * - device-handover.ts: Quiesce / Resume / Release / Recover / AbortHandover of one device;
 * - slot-takeover.ts: taking over the devices of a slot that is not running;
 * - adoption.ts: start-time adoption and the sweep that converges released rows;
 * - handover.ts: HandoverAll (the new slot drives the per-device steps).
 *
 * This class is the one entry point: it wires the parts and delegates to them.
 *
 * Crash safety: a row is written (state `creating`, fsynced) before the image is made and is
 * marked `ready` only after the device is attached; a delete marks the row `deleting` before
 * it detaches and removes the image, and drops the row last. So a crash at any step leaves a
 * row that {@link DeviceManager.adopt} finishes at the next start. Calls on one device id
 * run one at a time.
 */
import { AlreadyExistsError, FailedPreconditionError, NotFoundError } from '@sandnode/shared';
import { Adoption, type AdoptionReport, type ConvergeReport } from './adoption';
import { DeviceClone, type CloneInput, type CloneOutcome } from './clone';
import { DeviceCore, type DeviceManagerOptions } from './device-core';
import { DeviceHandover, type RecoverInput } from './device-handover';
import { SlotTakeover, type TakeoverReport } from './slot-takeover';
import { EXCLUSIVE_USE } from './driver';
import type { AttachedDevice, Device, DeviceRecord, DeviceSpec, DriverCapability, DriverName } from './types';
import { describeSpec, sameSpec, validateCloneSize, validateCreateInput, validateDeviceId, type CreateDeviceInput } from './validate';

/** Longest DeleteDevice waits for an exclusive claim without a mount to go away, ms. */
export const EXCLUSIVE_SETTLE_MS = 2000;
const EXCLUSIVE_SETTLE_POLL_MS = 50;

export { explain } from './explain';
export { DEFAULT_RELEASE_TIMEOUT_MS, type DeviceManagerOptions } from './device-core';
export { DEFAULT_QUIESCE_TIMEOUT_MS, MAX_QUIESCE_TIMEOUT_MS, type RecoverInput } from './device-handover';
export type { AdoptionReport, ConvergeReport } from './adoption';
export type { CloneInput, CloneOutcome } from './clone';
export type { TakeoverReport } from './slot-takeover';

/** What GetCapabilities reports. */
export interface ManagerCapabilities {
  driver: DriverName;
  capabilities: DriverCapability[];
  /** Largest size CreateDevice accepts, in bytes. */
  maxDeviceSizeBytes: number;
}

/** DeviceManager creates, reports, deletes, clones, hands over and adopts devices. */
export class DeviceManager {
  private readonly core: DeviceCore;
  private readonly cloner: DeviceClone;
  private readonly handover: DeviceHandover;
  private readonly takeover: SlotTakeover;
  private readonly adoption: Adoption;

  constructor(opts: DeviceManagerOptions) {
    this.core = new DeviceCore(opts);
    this.adoption = new Adoption(this.core);
    this.cloner = new DeviceClone(this.core);
    this.handover = new DeviceHandover(this.core, this.adoption);
    this.takeover = new SlotTakeover(this.core, this.adoption);
    this.core.onReclaim(() => this.takeover.reclaimIfSuccessorStopped());
  }

  /** slot is this manager's slot ("a", "b" or "default"). */
  get slot(): string {
    return this.core.peers.self;
  }

  /** capabilities reports the driver, its handover capabilities and the size limit in bytes. */
  capabilities(): ManagerCapabilities {
    return { driver: this.core.driver.name, capabilities: this.core.driver.capabilities(), maxDeviceSizeBytes: this.core.limits.maxDeviceSizeBytes };
  }

  /**
   * create makes and attaches a device, or returns the existing one when the id already has
   * a device of the same spec (re-attaching it if it was detached).
   * Errors: InvalidArgumentError (bad input, nothing changed), AlreadyExistsError (same id,
   * different spec), NotFoundError (source_image missing), ResourceExhaustedError (no free
   * device node or disk space), FailedPreconditionError (a stray image file of that name),
   * InternalError (a host command failed). On failure everything done so far is undone.
   */
  async create(input: CreateDeviceInput): Promise<Device> {
    const spec = validateCreateInput(input, this.core.limits);
    await this.core.refuseIfRetiring('CreateDevice');
    return this.core.locks.run(spec.deviceId, () => {
      this.core.refuseIfRetiringNow('CreateDevice');
      return this.core.track(this.createLocked(spec));
    });
  }

  private async createLocked(spec: DeviceSpec): Promise<Device> {
    const existing = this.core.store.get(spec.deviceId);
    this.core.refuseDuringHandover(spec.deviceId, existing, 'CreateDevice');
    if (existing?.state === 'ready') {
      if (!sameSpec(existing, spec)) {
        throw new AlreadyExistsError(`device_id "${spec.deviceId}" exists with a different spec (${describeSpec(existing)}; requested ${describeSpec(spec)})`);
      }
      return this.core.ensureAttached(existing);
    }
    if (existing) {
      this.core.log.warn({ device_id: existing.deviceId, state: existing.state }, 'cleaning up an interrupted create or delete before creating');
      await this.core.teardown(existing).catch((err: unknown) => {
        throw this.core.explain(err, `CreateDevice "${spec.deviceId}": cleaning up the interrupted ${existing.state} row failed`);
      });
    }
    let sizeBytes = spec.sizeBytes;
    if (spec.sourceImage !== '') {
      const info = await this.core.images.inspectSource(spec.sourceImage);
      validateCloneSize(spec.sourceImage, info.sizeBytes, this.core.limits);
      sizeBytes = info.sizeBytes;
    }
    return this.make(spec, sizeBytes);
  }

  /** get returns one device with its live state. Errors: InvalidArgumentError, NotFoundError. */
  async get(deviceId: string): Promise<Device> {
    validateDeviceId(deviceId);
    await this.core.refuseIfRetiring('GetDevice', deviceId);
    const rec = this.core.store.get(deviceId);
    if (!rec || rec.state !== 'ready') throw new NotFoundError(`device_id "${deviceId}": no such device`);
    const live = await this.core.locate(rec);
    if (live) return this.core.deviceFrom(rec, live);
    return this.core.toDevice(rec, new Map());
  }

  /**
   * list returns every device this slot owns with its live state, ordered by device id.
   * Released rows are not listed; those another slot now owns are dropped here.
   */
  async list(): Promise<Device[]> {
    if (this.core.isRetiring()) {
      await this.takeover.reclaimIfSuccessorStopped();
      // A create that passed the retiring check before it began must be listed (HandoverAll moves it).
      await Promise.allSettled([...this.core.creating]);
    }
    if (this.core.store.list().some((r) => r.state === 'released')) await this.adoption.converge({ takeBackAfterMs: this.core.releaseTimeoutMs });
    const index = await this.core.liveIndex();
    const out: Device[] = [];
    for (const rec of this.core.store.list()) if (rec.state === 'ready') out.push(await this.core.toDevice(rec, index));
    return out;
  }

  /**
   * delete detaches the device, removes its image and drops its row; resolves false when the
   * id has no device. Errors: InvalidArgumentError (bad id), FailedPreconditionError (mounted
   * or held; nothing changed), InternalError (detach or removal failed: a retry, or the next
   * start, finishes the delete).
   */
  /**
   * settledBusyReason is busyReason, waiting up to EXCLUSIVE_SETTLE_MS while the only reason is
   * an exclusive claim with no mount or holder behind it: when a sandbox's container has just
   * exited, the kernel drops its last reference to the filesystem on the device a moment later
   * (deferred fput / mount namespace teardown), and a DeleteSandbox right after DeleteVm met
   * EBUSY in about 1 of 12 deletes (the chaos run). A mount or a holder is answered at once.
   */
  private async settledBusyReason(devPath: string): Promise<string | undefined> {
    let why = await this.core.driver.busyReason(devPath);
    for (const t0 = Date.now(); why?.startsWith(EXCLUSIVE_USE) && Date.now() - t0 < EXCLUSIVE_SETTLE_MS;) {
      await new Promise((r) => setTimeout(r, EXCLUSIVE_SETTLE_POLL_MS));
      why = await this.core.driver.busyReason(devPath);
    }
    return why;
  }

  async delete(deviceId: string): Promise<boolean> {
    validateDeviceId(deviceId);
    await this.core.refuseIfRetiring('DeleteDevice', deviceId);
    return this.core.locks.run(deviceId, async () => {
      this.core.refuseIfRetiringNow('DeleteDevice', deviceId);
      const rec = this.core.store.get(deviceId);
      if (!rec) return false;
      this.core.refuseDuringHandover(deviceId, rec, 'DeleteDevice');
      const attached = await this.core.attachedTo(rec.backingFile);
      for (const a of attached) {
        const why = await this.settledBusyReason(a.path);
        if (why) throw new FailedPreconditionError(`device_id "${deviceId}": ${a.path} is ${why}; nothing changed`);
      }
      this.core.store.update(deviceId, { state: 'deleting' }, this.core.now());
      try {
        for (const a of attached) await this.core.driver.detach(a.path);
      } catch (err) {
        this.core.store.update(deviceId, { state: rec.state }, this.core.now());
        throw this.core.explain(err, `DeleteDevice "${deviceId}": detach failed`);
      }
      try {
        await this.core.images.remove(rec.backingFile);
      } catch (err) {
        throw this.core.explain(err, `DeleteDevice "${deviceId}": removing ${rec.backingFile} failed (a retry or the next start finishes the delete)`);
      }
      this.core.store.delete(deviceId);
      this.core.log.info({ device_id: deviceId, paths: attached.map((a) => a.path) }, 'device deleted');
      return true;
    });
  }

  /**
   * clone: CloneDevice; see {@link DeviceClone.clone} (codes, crash safety, idempotency).
   * opts.signal (the RPC's) stops and undoes a copy whose caller went away.
   */
  clone(input: CloneInput, opts: { signal?: AbortSignal } = {}): Promise<CloneOutcome> {
    return this.cloner.clone(input, opts);
  }

  /**
   * snapshot: SnapshotDevices; see {@link DeviceClone.snapshot} (clones persisted, not
   * attached; all or nothing). opts.signal (the RPC's) stops and undoes them.
   */
  snapshot(inputs: CloneInput[], opts: { signal?: AbortSignal } = {}): Promise<CloneOutcome[]> {
    return this.cloner.snapshot(inputs, opts);
  }

  /** quiesce: QuiesceDevice; see {@link DeviceHandover.quiesce}. Returns the device and the time it took, in ms. */
  quiesce(deviceId: string, timeoutMs: number): Promise<{ device: Device; quiesceMs: number }> {
    return this.handover.quiesce(deviceId, timeoutMs);
  }

  /** resume: ResumeDevice; see {@link DeviceHandover.resume}. */
  resume(deviceId: string): Promise<Device> {
    return this.handover.resume(deviceId);
  }

  /** release: ReleaseDevice; see {@link DeviceHandover.release}. Returns the device and the handover token. */
  release(deviceId: string): Promise<{ device: Device; token: string }> {
    return this.handover.release(deviceId);
  }

  /** recover: RecoverDevice; see {@link DeviceHandover.recover}. Returns the device and the time it took, in ms. */
  recover(input: RecoverInput, token: string): Promise<{ device: Device; recoverMs: number }> {
    return this.handover.recover(input, token);
  }

  /** abortHandover: AbortHandover; see {@link DeviceHandover.abortHandover}. */
  abortHandover(deviceId: string, token: string): Promise<Device> {
    return this.handover.abortHandover(deviceId, token);
  }

  /** adopt reconciles the table with the kernel at start; see {@link Adoption.adopt}. Never throws for one device. */
  adopt(): Promise<AdoptionReport> {
    return this.adoption.adopt();
  }

  /** converge applies the crash-convergence rule to released rows; see {@link Adoption.converge}. */
  converge(opts: { takeBackAfterMs: number }): Promise<ConvergeReport> {
    return this.adoption.converge(opts);
  }

  /** takeOverStoppedPeers applies the takeover rule; see {@link SlotTakeover.takeOverStoppedPeers}. */
  takeOverStoppedPeers(): Promise<TakeoverReport> {
    return this.takeover.takeOverStoppedPeers();
  }

  /** reclaimIfSuccessorStopped ends retiring when the successor slot stopped; see {@link SlotTakeover.reclaimIfSuccessorStopped}. */
  reclaimIfSuccessorStopped(): Promise<void> {
    return this.takeover.reclaimIfSuccessorStopped();
  }

  /** isRetiring says whether this slot is handing its devices to another slot. */
  isRetiring(): boolean {
    return this.core.isRetiring();
  }

  /** beginRetiring marks this slot as handing its devices to slot `to` ('' = unknown); see {@link DeviceCore.beginRetiring}. */
  beginRetiring(to: string): void {
    this.core.beginRetiring(to);
  }

  /** stop clears timers (quiesce holds, the release sweep); devices are left as they are. */
  stop(): void {
    this.handover.stop();
    this.adoption.stop();
  }

  /** make writes the row, makes the image, attaches it and marks the row ready; undoes on failure. */
  private async make(spec: DeviceSpec, sizeBytes: number): Promise<Device> {
    const id = spec.deviceId;
    const backingFile = this.core.images.imagePath(id);
    if (await this.core.images.exists(backingFile)) {
      // The row is always written before the image, so a file without a row is not ours to reuse.
      throw new FailedPreconditionError(`device_id "${id}": image ${backingFile} exists but no device owns it; remove it or pick another id (nothing changed)`);
    }
    const now = this.core.now();
    const rec: DeviceRecord = { ...spec, sizeBytes, state: 'creating', backingFile, path: '', createdAtMs: now, updatedAtMs: now, handoverToken: '', clonedFrom: '' };
    this.core.store.insert(rec);
    let step = 'make the image';
    let attached: AttachedDevice | undefined;
    let made: { method: string; reason: string } | undefined;
    try {
      if (spec.sourceImage !== '') {
        step = `clone ${spec.sourceImage}`;
        await this.core.images.clone(spec.sourceImage, backingFile);
      } else if (spec.filesystem === 'ext4' && this.core.images.createExt4) {
        step = 'make the empty ext4 image';
        made = await this.core.images.createExt4(backingFile, sizeBytes);
      } else {
        step = 'create the sparse image';
        await this.core.images.createEmpty(backingFile, sizeBytes);
        if (spec.filesystem === 'ext4') {
          step = 'format ext4';
          await this.core.images.formatExt4(backingFile);
        }
      }
      step = 'attach';
      attached = await this.core.driver.attach(backingFile, { readOnly: spec.readOnly });
      step = 'record the device';
      this.core.store.update(id, { state: 'ready', path: attached.path }, this.core.now());
    } catch (err) {
      await this.core.undoCreate(id, backingFile, attached);
      throw this.core.explain(err, `CreateDevice "${id}": ${step} failed`);
    }
    this.core.log.info(
      { device_id: id, path: attached.path, size_bytes: sizeBytes, source_image: spec.sourceImage || undefined, made_by: made?.method, mkfs_reason: made?.reason || undefined },
      'device created',
    );
    return this.core.deviceFrom({ ...rec, state: 'ready', path: attached.path }, attached);
  }
}
