/**
 * Device handover between two slots of the ublk-manager, one device at a time:
 *
 *   old slot: QuiesceDevice -> ReleaseDevice (row `released`, token)   [-> AbortHandover]
 *   new slot: RecoverDevice (row `ready` here; the old slot drops its row when it sees it)
 *
 * plus ResumeDevice (a quiesce that did not lead to a release). Each step persists its row
 * (fsync) before it answers; a crash at any step is converged by Adoption.converge and the
 * takeover rule (slot-takeover.ts). HandoverAll, which drives these steps from the new slot,
 * is in handover.ts.
 */
import { randomBytes } from 'node:crypto';
import { AlreadyExistsError, FailedPreconditionError, InvalidArgumentError, NotFoundError } from '@sandnode/shared';
import type { Adoption } from './adoption';
import type { DeviceCore } from './device-core';
import { failpoint } from './failpoints';
import type { AttachedDevice, Device, DeviceRecord } from './types';
import { validateDeviceId } from './validate';

/** Default quiesce hold when QuiesceDevice says 0, in ms. */
export const DEFAULT_QUIESCE_TIMEOUT_MS = 5000;
/** Longest quiesce hold QuiesceDevice accepts, in ms. */
export const MAX_QUIESCE_TIMEOUT_MS = 30_000;

/** What RecoverDevice needs to know about the released device. */
export interface RecoverInput {
  deviceId: string;
  /** Device node as the old slot reported it. */
  path: string;
  /** Backing file as the old slot reported it (must be `<imagesDir>/<id>.img`). */
  backingFile: string;
}

/** DeviceHandover serves Quiesce/Resume/Release/Recover/AbortHandover on the DeviceManager's core. */
export class DeviceHandover {
  constructor(
    private readonly core: DeviceCore,
    private readonly adoption: Adoption,
  ) {}

  /**
   * quiesce lets in-flight I/O of the device complete and makes it durable (driver quiesce;
   * loop: fsync of the device node + fdatasync of the image), then holds the device quiesced
   * until resume, release or timeoutMs (0 = DEFAULT_QUIESCE_TIMEOUT_MS; then it resumes by
   * itself).
   * While quiesced, CreateDevice/DeleteDevice/CloneDevice on it fail UNAVAILABLE (retry). A quiesce does
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
    await this.core.refuseIfRetiring('QuiesceDevice', deviceId);
    return this.core.locks.run(deviceId, async () => {
      const { rec, live } = await this.core.ownedAttached(deviceId, 'QuiesceDevice');
      const t0 = performance.now();
      try {
        await this.core.driver.quiesce(live);
      } catch (err) {
        throw this.core.explain(err, `QuiesceDevice "${deviceId}": flushing ${live.path} failed`);
      }
      const quiesceMs = performance.now() - t0;
      this.setQuiesced(deviceId, hold);
      this.core.log.info({ device_id: deviceId, path: live.path, quiesce_ms: quiesceMs, hold_ms: hold }, 'device quiesced');
      failpoint('ublk.quiesce.after');
      return { device: this.core.deviceFrom(rec, live), quiesceMs };
    });
  }

  /**
   * resume ends a quiesce; idempotent (a device that is not quiesced is returned as it is).
   * Errors: InvalidArgumentError, NotFoundError, FailedPreconditionError (released).
   */
  async resume(deviceId: string): Promise<Device> {
    validateDeviceId(deviceId);
    await this.core.refuseIfRetiring('ResumeDevice', deviceId);
    return this.core.locks.run(deviceId, async () => {
      const rec = this.core.store.get(deviceId);
      if (rec?.state === 'released' || this.core.isHandedOver(deviceId)) throw this.core.handedOverError('ResumeDevice', deviceId);
      if (!rec || rec.state !== 'ready') throw new NotFoundError(`device_id "${deviceId}": no such device`);
      const live = await this.core.locate(rec);
      if (this.clearQuiesced(deviceId) && live) {
        try {
          await this.core.driver.resume(live);
        } catch (err) {
          throw this.core.explain(err, `ResumeDevice "${deviceId}": resuming ${live.path} failed`);
        }
      }
      return this.core.deviceFrom(rec, live);
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
    await this.core.refuseIfRetiring('ReleaseDevice', deviceId);
    return this.core.locks.run(deviceId, async () => {
      const { rec, live } = await this.core.ownedAttached(deviceId, 'ReleaseDevice');
      if (!this.core.quiesced.has(deviceId)) throw new FailedPreconditionError(`ReleaseDevice "${deviceId}": the device is not quiesced (call QuiesceDevice first); nothing changed`);
      try {
        await this.core.driver.release(live);
      } catch (err) {
        throw this.core.explain(err, `ReleaseDevice "${deviceId}": the driver could not stop serving ${live.path}`);
      }
      const token = randomBytes(16).toString('hex');
      this.core.store.update(deviceId, { state: 'released', handoverToken: token, path: live.path }, this.core.now());
      this.core.handOver(deviceId);
      this.clearQuiesced(deviceId);
      this.adoption.scheduleSweep();
      this.core.log.info({ device_id: deviceId, path: live.path }, 'device released for handover');
      failpoint('ublk.release.after');
      return { device: this.core.deviceFrom(rec, live), token };
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
    const backingFile = this.core.images.imagePath(deviceId);
    if (input.backingFile !== backingFile) {
      throw new InvalidArgumentError(`device.backing_file: ${JSON.stringify(input.backingFile)} is not ${backingFile} (images are shared by both slots)`);
    }
    const t0 = performance.now();
    return this.core.locks.run(deviceId, () =>
      this.core.peers.exclusive(async () => {
        const own = this.core.store.get(deviceId);
        if (own?.state === 'ready' && own.handoverToken === token) {
          // Already ours through this very release (a takeover of the stopped releasing slot got here first).
          const at = await this.core.locate(own);
          if (at) return { device: this.core.deviceFrom(own, at), recoverMs: performance.now() - t0 };
        }
        if (own && own.state !== 'released') throw new AlreadyExistsError(`RecoverDevice "${deviceId}": this slot (${this.core.peers.self}) owns it already (row ${own.state})`);
        const rows = this.core.peers.peerRows(deviceId);
        const from = rows.find((r) => r.record.state === 'released' && r.record.handoverToken === token);
        if (!from) {
          if (rows.some((r) => r.record.state === 'released')) throw new InvalidArgumentError(`handover_token: does not match the release of device_id "${deviceId}"`);
          const owners = rows.map((r) => `${r.slot} (${r.record.state})`).join(', ');
          throw new FailedPreconditionError(`RecoverDevice "${deviceId}": no slot released it${owners ? `; rows: ${owners}` : ''}; nothing changed`);
        }
        let live: AttachedDevice;
        try {
          live = await this.core.driver.recover({ path: input.path, backingFile, readOnly: from.record.readOnly, flags: [] });
        } catch (err) {
          throw this.core.explain(err, `RecoverDevice "${deviceId}"`);
        }
        const now = this.core.now();
        const rec: DeviceRecord = { ...from.record, state: 'ready', path: live.path, handoverToken: token, updatedAtMs: now };
        if (own) this.core.store.delete(deviceId); // a stale released row from an earlier move out of this slot
        this.core.store.insert(rec);
        this.core.gotBack(deviceId);
        const recoverMs = performance.now() - t0;
        this.core.log.info({ device_id: deviceId, path: live.path, from_slot: from.slot, recover_ms: recoverMs }, 'device recovered from another slot');
        failpoint('ublk.recover.before-response');
        return { device: this.core.deviceFrom(rec, live), recoverMs };
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
    return this.core.locks.run(deviceId, () =>
      this.core.peers.exclusive(async () => {
        const rec = this.core.store.get(deviceId);
        if (!rec) throw new NotFoundError(`AbortHandover "${deviceId}": this slot has no such device`);
        if (rec.handoverToken !== token) throw new InvalidArgumentError(`handover_token: does not match the release of device_id "${deviceId}"`);
        if (rec.state === 'ready') {
          this.core.gotBack(deviceId);
          return this.core.ensureAttached(rec);
        }
        if (rec.state !== 'released') throw new FailedPreconditionError(`AbortHandover "${deviceId}": row is ${rec.state}`);
        const owner = this.core.peers.peerRows(deviceId).find((r) => r.record.state !== 'released');
        if (owner) {
          this.core.store.delete(deviceId);
          throw new FailedPreconditionError(`AbortHandover "${deviceId}": slot ${owner.slot} owns the device now; this slot dropped its row`);
        }
        const dev = await this.core.takeBack(rec);
        this.core.gotBack(deviceId);
        this.core.log.info({ device_id: deviceId, path: dev.path }, 'handover aborted: device owned again');
        return dev;
      }),
    );
  }

  /** stop clears the quiesce holds (the devices stay as they are). */
  stop(): void {
    for (const t of this.core.quiesced.values()) clearTimeout(t);
    this.core.quiesced.clear();
  }

  private setQuiesced(deviceId: string, holdMs: number): void {
    this.clearQuiesced(deviceId);
    const t = setTimeout(() => {
      if (this.core.quiesced.get(deviceId) !== t) return;
      this.core.log.warn({ device_id: deviceId, hold_ms: holdMs }, 'quiesce timed out: resuming by itself');
      void this.resume(deviceId).catch((err: unknown) => this.core.log.error({ err, device_id: deviceId }, 'resume after the quiesce timeout failed'));
    }, holdMs);
    t.unref();
    this.core.quiesced.set(deviceId, t);
  }

  private clearQuiesced(deviceId: string): boolean {
    const t = this.core.quiesced.get(deviceId);
    if (!t) return false;
    clearTimeout(t);
    this.core.quiesced.delete(deviceId);
    return true;
  }
}
