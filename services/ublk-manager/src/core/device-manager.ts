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
  type Logger,
} from '@sandnode/shared';
import type { BlockDriver, ImageOps } from './driver';
import { KeyedMutex } from '@sandnode/shared';
import type { DeviceStore } from './store';
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

  constructor(opts: DeviceManagerOptions) {
    this.store = opts.store;
    this.driver = opts.driver;
    this.images = opts.images;
    this.log = opts.log;
    this.limits = opts.limits;
    this.now = opts.now ?? Date.now;
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
    return this.locks.run(spec.deviceId, async () => {
      const existing = this.store.get(spec.deviceId);
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
    });
  }

  /** get returns one device with its live state. Errors: InvalidArgumentError, NotFoundError. */
  async get(deviceId: string): Promise<Device> {
    validateDeviceId(deviceId);
    const rec = this.store.get(deviceId);
    if (!rec || rec.state !== 'ready') throw new NotFoundError(`device_id "${deviceId}": no such device`);
    return this.toDevice(rec, await this.liveIndex());
  }

  /** list returns every device with its live state, ordered by device id. */
  async list(): Promise<Device[]> {
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
    return this.locks.run(deviceId, async () => {
      const rec = this.store.get(deviceId);
      if (!rec) return false;
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
    const report: AdoptionReport = { kept: [], reattached: [], cleanedUp: [], missing: [], failed: [] };
    const index = await this.liveIndex();
    const owned = new Set<string>();
    for (const rec of this.store.list()) {
      owned.add(rec.backingFile);
      await this.locks.run(rec.deviceId, async () => {
        const log = this.log.child({ device_id: rec.deviceId });
        try {
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
    for (const [file, devs] of index) {
      if (!owned.has(file)) {
        this.log.warn({ backing_file: file, paths: devs.map((d) => d.path) }, 'adoption: a device backed by the images dir has no row; left alone');
      }
    }
    this.log.info(report, 'adoption done');
    return report;
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
    const rec: DeviceRecord = { ...spec, sizeBytes, state: 'creating', backingFile, path: '', createdAtMs: now, updatedAtMs: now };
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

  /** teardown detaches every device on the row's image, removes the image, drops the row. */
  private async teardown(rec: DeviceRecord): Promise<void> {
    for (const a of await this.attachedTo(rec.backingFile)) await this.driver.detach(a.path);
    await this.images.remove(rec.backingFile);
    this.store.delete(rec.deviceId);
  }

  /** ensureAttached returns the device of a ready row, attaching its image if needed. */
  private async ensureAttached(rec: DeviceRecord): Promise<Device> {
    const live = await this.attachedTo(rec.backingFile);
    if (live[0]) return this.deviceFrom(rec, live[0]);
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
    };
  }
}
