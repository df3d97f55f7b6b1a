/**
 * DeviceCore: what every part of the DeviceManager shares: the dependencies (table, driver,
 * images, peers, clock, log), the per-device lock, and the handover state that every call
 * checks (quiesced devices, devices released to another slot, "retiring"). Plus the helpers
 * that read a row's live device (locate, deviceFrom), re-attach it (ensureAttached), take a
 * released row back (takeBack) and tear an unfinished row down (teardown, undoCreate).
 *
 * The parts that use it: device-manager.ts (CRUD), clone.ts, device-handover.ts,
 * slot-takeover.ts, adoption.ts. No proto imports.
 */
import { FailedPreconditionError, KeyedMutex, NotFoundError, UnavailableError, type Logger } from '@sandnode/shared';
import type { BlockDriver, ImageOps } from './driver';
import { explain } from './explain';
import { NoPeers, type DeviceStore, type SlotPeers } from './store';
import type { AttachedDevice, Device, DeviceRecord } from './types';
import type { DeviceLimits } from './validate';

/** Default time after which a running manager takes back a released, unclaimed device, in ms. */
export const DEFAULT_RELEASE_TIMEOUT_MS = 30_000;

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

/** DeviceCore holds the shared state and helpers of the DeviceManager's parts. */
export class DeviceCore {
  readonly store: DeviceStore;
  readonly driver: BlockDriver;
  readonly images: ImageOps;
  readonly log: Logger;
  readonly limits: DeviceLimits;
  readonly now: () => number;
  readonly locks = new KeyedMutex();
  readonly peers: SlotPeers;
  readonly releaseTimeoutMs: number;
  /** Quiesced devices: id -> the timer that resumes them by itself. */
  readonly quiesced = new Map<string, NodeJS.Timeout>();
  /**
   * Retiring: this slot is handing its devices to another slot (set by the first
   * ReleaseDevice served or by HandoverAll's ListDevices; '' = the slot is not known). While
   * set, CreateDevice is UNAVAILABLE. See {@link beginRetiring}.
   */
  private retiringTo: string | undefined;
  /** Devices this slot released to another slot and did not get back: calls naming them are UNAVAILABLE. */
  private readonly handedOver = new Set<string>();
  /** CreateDevice/CloneDevice calls past the retiring check; a retiring ListDevices waits for them. */
  readonly creating = new Set<Promise<unknown>>();
  /** What ends retiring when the successor stopped (slot-takeover.ts); set by the DeviceManager. */
  private reclaim: () => Promise<void> = async () => undefined;

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

  /** onReclaim sets what {@link refuseIfRetiring} runs first (SlotTakeover.reclaimIfSuccessorStopped). */
  onReclaim(fn: () => Promise<void>): void {
    this.reclaim = fn;
  }

  /** explain maps err for a public caller, logging internal failures with their stack (see explain.ts). */
  explain(err: unknown, context: string): Error {
    return explain(err, context, this.log);
  }

  /** track runs a create/clone past the retiring check, so a retiring ListDevices can wait for it. */
  track<T>(work: Promise<T>): Promise<T> {
    this.creating.add(work);
    return work.finally(() => this.creating.delete(work));
  }

  // --- handover state -------------------------------------------------------------------

  /**
   * refuseDuringHandover: CreateDevice/DeleteDevice fail UNAVAILABLE (retryable, nothing
   * changed) while a device is quiesced (a hold of milliseconds) or released.
   */
  refuseDuringHandover(deviceId: string, rec: DeviceRecord | undefined, rpc: string): void {
    if (this.quiesced.has(deviceId)) throw new UnavailableError(`${rpc} "${deviceId}": the device is quiesced for a handover; retry (nothing changed)`);
    if (rec?.state === 'released' || this.handedOver.has(deviceId)) throw this.handedOverError(rpc, deviceId);
  }

  /** handedOverError: UNAVAILABLE for a call naming a device this slot released to another slot. */
  handedOverError(rpc: string, deviceId: string): UnavailableError {
    return new UnavailableError(`${rpc} "${deviceId}": ${this.retiringWhat()}; the device was released to it; retry (nothing changed)`);
  }

  private retiringWhat(): string {
    return `this slot (${this.peers.self}) is handing its devices to ${this.retiringTo ? `slot ${this.retiringTo}` : 'another slot'}`;
  }

  /** isRetiring says whether this slot is handing its devices to another slot. */
  isRetiring(): boolean {
    return this.retiringTo !== undefined || this.handedOver.size > 0;
  }

  /** retiringTargets: the slots this one hands its devices to (every other slot when not known). */
  retiringTargets(): string[] {
    return this.retiringTo ? [this.retiringTo] : [...this.peers.others];
  }

  /**
   * beginRetiring marks this slot as handing its devices to slot `to` ('' = unknown): from
   * now on CreateDevice is UNAVAILABLE ("retry": the retry reaches the new slot once the
   * stable address moves). Called by HandoverAll's ListDevices (metadata
   * `sandnode-handover-to`) and by the first ReleaseDevice. It ends when every released
   * device came back (AbortHandover, take-back) or when the slot it hands to is found not
   * running (SlotTakeover.reclaimIfSuccessorStopped); a restart also ends it.
   */
  beginRetiring(to: string): void {
    if (this.retiringTo === to || (to === '' && this.retiringTo !== undefined)) return;
    this.retiringTo = to;
    this.log.warn({ to: to || undefined }, 'retiring: handing devices to another slot; CreateDevice and calls on released devices answer UNAVAILABLE');
  }

  /** handOver: this slot released deviceId to another slot (it is retiring from now on). */
  handOver(deviceId: string): void {
    this.handedOver.add(deviceId);
    if (this.retiringTo === undefined) this.beginRetiring('');
  }

  /** gotBack: a device this slot had released is owned here again; the last one ends retiring. */
  gotBack(deviceId: string): void {
    if (!this.handedOver.delete(deviceId)) return;
    if (this.handedOver.size === 0 && this.retiringTo !== undefined) {
      this.retiringTo = undefined;
      this.log.info('retiring ended: every released device is owned here again');
    }
  }

  /** endRetiring forgets every hand-over (the successor is not running; its devices are ours). */
  endRetiring(): void {
    this.handedOver.clear();
    this.retiringTo = undefined;
  }

  /** isHandedOver says whether deviceId was released to another slot and not got back. */
  isHandedOver(deviceId: string): boolean {
    return this.handedOver.has(deviceId);
  }

  /**
   * refuseIfRetiring: UNAVAILABLE for CreateDevice (deviceId undefined) while retiring, or for
   * a call naming a device this slot released. First, if the slot it hands its devices to is
   * not running any more, takes its devices back (and ends retiring), then serves the call.
   */
  async refuseIfRetiring(rpc: string, deviceId?: string): Promise<void> {
    if (!this.blockedByRetiring(deviceId)) return;
    await this.reclaim();
    this.refuseIfRetiringNow(rpc, deviceId);
  }

  private blockedByRetiring(deviceId: string | undefined): boolean {
    return deviceId === undefined ? this.isRetiring() : this.handedOver.has(deviceId);
  }

  /** refuseIfRetiringNow: the check of refuseIfRetiring without the reclaim (inside a device lock). */
  refuseIfRetiringNow(rpc: string, deviceId?: string): void {
    if (!this.blockedByRetiring(deviceId)) return;
    if (deviceId !== undefined) throw this.handedOverError(rpc, deviceId);
    throw new UnavailableError(`${rpc}: ${this.retiringWhat()}; retry (nothing changed)`);
  }

  /** ownedAttached returns the ready row and its attached device, or throws the handover errors. */
  async ownedAttached(deviceId: string, rpc: string): Promise<{ rec: DeviceRecord; live: AttachedDevice }> {
    const rec = this.store.get(deviceId);
    if (rec?.state === 'released' || this.handedOver.has(deviceId)) throw this.handedOverError(rpc, deviceId);
    if (!rec || rec.state !== 'ready') throw new NotFoundError(`${rpc} "${deviceId}": no such device`);
    const live = await this.locate(rec);
    if (!live) throw new FailedPreconditionError(`${rpc} "${deviceId}": the device is not attached`);
    return { rec, live };
  }

  // --- rows and their devices -----------------------------------------------------------

  /** takeBack marks a released row ready again and makes sure its device is attached. */
  async takeBack(rec: DeviceRecord): Promise<Device> {
    const live = await this.locate(rec);
    if (live) {
      try {
        await this.driver.recover(live);
      } catch (err) {
        throw this.explain(err, `taking back "${rec.deviceId}"`);
      }
    }
    this.store.update(rec.deviceId, { state: 'ready' }, this.now());
    return this.ensureAttached({ ...rec, state: 'ready' });
  }

  /** undoCreate detaches, removes the image and drops the row; keeps the row if a step fails. */
  async undoCreate(id: string, backingFile: string, attached: AttachedDevice | undefined): Promise<void> {
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
  async teardown(rec: DeviceRecord): Promise<void> {
    for (const a of await this.attachedTo(rec.backingFile)) await this.driver.detach(a.path);
    await this.images.remove(rec.backingFile);
    for (const t of await this.images.cloneTemps()) if (t.target === rec.backingFile) await this.images.remove(t.file);
    this.store.delete(rec.deviceId);
  }

  /** ensureAttached returns the device of a ready row, attaching its image if needed. */
  async ensureAttached(rec: DeviceRecord): Promise<Device> {
    const live = await this.locate(rec);
    if (live) return this.deviceFrom(rec, live);
    if (!(await this.images.exists(rec.backingFile))) {
      throw new FailedPreconditionError(`device_id "${rec.deviceId}": image ${rec.backingFile} is missing; delete the device and create it again`);
    }
    let a: AttachedDevice;
    try {
      a = await this.driver.attach(rec.backingFile, { readOnly: rec.readOnly });
    } catch (err) {
      throw this.explain(err, `CreateDevice "${rec.deviceId}": re-attach failed`);
    }
    this.store.update(rec.deviceId, { path: a.path }, this.now());
    this.log.info({ device_id: rec.deviceId, path: a.path }, 'device was detached; re-attached');
    return this.deviceFrom({ ...rec, path: a.path }, a);
  }

  /** liveIndex maps backing file -> attached devices, for files in the images dir. */
  async liveIndex(): Promise<Map<string, AttachedDevice[]>> {
    const index = new Map<string, AttachedDevice[]>();
    for (const a of await this.driver.listAttached(this.images.dir)) {
      const list = index.get(a.backingFile) ?? [];
      list.push(a);
      index.set(a.backingFile, list);
    }
    return index;
  }

  async attachedTo(backingFile: string): Promise<AttachedDevice[]> {
    return (await this.liveIndex()).get(backingFile) ?? [];
  }

  /**
   * locate returns the device the row's image is attached at: the row's own device path read
   * directly (driver lookup: one sysfs read, no scan of every loop device) when it is still
   * attached to the row's backing file; else the first device a scan finds on that file
   * (the path changed, e.g. re-attached by another slot), or undefined when it is not attached.
   */
  async locate(rec: DeviceRecord): Promise<AttachedDevice | undefined> {
    if (rec.path !== '' && this.driver.lookup) {
      const at = await this.driver.lookup(rec.path);
      if (at?.backingFile === rec.backingFile) return at;
    }
    return (await this.attachedTo(rec.backingFile))[0];
  }

  /** toDevice: the row's device from a live index; `detached` or `missing` when not attached. */
  async toDevice(rec: DeviceRecord, index: Map<string, AttachedDevice[]>): Promise<Device> {
    const live = index.get(rec.backingFile)?.[0];
    if (live) return this.deviceFrom(rec, live);
    const state = (await this.images.exists(rec.backingFile)) ? 'detached' : 'missing';
    return { ...this.deviceFrom(rec, undefined), state };
  }

  /** deviceFrom: the public Device of a row and its attached device (or none). */
  deviceFrom(rec: DeviceRecord, live: AttachedDevice | undefined): Device {
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
