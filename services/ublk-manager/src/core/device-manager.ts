/**
 * DeviceManager: the state logic of the ublk-manager. It keeps the device table, drives the
 * BlockDriver and ImageOps, and adopts what it finds at start.
 *
 * Crash safety: a row is written (state `creating`, fsynced) before the image is made and is
 * marked `ready` only after the device is attached; a delete marks the row `deleting` before
 * it detaches and removes the image, and drops the row last. So a crash at any step leaves a
 * row that {@link DeviceManager.adopt} finishes at the next start. Calls on one device id
 * run one at a time.
 */
import {
  AlreadyExistsError,
  FailedPreconditionError,
  InternalError,
  InvalidArgumentError,
  NotFoundError,
  ResourceExhaustedError,
  UnavailableError,
  type Logger,
} from '@sandnode/shared';
import { randomBytes } from 'node:crypto';
import type { BlockDriver, CloneResult, ImageOps } from './driver';
import { KeyedMutex } from '@sandnode/shared';
import { failpoint } from './failpoints';
import { NoPeers, type DeviceStore, type SlotPeers } from './store';
import type { AttachedDevice, Device, DeviceRecord, DeviceSpec, DriverCapability, DriverName } from './types';
import { describeSpec, sameSpec, validateCloneSize, validateCreateInput, validateDeviceId, type CreateDeviceInput, type DeviceLimits } from './validate';

/** Dependencies and limits of a DeviceManager. */
export interface DeviceManagerOptions {
  store: DeviceStore;
  driver: BlockDriver;
  images: ImageOps;
  log: Logger;
  limits: DeviceLimits;
  /** Clock in Unix epoch ms (tests pass a fake). */
  now?: () => number;
  /** The other slots' tables and the cross-slot lock (default: none). */
  peers?: SlotPeers;
  /**
   * A `released` row that no other slot has taken over after this long (ms) is taken back by
   * the running manager (default DEFAULT_RELEASE_TIMEOUT_MS).
   */
  releaseTimeoutMs?: number;
}

/** Default quiesce hold when QuiesceDevice says 0, in ms. */
export const DEFAULT_QUIESCE_TIMEOUT_MS = 5000;
/** Longest quiesce hold QuiesceDevice accepts, in ms. */
export const MAX_QUIESCE_TIMEOUT_MS = 30_000;
/** Default time after which a running manager takes back a released, unclaimed device, in ms. */
export const DEFAULT_RELEASE_TIMEOUT_MS = 30_000;

/** What {@link DeviceManager.converge} did, by device id. */
export interface ConvergeReport {
  /** Released rows whose device another slot owns: dropped. */
  dropped: string[];
  /** Released rows no other slot owns: owned (ready) again. */
  takenBack: string[];
}

/** What {@link DeviceManager.takeOverStoppedPeers} did, by device id. */
export interface TakeoverReport {
  /** Other slots found not running (their tables were examined). */
  stopped: string[];
  /** Devices of a stopped slot (ready, or released and owned by no one) now owned here. */
  takenOver: string[];
  /** Rows of a stopped slot dropped because this slot owns the device (an interrupted takeover or a stale release). */
  dropped: string[];
  /** Rows a stopped slot left `creating`/`deleting`: moved here and cleaned up as adoption does. */
  cleanedUp: string[];
  /** Rows left where they are (the error is logged). */
  failed: string[];
}

/** What RecoverDevice needs to know about the released device. */
export interface RecoverInput {
  deviceId: string;
  /** Device node as the old slot reported it. */
  path: string;
  /** Backing file as the old slot reported it (must be `<imagesDir>/<id>.img`). */
  backingFile: string;
}

/** A CloneDevice request in domain terms, before validation. */
export interface CloneInput {
  /** The new device's id (RESOURCE_ID_RE). */
  deviceId: string;
  /** The device to clone. */
  sourceDeviceId: string;
  /** The caller holds the source's filesystem frozen or its VM paused for the whole call. */
  sourceQuiesced: boolean;
  /** Attach the clone read-only. */
  readOnly: boolean;
}

/** What {@link DeviceManager.clone} returns. */
export interface CloneOutcome {
  /** The attached clone. */
  device: Device;
  /** Time the image copy took (cp), in ms; 0 when an existing clone was returned. */
  cloneMs: number;
  /** Time of the whole call under the locks (checks, copy, fsync, rename, rows, attach), in ms. */
  totalMs: number;
  /** True when the extents were shared (FICLONE) rather than copied. */
  reflinked: boolean;
  /** Allocated bytes of the source image (st_blocks * 512); 0 when an existing clone was returned. */
  copiedBytes: number;
  /** False when an existing clone of the same source was returned (nothing done). */
  created: boolean;
}

/** What GetCapabilities reports. */
export interface ManagerCapabilities {
  driver: DriverName;
  capabilities: DriverCapability[];
  /** Largest size CreateDevice accepts, in bytes. */
  maxDeviceSizeBytes: number;
}

/** What {@link DeviceManager.adopt} did, by device id. */
export interface AdoptionReport {
  /** Rows whose device was attached: kept as they are. */
  kept: string[];
  /** Rows whose image was present but not attached: attached again (new path logged). */
  reattached: string[];
  /** Rows left `creating` or `deleting` by a crash: detached, image removed, row dropped. */
  cleanedUp: string[];
  /** Rows whose image file is gone: kept (reported with state missing) until deleted. */
  missing: string[];
  /** Rows the manager could not adopt (the error is logged). */
  failed: string[];
  /** Temp files of clones interrupted by a crash (no slot's row is `creating` them): removed. */
  removedTemps: string[];
}

/**
 * explain wraps err with context, keeping its gRPC meaning for the typed errors a caller can
 * act on (RESOURCE_EXHAUSTED, NOT_FOUND, INVALID_ARGUMENT, FAILED_PRECONDITION); anything else
 * becomes INTERNAL with the message (a host command or file operation failed).
 */
export function explain(err: unknown, context: string): Error {
  const msg = `${context}: ${err instanceof Error ? err.message : String(err)}`;
  if (err instanceof ResourceExhaustedError) return new ResourceExhaustedError(msg);
  if (err instanceof NotFoundError) return new NotFoundError(msg);
  if (err instanceof InvalidArgumentError) return new InvalidArgumentError(msg);
  if (err instanceof FailedPreconditionError) return new FailedPreconditionError(msg);
  return new InternalError(msg);
}

/** DeviceManager creates, reports, deletes and adopts devices. */
export class DeviceManager {
  private readonly store: DeviceStore;
  private readonly driver: BlockDriver;
  private readonly images: ImageOps;
  private readonly log: Logger;
  private readonly limits: DeviceLimits;
  private readonly now: () => number;
  private readonly locks = new KeyedMutex();
  private readonly peers: SlotPeers;
  private readonly releaseTimeoutMs: number;
  /** Quiesced devices: id -> the timer that resumes them by itself. */
  private readonly quiesced = new Map<string, NodeJS.Timeout>();
  private sweepTimer: NodeJS.Timeout | undefined;
  /**
   * Retiring: this slot is handing its devices to another slot (set by the first
   * ReleaseDevice served or by HandoverAll's ListDevices; '' = the slot is not known). While
   * set, CreateDevice is UNAVAILABLE. See {@link beginRetiring}.
   */
  private retiringTo: string | undefined;
  /** Devices this slot released to another slot and did not get back: calls naming them are UNAVAILABLE. */
  private readonly handedOver = new Set<string>();
  /** CreateDevice calls past the retiring check; a retiring ListDevices waits for them. */
  private readonly creating = new Set<Promise<unknown>>();

  constructor(opts: DeviceManagerOptions) {
    this.peers = opts.peers ?? new NoPeers();
    this.releaseTimeoutMs = opts.releaseTimeoutMs ?? DEFAULT_RELEASE_TIMEOUT_MS;
    this.store = opts.store;
    this.driver = opts.driver;
    this.images = opts.images;
    this.log = opts.log;
    this.limits = opts.limits;
    this.now = opts.now ?? Date.now;
  }

  /** slot is this manager's slot ("a", "b" or "default"). */
  get slot(): string {
    return this.peers.self;
  }

  /** capabilities reports the driver, its handover capabilities and the size limit in bytes. */
  capabilities(): ManagerCapabilities {
    return { driver: this.driver.name, capabilities: this.driver.capabilities(), maxDeviceSizeBytes: this.limits.maxDeviceSizeBytes };
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
    const spec = validateCreateInput(input, this.limits);
    await this.refuseIfRetiring('CreateDevice');
    return this.locks.run(spec.deviceId, () => {
      this.refuseIfRetiringNow('CreateDevice');
      const work = this.createLocked(spec);
      this.creating.add(work);
      return work.finally(() => this.creating.delete(work));
    });
  }

  private async createLocked(spec: DeviceSpec): Promise<Device> {
    const existing = this.store.get(spec.deviceId);
    this.refuseDuringHandover(spec.deviceId, existing, 'CreateDevice');
    if (existing?.state === 'ready') {
      if (!sameSpec(existing, spec)) {
        throw new AlreadyExistsError(
          `device_id "${spec.deviceId}" exists with a different spec (${describeSpec(existing)}; requested ${describeSpec(spec)})`,
        );
      }
      return this.ensureAttached(existing);
    }
    if (existing) {
      this.log.warn({ device_id: existing.deviceId, state: existing.state }, 'cleaning up an interrupted create or delete before creating');
      await this.teardown(existing);
    }
    let sizeBytes = spec.sizeBytes;
    if (spec.sourceImage !== '') {
      const info = await this.images.inspectSource(spec.sourceImage);
      validateCloneSize(spec.sourceImage, info.sizeBytes, this.limits);
      sizeBytes = info.sizeBytes;
    }
    return this.make(spec, sizeBytes);
  }

  /**
   * clone makes input.deviceId a copy of the current contents of the device
   * input.sourceDeviceId (CloneDevice): the source's image is copied by ImageOps.clone
   * (`cp --reflink=always` = FICLONE where the file system has it, else
   * `cp --reflink=auto --sparse=always`; holes stay holes) under a temp name, fsynced and
   * renamed; the row (`cloned_from` = the source, the source's size and filesystem) is
   * persisted `ready` before the device is attached like a new one (read-only when asked).
   * Both ids are locked (in id order) for the whole call. The source is only read: it is not
   * flushed or fsynced (the caller's freeze did that); its row is not changed.
   *
   * Crash safety: the row is written `creating` before the copy, so a crash before it is
   * `ready` leaves that row and at most a temp file or the image, which adoption removes; a
   * crash after it is `ready` and before the attach is finished by adoption (re-attach).
   *
   * Idempotent: when deviceId already is a clone of the same source with the same read_only,
   * that device is returned (re-attached if detached) with cloneMs 0 and created false.
   * Errors (nothing changed unless said): InvalidArgumentError (bad ids, deviceId ==
   * sourceDeviceId), NotFoundError (no such source), FailedPreconditionError (the source is
   * attached read-write and sourceQuiesced is false; the source's image is missing; a stray
   * image file of the new id), AlreadyExistsError (deviceId exists and is not a clone of that
   * source with that read_only), UnavailableError (this slot is handing its devices over, or
   * either device is quiesced/released for a handover), ResourceExhaustedError (no disk space
   * or free device node: the partial clone is removed), InternalError (a host command failed;
   * undone).
   */
  async clone(input: CloneInput): Promise<CloneOutcome> {
    const deviceId = validateDeviceId(input.deviceId);
    const sourceId = validateDeviceId(input.sourceDeviceId, 'source_device_id');
    if (deviceId === sourceId) throw new InvalidArgumentError(`source_device_id: "${sourceId}" is device_id itself; a device cannot be cloned onto itself`);
    await this.refuseIfRetiring('CloneDevice');
    await this.refuseIfRetiring('CloneDevice', sourceId);
    const [first, second] = deviceId < sourceId ? [deviceId, sourceId] : [sourceId, deviceId];
    return this.locks.run(first, () =>
      this.locks.run(second, () => {
        this.refuseIfRetiringNow('CloneDevice');
        const work = this.cloneLocked({ ...input, deviceId, sourceDeviceId: sourceId });
        this.creating.add(work);
        return work.finally(() => this.creating.delete(work));
      }),
    );
  }

  private async cloneLocked(input: CloneInput): Promise<CloneOutcome> {
    const t0 = performance.now();
    const { deviceId: id, sourceDeviceId: sourceId } = input;
    const existing = this.store.get(id);
    this.refuseDuringHandover(id, existing, 'CloneDevice');
    if (existing?.state === 'ready') {
      if (existing.clonedFrom !== sourceId || existing.readOnly !== input.readOnly) {
        const what = existing.clonedFrom ? `a clone of "${existing.clonedFrom}"` : 'not a clone';
        throw new AlreadyExistsError(
          `device_id "${id}" exists (${what}, read_only=${existing.readOnly}); requested a clone of "${sourceId}" read_only=${input.readOnly}`,
        );
      }
      const device = await this.ensureAttached(existing);
      return { device, cloneMs: 0, totalMs: performance.now() - t0, reflinked: false, copiedBytes: 0, created: false };
    }
    const src = this.store.get(sourceId);
    this.refuseDuringHandover(sourceId, src, 'CloneDevice');
    if (!src || src.state !== 'ready') throw new NotFoundError(`source_device_id "${sourceId}": no such device`);
    const live = await this.locate(src);
    if (live && !live.readOnly && !input.sourceQuiesced) {
      throw new FailedPreconditionError(
        `CloneDevice "${id}": source "${sourceId}" is attached read-write at ${live.path}; freeze its filesystem (podd Quiesce) or pause its VM and set source_quiesced, or detach it; nothing changed`,
      );
    }
    if (!live && !(await this.images.exists(src.backingFile))) {
      throw new FailedPreconditionError(`CloneDevice "${id}": the image of source "${sourceId}" (${src.backingFile}) is missing; nothing changed`);
    }
    if (existing) {
      this.log.warn({ device_id: id, state: existing.state }, 'cleaning up an interrupted create or delete before cloning');
      await this.teardown(existing);
    }
    const backingFile = this.images.imagePath(id);
    if (await this.images.exists(backingFile)) {
      throw new FailedPreconditionError(`device_id "${id}": image ${backingFile} exists but no device owns it; remove it or pick another id (nothing changed)`);
    }
    const now = this.now();
    const rec: DeviceRecord = {
      deviceId: id,
      state: 'creating',
      sizeBytes: src.sizeBytes,
      sourceImage: '',
      filesystem: src.filesystem,
      readOnly: input.readOnly,
      backingFile,
      path: '',
      createdAtMs: now,
      updatedAtMs: now,
      handoverToken: '',
      clonedFrom: sourceId,
    };
    this.store.insert(rec);
    let step = `copy ${src.backingFile}`;
    let copy: CloneResult;
    let attached: AttachedDevice | undefined;
    let persisted = false;
    try {
      copy = await this.images.clone(src.backingFile, backingFile);
      step = 'record the device';
      this.store.update(id, { state: 'ready' }, this.now());
      persisted = true;
      failpoint('ublk.clone.after-persist');
      step = 'attach';
      attached = await this.driver.attach(backingFile, { readOnly: input.readOnly });
      step = 'record the device path';
      this.store.update(id, { path: attached.path }, this.now());
    } catch (err) {
      if (persisted) this.store.update(id, { state: 'creating' }, this.now());
      await this.undoCreate(id, backingFile, attached);
      throw explain(err, `CloneDevice "${id}" from "${sourceId}": ${step} failed`);
    }
    const totalMs = performance.now() - t0;
    this.log.info(
      {
        device_id: id,
        cloned_from: sourceId,
        path: attached.path,
        size_bytes: rec.sizeBytes,
        copied_bytes: copy.sourceAllocatedBytes,
        reflinked: copy.reflinked,
        clone_ms: copy.copyMs,
        sync_ms: copy.syncMs,
        total_ms: totalMs,
        source_quiesced: input.sourceQuiesced,
      },
      'device cloned',
    );
    return {
      device: this.deviceFrom({ ...rec, state: 'ready', path: attached.path }, attached),
      cloneMs: copy.copyMs,
      totalMs,
      reflinked: copy.reflinked,
      copiedBytes: copy.sourceAllocatedBytes,
      created: true,
    };
  }

  /** get returns one device with its live state. Errors: InvalidArgumentError, NotFoundError. */
  async get(deviceId: string): Promise<Device> {
    validateDeviceId(deviceId);
    await this.refuseIfRetiring('GetDevice', deviceId);
    const rec = this.store.get(deviceId);
    if (!rec || rec.state !== 'ready') throw new NotFoundError(`device_id "${deviceId}": no such device`);
    const live = await this.locate(rec);
    if (live) return this.deviceFrom(rec, live);
    return this.toDevice(rec, new Map());
  }

  /**
   * list returns every device this slot owns with its live state, ordered by device id.
   * Released rows are not listed; those another slot now owns are dropped here.
   */
  async list(): Promise<Device[]> {
    if (this.isRetiring()) {
      await this.reclaimIfSuccessorStopped();
      // A create that passed the retiring check before it began must be listed (HandoverAll moves it).
      await Promise.allSettled([...this.creating]);
    }
    if (this.store.list().some((r) => r.state === 'released')) await this.converge({ takeBackAfterMs: this.releaseTimeoutMs });
    const index = await this.liveIndex();
    const out: Device[] = [];
    for (const rec of this.store.list()) if (rec.state === 'ready') out.push(await this.toDevice(rec, index));
    return out;
  }

  /**
   * delete detaches the device, removes its image and drops its row; resolves false when the
   * id has no device. Errors: InvalidArgumentError (bad id), FailedPreconditionError (mounted
   * or held; nothing changed), InternalError (detach or removal failed: a retry, or the next
   * start, finishes the delete).
   */
  async delete(deviceId: string): Promise<boolean> {
    validateDeviceId(deviceId);
    await this.refuseIfRetiring('DeleteDevice', deviceId);
    return this.locks.run(deviceId, async () => {
      this.refuseIfRetiringNow('DeleteDevice', deviceId);
      const rec = this.store.get(deviceId);
      if (!rec) return false;
      this.refuseDuringHandover(deviceId, rec, 'DeleteDevice');
      const attached = await this.attachedTo(rec.backingFile);
      for (const a of attached) {
        const why = await this.driver.busyReason(a.path);
        if (why) throw new FailedPreconditionError(`device_id "${deviceId}": ${a.path} is ${why}; nothing changed`);
      }
      this.store.update(deviceId, { state: 'deleting' }, this.now());
      try {
        for (const a of attached) await this.driver.detach(a.path);
      } catch (err) {
        this.store.update(deviceId, { state: rec.state }, this.now());
        throw explain(err, `DeleteDevice "${deviceId}": detach failed`);
      }
      try {
        await this.images.remove(rec.backingFile);
      } catch (err) {
        throw explain(err, `DeleteDevice "${deviceId}": removing ${rec.backingFile} failed (a retry or the next start finishes the delete)`);
      }
      this.store.delete(deviceId);
      this.log.info({ device_id: deviceId, paths: attached.map((a) => a.path) }, 'device deleted');
      return true;
    });
  }

  /**
   * adopt reconciles the table with the kernel at start: an attached device is kept; an image
   * that is present but not attached is attached again (the new path is logged); rows left
   * `creating` or `deleting` are cleaned up. Only devices backed by files in the images
   * directory are ever touched. Never throws for one device; failures are logged and reported.
   */
  async adopt(): Promise<AdoptionReport> {
    const report: AdoptionReport = { kept: [], reattached: [], cleanedUp: [], missing: [], failed: [], removedTemps: [] };
    const index = await this.liveIndex();
    const owned = new Set<string>();
    for (const rec of this.store.list()) {
      owned.add(rec.backingFile);
      await this.locks.run(rec.deviceId, async () => {
        const log = this.log.child({ device_id: rec.deviceId });
        try {
          if (rec.state === 'released') return; // handled by converge()
          if (rec.state !== 'ready') {
            await this.teardown(rec);
            log.info({ state: rec.state }, 'adoption: finished the cleanup of an interrupted create or delete');
            report.cleanedUp.push(rec.deviceId);
            return;
          }
          const live = index.get(rec.backingFile);
          if (live?.[0]) {
            if (live.length > 1) log.warn({ paths: live.map((a) => a.path) }, 'adoption: image is attached more than once; reporting the first');
            if (live[0].path !== rec.path) this.store.update(rec.deviceId, { path: live[0].path }, this.now());
            log.info({ path: live[0].path }, 'adoption: device attached, kept');
            report.kept.push(rec.deviceId);
          } else if (await this.images.exists(rec.backingFile)) {
            const a = await this.driver.attach(rec.backingFile, { readOnly: rec.readOnly });
            this.store.update(rec.deviceId, { path: a.path }, this.now());
            log.info({ path: a.path, previous_path: rec.path || undefined }, 'adoption: image was not attached; re-attached at a new path');
            report.reattached.push(rec.deviceId);
          } else {
            log.error({ backing_file: rec.backingFile }, 'adoption: the image file is missing; the device is reported as missing until deleted');
            report.missing.push(rec.deviceId);
          }
        } catch (err) {
          log.error({ err }, 'adoption failed for this device');
          report.failed.push(rec.deviceId);
        }
      });
    }
    await this.removeCloneTemps(report);
    for (const [file, devs] of index) {
      if (!owned.has(file)) {
        this.log.warn({ backing_file: file, paths: devs.map((d) => d.path) }, 'adoption: a device backed by the images dir has no row; left alone');
      }
    }
    this.log.info(report, 'adoption done');
    return report;
  }

  /**
   * quiesce lets in-flight I/O of the device complete and makes it durable (driver quiesce;
   * loop: fsync of the device node + fdatasync of the image), then holds the device quiesced
   * until resume, release or timeoutMs (0 = DEFAULT_QUIESCE_TIMEOUT_MS; then it resumes by
   * itself).
   * While quiesced, CreateDevice/DeleteDevice on it fail FAILED_PRECONDITION. A quiesce does
   * not survive a restart of the process (the kernel device never stopped serving).
   * Returns the device and the time quiescing took, in ms.
   * Errors: InvalidArgumentError (id, timeout_ms above MAX_QUIESCE_TIMEOUT_MS), NotFoundError,
   * FailedPreconditionError (released, or not attached), InternalError (flush failed).
   */
  async quiesce(deviceId: string, timeoutMs: number): Promise<{ device: Device; quiesceMs: number }> {
    validateDeviceId(deviceId);
    if (!Number.isInteger(timeoutMs) || timeoutMs < 0 || timeoutMs > MAX_QUIESCE_TIMEOUT_MS) {
      throw new InvalidArgumentError(`timeout_ms: must be 0..${MAX_QUIESCE_TIMEOUT_MS}, got ${timeoutMs}`);
    }
    const hold = timeoutMs === 0 ? DEFAULT_QUIESCE_TIMEOUT_MS : timeoutMs;
    await this.refuseIfRetiring('QuiesceDevice', deviceId);
    return this.locks.run(deviceId, async () => {
      const { rec, live } = await this.ownedAttached(deviceId, 'QuiesceDevice');
      const t0 = performance.now();
      try {
        await this.driver.quiesce(live);
      } catch (err) {
        throw explain(err, `QuiesceDevice "${deviceId}": flushing ${live.path} failed`);
      }
      const quiesceMs = performance.now() - t0;
      this.setQuiesced(deviceId, hold);
      this.log.info({ device_id: deviceId, path: live.path, quiesce_ms: quiesceMs, hold_ms: hold }, 'device quiesced');
      failpoint('ublk.quiesce.after');
      return { device: this.deviceFrom(rec, live), quiesceMs };
    });
  }

  /**
   * resume ends a quiesce; idempotent (a device that is not quiesced is returned as it is).
   * Errors: InvalidArgumentError, NotFoundError, FailedPreconditionError (released).
   */
  async resume(deviceId: string): Promise<Device> {
    validateDeviceId(deviceId);
    await this.refuseIfRetiring('ResumeDevice', deviceId);
    return this.locks.run(deviceId, async () => {
      const rec = this.store.get(deviceId);
      if (rec?.state === 'released' || this.handedOver.has(deviceId)) throw this.handedOverError('ResumeDevice', deviceId);
      if (!rec || rec.state !== 'ready') throw new NotFoundError(`device_id "${deviceId}": no such device`);
      const live = await this.locate(rec);
      if (this.clearQuiesced(deviceId) && live) await this.driver.resume(live);
      return this.deviceFrom(rec, live);
    });
  }

  /**
   * release gives up ownership of a quiesced device: the driver stops serving it (loop: the
   * kernel keeps serving, the device stays attached), the row becomes `released` with a new
   * random handover token, persisted (fsync) before the call returns. Returns the device and
   * the token. Errors: InvalidArgumentError, NotFoundError, FailedPreconditionError (not
   * quiesced, or not attached), InternalError.
   */
  async release(deviceId: string): Promise<{ device: Device; token: string }> {
    validateDeviceId(deviceId);
    await this.refuseIfRetiring('ReleaseDevice', deviceId);
    return this.locks.run(deviceId, async () => {
      const { rec, live } = await this.ownedAttached(deviceId, 'ReleaseDevice');
      if (!this.quiesced.has(deviceId)) throw new FailedPreconditionError(`ReleaseDevice "${deviceId}": the device is not quiesced (call QuiesceDevice first); nothing changed`);
      try {
        await this.driver.release(live);
      } catch (err) {
        throw explain(err, `ReleaseDevice "${deviceId}": the driver could not stop serving ${live.path}`);
      }
      const token = randomBytes(16).toString('hex');
      this.store.update(deviceId, { state: 'released', handoverToken: token, path: live.path }, this.now());
      this.handedOver.add(deviceId);
      if (this.retiringTo === undefined) this.beginRetiring('');
      this.clearQuiesced(deviceId);
      this.scheduleSweep();
      this.log.info({ device_id: deviceId, path: live.path }, 'device released for handover');
      failpoint('ublk.release.after');
      return { device: this.deviceFrom(rec, live), token };
    });
  }

  /**
   * recover takes over a device another slot released: under the cross-slot lock it checks
   * that another slot's row is `released` with this token, that the kernel device is still
   * attached to `<imagesDir>/<id>.img` (driver recover), and inserts a `ready` row into this
   * slot's table (fsynced) built from the releasing slot's row. Tells no one else: the old
   * slot drops its row when it sees this one. Returns the device and the time it took, in ms.
   * Errors: InvalidArgumentError (id, empty or wrong token, backing file not in the images
   * dir), AlreadyExistsError (this slot owns the device), FailedPreconditionError (no slot
   * released it, or the device is not attached), InternalError.
   */
  async recover(input: RecoverInput, token: string): Promise<{ device: Device; recoverMs: number }> {
    failpoint('ublk.recover');
    const deviceId = input.deviceId;
    validateDeviceId(deviceId, 'device.device_id');
    if (token === '') throw new InvalidArgumentError('handover_token: must be set (ReleaseDeviceResponse.handover_token)');
    const backingFile = this.images.imagePath(deviceId);
    if (input.backingFile !== backingFile) {
      throw new InvalidArgumentError(`device.backing_file: ${JSON.stringify(input.backingFile)} is not ${backingFile} (images are shared by both slots)`);
    }
    const t0 = performance.now();
    return this.locks.run(deviceId, () =>
      this.peers.exclusive(async () => {
        const own = this.store.get(deviceId);
        if (own?.state === 'ready' && own.handoverToken === token) {
          // Already ours through this very release (a takeover of the stopped releasing slot got here first).
          const at = await this.locate(own);
          if (at) return { device: this.deviceFrom(own, at), recoverMs: performance.now() - t0 };
        }
        if (own && own.state !== 'released') throw new AlreadyExistsError(`RecoverDevice "${deviceId}": this slot (${this.peers.self}) owns it already (row ${own.state})`);
        const rows = this.peers.peerRows(deviceId);
        const from = rows.find((r) => r.record.state === 'released' && r.record.handoverToken === token);
        if (!from) {
          if (rows.some((r) => r.record.state === 'released')) throw new InvalidArgumentError(`handover_token: does not match the release of device_id "${deviceId}"`);
          const owners = rows.map((r) => `${r.slot} (${r.record.state})`).join(', ');
          throw new FailedPreconditionError(`RecoverDevice "${deviceId}": no slot released it${owners ? `; rows: ${owners}` : ''}; nothing changed`);
        }
        let live: AttachedDevice;
        try {
          live = await this.driver.recover({ path: input.path, backingFile, readOnly: from.record.readOnly, flags: [] });
        } catch (err) {
          throw explain(err, `RecoverDevice "${deviceId}"`);
        }
        const now = this.now();
        const rec: DeviceRecord = { ...from.record, state: 'ready', path: live.path, handoverToken: token, updatedAtMs: now };
        if (own) this.store.delete(deviceId); // a stale released row from an earlier move out of this slot
        this.store.insert(rec);
        this.gotBack(deviceId);
        const recoverMs = performance.now() - t0;
        this.log.info({ device_id: deviceId, path: live.path, from_slot: from.slot, recover_ms: recoverMs }, 'device recovered from another slot');
        failpoint('ublk.recover.before-response');
        return { device: this.deviceFrom(rec, live), recoverMs };
      }),
    );
  }

  /**
   * abortHandover takes a released device back after the new slot failed to recover it:
   * token must match; the row becomes `ready` again (fsynced) and the device is served. A row
   * that is already back with this token is returned as it is (idempotent).
   * Errors: InvalidArgumentError (token), NotFoundError (no row), FailedPreconditionError
   * (another slot owns the device now: this slot's row is dropped, nothing to abort).
   */
  async abortHandover(deviceId: string, token: string): Promise<Device> {
    validateDeviceId(deviceId);
    if (token === '') throw new InvalidArgumentError('handover_token: must be set');
    return this.locks.run(deviceId, () =>
      this.peers.exclusive(async () => {
        const rec = this.store.get(deviceId);
        if (!rec) throw new NotFoundError(`AbortHandover "${deviceId}": this slot has no such device`);
        if (rec.handoverToken !== token) throw new InvalidArgumentError(`handover_token: does not match the release of device_id "${deviceId}"`);
        if (rec.state === 'ready') {
          this.gotBack(deviceId);
          return this.ensureAttached(rec);
        }
        if (rec.state !== 'released') throw new FailedPreconditionError(`AbortHandover "${deviceId}": row is ${rec.state}`);
        const owner = this.peers.peerRows(deviceId).find((r) => r.record.state !== 'released');
        if (owner) {
          this.store.delete(deviceId);
          throw new FailedPreconditionError(`AbortHandover "${deviceId}": slot ${owner.slot} owns the device now; this slot dropped its row`);
        }
        const dev = await this.takeBack(rec);
        this.gotBack(deviceId);
        this.log.info({ device_id: deviceId, path: dev.path }, 'handover aborted: device owned again');
        return dev;
      }),
    );
  }

  /**
   * converge applies the crash-convergence rule to this slot's `released` rows, under the
   * cross-slot lock: a row whose device another slot's table owns is dropped; a row no other
   * slot owns is taken back (ready, device re-attached if needed) when it was released at
   * least takeBackAfterMs ago (0 at start: the new slot died before it recovered the device,
   * or this process died before ReleaseDevice answered). Never throws for one device.
   */
  async converge(opts: { takeBackAfterMs: number }): Promise<ConvergeReport> {
    const report: ConvergeReport = { dropped: [], takenBack: [] };
    await this.peers.exclusive(async () => {
      for (const rec of this.store.list()) {
        if (rec.state !== 'released') continue;
        const log = this.log.child({ device_id: rec.deviceId });
        try {
          const owner = this.peers.peerRows(rec.deviceId).find((r) => r.record.state !== 'released');
          if (owner) {
            this.store.delete(rec.deviceId);
            log.info({ owner: owner.slot }, 'converge: released device is owned by another slot; row dropped');
            report.dropped.push(rec.deviceId);
          } else if (this.now() - rec.updatedAtMs >= opts.takeBackAfterMs) {
            await this.takeBack(rec);
            this.gotBack(rec.deviceId);
            log.warn({ released_ms_ago: this.now() - rec.updatedAtMs }, 'converge: released device was not taken over by any slot; owned again');
            report.takenBack.push(rec.deviceId);
          }
        } catch (err) {
          log.error({ err }, 'converge failed for this device');
        }
      }
    });
    if (report.dropped.length + report.takenBack.length > 0) this.log.info(report, 'converge done');
    if (this.store.list().some((r) => r.state === 'released')) this.scheduleSweep();
    return report;
  }

  /** stop clears timers (quiesce holds, the release sweep); devices are left as they are. */
  stop(): void {
    for (const t of this.quiesced.values()) clearTimeout(t);
    this.quiesced.clear();
    if (this.sweepTimer) clearTimeout(this.sweepTimer);
    this.sweepTimer = undefined;
  }

  /** takeBack marks a released row ready again and makes sure its device is attached. */
  private async takeBack(rec: DeviceRecord): Promise<Device> {
    const live = await this.locate(rec);
    if (live) {
      try {
        await this.driver.recover(live);
      } catch (err) {
        throw explain(err, `taking back "${rec.deviceId}"`);
      }
    }
    this.store.update(rec.deviceId, { state: 'ready' }, this.now());
    return this.ensureAttached({ ...rec, state: 'ready' });
  }

  /** ownedAttached returns the ready row and its attached device, or throws the handover errors. */
  private async ownedAttached(deviceId: string, rpc: string): Promise<{ rec: DeviceRecord; live: AttachedDevice }> {
    const rec = this.store.get(deviceId);
    if (rec?.state === 'released' || this.handedOver.has(deviceId)) throw this.handedOverError(rpc, deviceId);
    if (!rec || rec.state !== 'ready') throw new NotFoundError(`${rpc} "${deviceId}": no such device`);
    const live = await this.locate(rec);
    if (!live) throw new FailedPreconditionError(`${rpc} "${deviceId}": the device is not attached`);
    return { rec, live };
  }

  /**
   * refuseDuringHandover: CreateDevice/DeleteDevice fail UNAVAILABLE (retryable, nothing
   * changed) while a device is quiesced (a hold of milliseconds) or released.
   */
  private refuseDuringHandover(deviceId: string, rec: DeviceRecord | undefined, rpc: string): void {
    if (this.quiesced.has(deviceId)) throw new UnavailableError(`${rpc} "${deviceId}": the device is quiesced for a handover; retry (nothing changed)`);
    if (rec?.state === 'released' || this.handedOver.has(deviceId)) throw this.handedOverError(rpc, deviceId);
  }

  /** handedOverError: UNAVAILABLE for a call naming a device this slot released to another slot. */
  private handedOverError(rpc: string, deviceId: string): UnavailableError {
    return new UnavailableError(`${rpc} "${deviceId}": ${this.retiringWhat()}; the device was released to it; retry (nothing changed)`);
  }

  private retiringWhat(): string {
    return `this slot (${this.peers.self}) is handing its devices to ${this.retiringTo ? `slot ${this.retiringTo}` : 'another slot'}`;
  }

  /** isRetiring says whether this slot is handing its devices to another slot. */
  isRetiring(): boolean {
    return this.retiringTo !== undefined || this.handedOver.size > 0;
  }

  /**
   * beginRetiring marks this slot as handing its devices to slot `to` ('' = unknown): from
   * now on CreateDevice is UNAVAILABLE ("retry": the retry reaches the new slot once the
   * stable address moves). Called by HandoverAll's ListDevices (metadata
   * `sandnode-handover-to`) and by the first ReleaseDevice. It ends when every released
   * device came back (AbortHandover, take-back) or when the slot it hands to is found not
   * running (see {@link reclaimIfSuccessorStopped}); a restart also ends it.
   */
  beginRetiring(to: string): void {
    if (this.retiringTo === to || (to === '' && this.retiringTo !== undefined)) return;
    this.retiringTo = to;
    this.log.warn({ to: to || undefined }, 'retiring: handing devices to another slot; CreateDevice and calls on released devices answer UNAVAILABLE');
  }

  /** gotBack: a device this slot had released is owned here again; the last one ends retiring. */
  private gotBack(deviceId: string): void {
    if (!this.handedOver.delete(deviceId)) return;
    if (this.handedOver.size === 0 && this.retiringTo !== undefined) {
      this.retiringTo = undefined;
      this.log.info('retiring ended: every released device is owned here again');
    }
  }

  /**
   * refuseIfRetiring: UNAVAILABLE for CreateDevice (deviceId undefined) while retiring, or for
   * a call naming a device this slot released. First, if the slot it hands its devices to is
   * not running any more, takes its devices back (and ends retiring), then serves the call.
   */
  private async refuseIfRetiring(rpc: string, deviceId?: string): Promise<void> {
    if (!this.blockedByRetiring(deviceId)) return;
    await this.reclaimIfSuccessorStopped();
    this.refuseIfRetiringNow(rpc, deviceId);
  }

  private blockedByRetiring(deviceId: string | undefined): boolean {
    return deviceId === undefined ? this.isRetiring() : this.handedOver.has(deviceId);
  }

  /** refuseIfRetiringNow: the check of refuseIfRetiring without the reclaim (inside a device lock). */
  private refuseIfRetiringNow(rpc: string, deviceId?: string): void {
    if (!this.blockedByRetiring(deviceId)) return;
    if (deviceId !== undefined) throw this.handedOverError(rpc, deviceId);
    throw new UnavailableError(`${rpc}: ${this.retiringWhat()}; retry (nothing changed)`);
  }

  /**
   * reclaimIfSuccessorStopped: while retiring, when the slot this one hands its devices to
   * (every other slot when it is not known) is not running, the move is over: its devices are
   * taken over ({@link takeOverStoppedPeers}), this slot's released rows that nobody owns are
   * taken back, and retiring ends.
   */
  async reclaimIfSuccessorStopped(): Promise<void> {
    if (!this.isRetiring()) return;
    const to = this.retiringTo ? [this.retiringTo] : [...this.peers.others];
    const r = await this.takeOverStoppedPeers();
    if (!to.every((s) => r.stopped.includes(s))) return;
    await this.converge({ takeBackAfterMs: 0 });
    this.handedOver.clear();
    this.retiringTo = undefined;
    this.log.warn({ to, taken_over: r.takenOver }, 'retiring ended: the slot this one was handing its devices to is not running; its devices are owned here again');
  }

  /**
   * takeOverStoppedPeers applies the takeover rule (at every start, and by a retiring slot
   * whose successor stopped), under the cross-slot lock: for every other slot that is not
   * running (its slot lock can be taken; it is held meanwhile, so that slot cannot start):
   * - a `ready` row, or a `released` row that no slot owns: the device is verified (still
   *   attached to its image: driver recover) and becomes this slot's (`ready` row inserted,
   *   fsynced), then the other slot's row is deleted; an image that is not attached is
   *   attached again after the insert (as adoption does);
   * - a `ready`/`released` row of a device this slot owns (`ready`): the other row is dropped
   *   (an interrupted takeover: insert done, delete not);
   * - a `creating`/`deleting` row no row here names: moved here and cleaned up as adoption does.
   * Never throws for one device (logged, reported failed).
   */
  async takeOverStoppedPeers(): Promise<TakeoverReport> {
    const report: TakeoverReport = { stopped: [], takenOver: [], dropped: [], cleanedUp: [], failed: [] };
    await this.peers.exclusive(async () => {
      for (const slot of this.peers.others) {
        const stopped = await this.peers.ifStopped(slot, async (theirs) => {
          if (theirs) for (const row of theirs.list()) await this.takeOverRow(slot, theirs, row, report);
        });
        if (stopped) report.stopped.push(slot);
      }
    });
    if (report.takenOver.length + report.dropped.length + report.cleanedUp.length + report.failed.length > 0) this.log.info(report, 'takeover of stopped slots done');
    return report;
  }

  private async takeOverRow(slot: string, theirs: DeviceStore, row: DeviceRecord, report: TakeoverReport): Promise<void> {
    const id = row.deviceId;
    const log = this.log.child({ device_id: id, from_slot: slot, their_state: row.state });
    try {
      const own = this.store.get(id);
      if (row.state === 'ready' || row.state === 'released') {
        if (own?.state === 'ready') {
          theirs.delete(id);
          log.info('takeover: this slot owns the device; the stopped slot\'s row is dropped');
          report.dropped.push(id);
          return;
        }
        if (own && own.state !== 'released') {
          log.error({ own_state: own.state }, 'takeover: both slots have an unfinished row for this device; left alone');
          report.failed.push(id);
          return;
        }
        const elsewhere = this.peers.peerRows(id).find((r) => r.slot !== slot && r.record.state !== 'released');
        if (elsewhere) {
          if (row.state === 'released') {
            theirs.delete(id);
            log.info({ owner: elsewhere.slot }, 'takeover: a released row of the stopped slot whose device another slot owns; dropped');
            report.dropped.push(id);
          } else {
            log.error({ owner: elsewhere.slot }, 'takeover: another slot owns this device too; left alone');
            report.failed.push(id);
          }
          return;
        }
        // Verify before taking it: still attached to its image (loop: same backing file; ublk: recover).
        let live = await this.locate(row);
        if (live) live = await this.driver.recover(live);
        const rec: DeviceRecord = { ...row, state: 'ready', path: live?.path ?? row.path, updatedAtMs: this.now() };
        if (own) this.store.delete(id); // our stale released row: the move out of this slot is undone
        this.store.insert(rec);
        theirs.delete(id);
        this.gotBack(id);
        if (!live) {
          if (await this.images.exists(rec.backingFile)) {
            const a = await this.driver.attach(rec.backingFile, { readOnly: rec.readOnly });
            this.store.update(id, { path: a.path }, this.now());
            log.warn({ path: a.path }, 'takeover: the image was not attached; re-attached');
          } else {
            log.error({ backing_file: rec.backingFile }, 'takeover: the image file is missing; reported as missing until deleted');
          }
        }
        log.warn({ path: live?.path }, 'takeover: the device of a stopped slot is owned by this slot now');
        report.takenOver.push(id);
        return;
      }
      // creating / deleting: an interrupted create or delete of the stopped slot.
      if (own) {
        log.error({ own_state: own.state }, 'takeover: an unfinished row of the stopped slot names a device this slot has a row for; left alone');
        report.failed.push(id);
        return;
      }
      this.store.insert(row);
      theirs.delete(id);
      await this.teardown(row);
      log.info('takeover: finished the cleanup of an interrupted create or delete of the stopped slot');
      report.cleanedUp.push(id);
    } catch (err) {
      log.error({ err }, 'takeover failed for this device; left where it is');
      report.failed.push(id);
    }
  }

  private setQuiesced(deviceId: string, holdMs: number): void {
    this.clearQuiesced(deviceId);
    const t = setTimeout(() => {
      if (this.quiesced.get(deviceId) !== t) return;
      this.log.warn({ device_id: deviceId, hold_ms: holdMs }, 'quiesce timed out: resuming by itself');
      void this.resume(deviceId).catch((err: unknown) => this.log.error({ err, device_id: deviceId }, 'resume after the quiesce timeout failed'));
    }, holdMs);
    t.unref();
    this.quiesced.set(deviceId, t);
  }

  private clearQuiesced(deviceId: string): boolean {
    const t = this.quiesced.get(deviceId);
    if (!t) return false;
    clearTimeout(t);
    this.quiesced.delete(deviceId);
    return true;
  }

  /** scheduleSweep runs converge() once soon, so released rows do not linger. */
  private scheduleSweep(): void {
    if (this.sweepTimer) return;
    this.sweepTimer = setTimeout(() => {
      this.sweepTimer = undefined;
      void this.converge({ takeBackAfterMs: this.releaseTimeoutMs }).catch((err: unknown) => this.log.error({ err }, 'release sweep failed'));
    }, 1000);
    this.sweepTimer.unref();
  }

  /** make writes the row, makes the image, attaches it and marks the row ready; undoes on failure. */
  private async make(spec: DeviceSpec, sizeBytes: number): Promise<Device> {
    const id = spec.deviceId;
    const backingFile = this.images.imagePath(id);
    if (await this.images.exists(backingFile)) {
      // The row is always written before the image, so a file without a row is not ours to reuse.
      throw new FailedPreconditionError(`device_id "${id}": image ${backingFile} exists but no device owns it; remove it or pick another id (nothing changed)`);
    }
    const now = this.now();
    const rec: DeviceRecord = { ...spec, sizeBytes, state: 'creating', backingFile, path: '', createdAtMs: now, updatedAtMs: now, handoverToken: '', clonedFrom: '' };
    this.store.insert(rec);
    let step = 'make the image';
    let attached: AttachedDevice | undefined;
    try {
      if (spec.sourceImage !== '') {
        step = `clone ${spec.sourceImage}`;
        await this.images.clone(spec.sourceImage, backingFile);
      } else {
        step = 'create the sparse image';
        await this.images.createEmpty(backingFile, sizeBytes);
        if (spec.filesystem === 'ext4') {
          step = 'format ext4';
          await this.images.formatExt4(backingFile);
        }
      }
      step = 'attach';
      attached = await this.driver.attach(backingFile, { readOnly: spec.readOnly });
      step = 'record the device';
      this.store.update(id, { state: 'ready', path: attached.path }, this.now());
    } catch (err) {
      await this.undoCreate(id, backingFile, attached);
      throw explain(err, `CreateDevice "${id}": ${step} failed`);
    }
    this.log.info({ device_id: id, path: attached.path, size_bytes: sizeBytes, source_image: spec.sourceImage || undefined }, 'device created');
    return this.deviceFrom({ ...rec, state: 'ready', path: attached.path }, attached);
  }

  /** undoCreate detaches, removes the image and drops the row; keeps the row if a step fails. */
  private async undoCreate(id: string, backingFile: string, attached: AttachedDevice | undefined): Promise<void> {
    try {
      if (attached) await this.driver.detach(attached.path);
      await this.images.remove(backingFile);
      this.store.delete(id);
    } catch (err) {
      this.log.error({ err, device_id: id }, 'undo of a failed create failed; the row stays and the next start cleans up');
    }
  }

  /**
   * teardown detaches every device on the row's image, removes the image and the temp files
   * of an interrupted clone into it, drops the row.
   */
  private async teardown(rec: DeviceRecord): Promise<void> {
    for (const a of await this.attachedTo(rec.backingFile)) await this.driver.detach(a.path);
    await this.images.remove(rec.backingFile);
    for (const t of await this.images.cloneTemps()) if (t.target === rec.backingFile) await this.images.remove(t.file);
    this.store.delete(rec.deviceId);
  }

  /**
   * removeCloneTemps (adoption, after the rows): removes every clone temp file whose device
   * no slot is creating now (no `creating` row here or in another slot's table: a running
   * slot's clone in progress keeps its temp). Such a file is the copy of a clone that crashed
   * before its rename.
   */
  private async removeCloneTemps(report: AdoptionReport): Promise<void> {
    let temps: { file: string; target: string }[];
    try {
      temps = await this.images.cloneTemps();
    } catch (err) {
      this.log.error({ err }, 'adoption: could not list clone temp files');
      return;
    }
    const creatingHere = new Set(this.store.list().filter((r) => r.state === 'creating').map((r) => r.backingFile));
    for (const t of temps) {
      const id = t.target.endsWith('.img') ? t.target.slice(this.images.dir.length + 1, -'.img'.length) : '';
      const creatingElsewhere = id !== '' && this.peers.peerRows(id).some((r) => r.record.state === 'creating');
      if (creatingHere.has(t.target) || creatingElsewhere) continue;
      try {
        await this.images.remove(t.file);
        this.log.warn({ file: t.file }, 'adoption: removed the temp file of a clone interrupted by a crash');
        report.removedTemps.push(t.file);
      } catch (err) {
        this.log.error({ err, file: t.file }, 'adoption: could not remove a clone temp file');
      }
    }
  }

  /** ensureAttached returns the device of a ready row, attaching its image if needed. */
  private async ensureAttached(rec: DeviceRecord): Promise<Device> {
    const live = await this.locate(rec);
    if (live) return this.deviceFrom(rec, live);
    if (!(await this.images.exists(rec.backingFile))) {
      throw new FailedPreconditionError(`device_id "${rec.deviceId}": image ${rec.backingFile} is missing; delete the device and create it again`);
    }
    let a: AttachedDevice;
    try {
      a = await this.driver.attach(rec.backingFile, { readOnly: rec.readOnly });
    } catch (err) {
      throw explain(err, `CreateDevice "${rec.deviceId}": re-attach failed`);
    }
    this.store.update(rec.deviceId, { path: a.path }, this.now());
    this.log.info({ device_id: rec.deviceId, path: a.path }, 'device was detached; re-attached');
    return this.deviceFrom({ ...rec, path: a.path }, a);
  }

  /** liveIndex maps backing file -> attached devices, for files in the images dir. */
  private async liveIndex(): Promise<Map<string, AttachedDevice[]>> {
    const index = new Map<string, AttachedDevice[]>();
    for (const a of await this.driver.listAttached(this.images.dir)) {
      const list = index.get(a.backingFile) ?? [];
      list.push(a);
      index.set(a.backingFile, list);
    }
    return index;
  }

  private async attachedTo(backingFile: string): Promise<AttachedDevice[]> {
    return (await this.liveIndex()).get(backingFile) ?? [];
  }

  /**
   * locate returns the device the row's image is attached at: the row's own device path read
   * directly (driver lookup: one sysfs read, no scan of every loop device) when it is still
   * attached to the row's backing file; else the first device a scan finds on that file
   * (the path changed, e.g. re-attached by another slot), or undefined when it is not attached.
   */
  private async locate(rec: DeviceRecord): Promise<AttachedDevice | undefined> {
    if (rec.path !== '' && this.driver.lookup) {
      const at = await this.driver.lookup(rec.path);
      if (at?.backingFile === rec.backingFile) return at;
    }
    return (await this.attachedTo(rec.backingFile))[0];
  }

  private async toDevice(rec: DeviceRecord, index: Map<string, AttachedDevice[]>): Promise<Device> {
    const live = index.get(rec.backingFile)?.[0];
    if (live) return this.deviceFrom(rec, live);
    const state = (await this.images.exists(rec.backingFile)) ? 'detached' : 'missing';
    return { ...this.deviceFrom(rec, undefined), state };
  }

  private deviceFrom(rec: DeviceRecord, live: AttachedDevice | undefined): Device {
    return {
      deviceId: rec.deviceId,
      path: live?.path ?? '',
      sizeBytes: rec.sizeBytes,
      backingFile: rec.backingFile,
      readOnly: live ? live.readOnly : rec.readOnly,
      filesystem: rec.filesystem,
      state: live ? 'attached' : 'detached',
      driver: this.driver.name,
      flags: live ? [...live.flags] : [],
      createdAtMs: rec.createdAtMs,
      sourceImage: rec.sourceImage,
      clonedFrom: rec.clonedFrom,
    };
  }
}
