/**
 * CloneDevice: a new device whose image is a copy of another device's current contents
 * (`cp --reflink`, FICLONE where the file system has it, sparse always), persisted before it
 * is attached. See {@link DeviceClone.clone} for the crash-safety and idempotency rules.
 */
import { AlreadyExistsError, DeadlineExceededError, FailedPreconditionError, InvalidArgumentError, NotFoundError } from '@sandnode/shared';
import type { DeviceCore } from './device-core';
import type { CloneResult } from './driver';
import { failpoint } from './failpoints';
import type { AttachedDevice, Device, DeviceRecord } from './types';
import { validateDeviceId } from './validate';

/** The most snapshots one SnapshotDevices call takes (a fork takes 2). */
export const MAX_SNAPSHOT_ITEMS = 8;

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

/** What {@link DeviceClone.clone} returns. */
export interface CloneOutcome {
  /** The attached clone. */
  device: Device;
  /** Time the image copy took (cp), in ms; 0 when an existing clone was returned. */
  cloneMs: number;
  /** Time of the whole call under the locks (checks, copy, fsync, rename, rows, attach), in ms. */
  totalMs: number;
  /** True when the extents were shared (FICLONE) rather than copied. */
  reflinked: boolean;
  /** How the image was made: "reflink" (FICLONE, O(1)), "copy" (the allocated data copied), "" for an existing clone. */
  cloneMethod: 'reflink' | 'copy' | '';
  /** Why it was copied (cloneMethod "copy"), e.g. "the images file system has no reflink (FICLONE: EOPNOTSUPP)"; '' otherwise. */
  copyReason: string;
  /** Allocated bytes of the source image (st_blocks * 512); 0 when an existing clone was returned. */
  copiedBytes: number;
  /** False when an existing clone of the same source was returned (nothing done). */
  created: boolean;
}

/** DeviceClone serves CloneDevice on the DeviceManager's shared core. */
export class DeviceClone {
  constructor(private readonly core: DeviceCore) {}

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
   * undone), DeadlineExceededError (opts.signal, the caller's, fired during the copy or the
   * attach: the copy is stopped and undone).
   */
  async clone(input: CloneInput, opts: { signal?: AbortSignal; attach?: boolean } = {}): Promise<CloneOutcome> {
    const deviceId = validateDeviceId(input.deviceId);
    const sourceId = validateDeviceId(input.sourceDeviceId, 'source_device_id');
    if (deviceId === sourceId) throw new InvalidArgumentError(`source_device_id: "${sourceId}" is device_id itself; a device cannot be cloned onto itself`);
    await this.core.refuseIfRetiring('CloneDevice');
    await this.core.refuseIfRetiring('CloneDevice', sourceId);
    const [first, second] = deviceId < sourceId ? [deviceId, sourceId] : [sourceId, deviceId];
    return this.core.locks.run(first, () =>
      this.core.locks.run(second, () => {
        this.core.refuseIfRetiringNow('CloneDevice');
        return this.core.track(this.cloneLocked({ ...input, deviceId, sourceDeviceId: sourceId }, opts.signal, opts.attach ?? true));
      }),
    );
  }

  /**
   * snapshot (SnapshotDevices): each input cloned as {@link clone} does up to the persisted
   * `ready` row, not attached (a later clone of the same ids attaches it; so does adoption
   * after a crash), all at once. All or nothing: when one fails, the others this call created
   * are deleted again (their rows and images) and the first error is thrown (the caller's
   * cancel as DeadlineExceededError). Errors as {@link clone}, plus InvalidArgumentError for no
   * inputs, more than {@link MAX_SNAPSHOT_ITEMS} or a device id twice (nothing changed).
   */
  async snapshot(inputs: CloneInput[], opts: { signal?: AbortSignal } = {}): Promise<CloneOutcome[]> {
    if (inputs.length === 0 || inputs.length > MAX_SNAPSHOT_ITEMS) throw new InvalidArgumentError(`items: ${inputs.length} snapshots; 1 to ${MAX_SNAPSHOT_ITEMS} allowed (nothing changed)`);
    const ids = inputs.map((i) => validateDeviceId(i.deviceId, 'items.device_id'));
    const dup = ids.find((id, i) => ids.indexOf(id) !== i);
    if (dup !== undefined) throw new InvalidArgumentError(`items.device_id: "${dup}" appears twice (nothing changed)`);
    inputs.forEach((i) => validateDeviceId(i.sourceDeviceId, 'items.source_device_id'));
    const settled = await Promise.allSettled(inputs.map((i) => this.clone(i, { ...opts, attach: false })));
    const failed = settled.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (!failed) return settled.map((r) => (r as PromiseFulfilledResult<CloneOutcome>).value);
    const made = settled.flatMap((r) => (r.status === 'fulfilled' && r.value.created ? [r.value.device.deviceId] : []));
    for (const id of made) {
      await this.core.locks
        .run(id, async () => {
          const rec = this.core.store.get(id);
          if (rec) await this.core.teardown(rec);
        })
        .catch((err: unknown) => this.core.log.error({ err, device_id: id }, 'undo of a snapshot failed; the next start cleans up'));
    }
    throw failed.reason;
  }

  private async cloneLocked(input: CloneInput, signal: AbortSignal | undefined, attach: boolean): Promise<CloneOutcome> {
    const t0 = performance.now();
    const { deviceId: id, sourceDeviceId: sourceId } = input;
    const existing = this.core.store.get(id);
    this.core.refuseDuringHandover(id, existing, 'CloneDevice');
    if (existing?.state === 'ready') {
      if (existing.clonedFrom !== sourceId || existing.readOnly !== input.readOnly) {
        const what = existing.clonedFrom ? `a clone of "${existing.clonedFrom}"` : 'not a clone';
        throw new AlreadyExistsError(`device_id "${id}" exists (${what}, read_only=${existing.readOnly}); requested a clone of "${sourceId}" read_only=${input.readOnly}`);
      }
      const device = attach ? await this.core.ensureAttached(existing) : this.core.deviceFrom(existing, await this.core.locate(existing));
      return { device, cloneMs: 0, totalMs: performance.now() - t0, reflinked: false, cloneMethod: '', copyReason: '', copiedBytes: 0, created: false };
    }
    const src = this.core.store.get(sourceId);
    this.core.refuseDuringHandover(sourceId, src, 'CloneDevice');
    if (!src || src.state !== 'ready') throw new NotFoundError(`source_device_id "${sourceId}": no such device`);
    const live = await this.core.locate(src);
    if (live && !live.readOnly && !input.sourceQuiesced) {
      throw new FailedPreconditionError(
        `CloneDevice "${id}": source "${sourceId}" is attached read-write at ${live.path}; freeze its filesystem (podd Quiesce) or pause its VM and set source_quiesced, or detach it; nothing changed`,
      );
    }
    if (!live && !(await this.core.images.exists(src.backingFile))) {
      throw new FailedPreconditionError(`CloneDevice "${id}": the image of source "${sourceId}" (${src.backingFile}) is missing; nothing changed`);
    }
    if (existing) {
      this.core.log.warn({ device_id: id, state: existing.state }, 'cleaning up an interrupted create or delete before cloning');
      await this.core.teardown(existing).catch((err: unknown) => {
        throw this.core.explain(err, `CloneDevice "${id}": cleaning up the interrupted ${existing.state} row failed`);
      });
    }
    const backingFile = this.core.images.imagePath(id);
    if (await this.core.images.exists(backingFile)) {
      throw new FailedPreconditionError(`device_id "${id}": image ${backingFile} exists but no device owns it; remove it or pick another id (nothing changed)`);
    }
    const now = this.core.now();
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
    this.core.store.insert(rec);
    let step = `copy ${src.backingFile}`;
    let copy: CloneResult;
    let attached: AttachedDevice | undefined;
    let persisted = false;
    try {
      copy = await this.core.images.clone(src.backingFile, backingFile, { signal, confined: true });
      step = 'record the device';
      this.core.store.update(id, { state: 'ready' }, this.core.now());
      persisted = true;
      failpoint('ublk.clone.after-persist');
      if (attach) {
        step = 'attach';
        attached = await this.core.driver.attach(backingFile, { readOnly: input.readOnly });
        step = 'record the device path';
        this.core.store.update(id, { path: attached.path }, this.core.now());
      }
    } catch (err) {
      if (persisted) this.core.store.update(id, { state: 'creating' }, this.core.now());
      await this.core.undoCreate(id, backingFile, attached);
      if (signal?.aborted) {
        this.core.log.warn({ err, device_id: id, step }, 'CloneDevice cancelled by its caller; undone');
        throw new DeadlineExceededError(`CloneDevice "${id}" from "${sourceId}": the call was cancelled or its deadline passed during ${step}; undone`);
      }
      throw this.core.explain(err, `CloneDevice "${id}" from "${sourceId}": ${step} failed`);
    }
    const totalMs = performance.now() - t0;
    this.core.log.info(
      {
        device_id: id,
        cloned_from: sourceId,
        path: attached?.path ?? '',
        attached: attach,
        size_bytes: rec.sizeBytes,
        copied_bytes: copy.sourceAllocatedBytes,
        reflinked: copy.reflinked,
        copy_reason: copy.copyReason || undefined,
        clone_ms: copy.copyMs,
        sync_ms: copy.syncMs,
        total_ms: totalMs,
        source_quiesced: input.sourceQuiesced,
      },
      attach ? 'device cloned' : 'device snapshot taken (not attached)',
    );
    return {
      device: this.core.deviceFrom({ ...rec, state: 'ready', path: attached?.path ?? '' }, attached),
      cloneMs: copy.copyMs,
      totalMs,
      reflinked: copy.reflinked,
      cloneMethod: copy.reflinked ? 'reflink' : 'copy',
      copyReason: copy.copyReason,
      copiedBytes: copy.sourceAllocatedBytes,
      created: true,
    };
  }
}
