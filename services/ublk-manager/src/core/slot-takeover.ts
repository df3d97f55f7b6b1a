/**
 * Slot takeover: the devices of an A/B slot that is not running become this slot's.
 *
 * - {@link SlotTakeover.takeOverStoppedPeers} (at every start, and by a retiring slot whose
 *   successor stopped): under the cross-slot lock, every row of a slot whose slot lock can be
 *   taken is verified and moved here, dropped, or cleaned up (the takeover rule).
 * - {@link SlotTakeover.reclaimIfSuccessorStopped}: a slot that was handing its devices to
 *   another (HandoverAll's ListDevices, ReleaseDevice) and finds that slot not running takes
 *   its devices back and stops retiring.
 */
import type { Adoption } from './adoption';
import type { DeviceCore } from './device-core';
import type { DeviceStore } from './store';
import type { DeviceRecord } from './types';

/** What {@link SlotTakeover.takeOverStoppedPeers} did, by device id. */
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

/** SlotTakeover applies the takeover rule on the DeviceManager's core. */
export class SlotTakeover {
  constructor(
    private readonly core: DeviceCore,
    private readonly adoption: Adoption,
  ) {}

  /**
   * reclaimIfSuccessorStopped: while retiring, when the slot this one hands its devices to
   * (every other slot when it is not known) is not running, the move is over: its devices are
   * taken over ({@link takeOverStoppedPeers}), this slot's released rows that nobody owns are
   * taken back, and retiring ends.
   */
  async reclaimIfSuccessorStopped(): Promise<void> {
    if (!this.core.isRetiring()) return;
    const to = this.core.retiringTargets();
    const r = await this.takeOverStoppedPeers();
    if (!to.every((s) => r.stopped.includes(s))) return;
    await this.adoption.converge({ takeBackAfterMs: 0 });
    this.core.endRetiring();
    this.core.log.warn({ to, taken_over: r.takenOver }, 'retiring ended: the slot this one was handing its devices to is not running; its devices are owned here again');
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
    await this.core.peers.exclusive(async () => {
      for (const slot of this.core.peers.others) {
        const stopped = await this.core.peers.ifStopped(slot, async (theirs) => {
          if (theirs) for (const row of theirs.list()) await this.takeOverRow(slot, theirs, row, report);
        });
        if (stopped) report.stopped.push(slot);
      }
    });
    if (report.takenOver.length + report.dropped.length + report.cleanedUp.length + report.failed.length > 0) this.core.log.info(report, 'takeover of stopped slots done');
    return report;
  }

  private async takeOverRow(slot: string, theirs: DeviceStore, row: DeviceRecord, report: TakeoverReport): Promise<void> {
    const id = row.deviceId;
    const log = this.core.log.child({ device_id: id, from_slot: slot, their_state: row.state });
    try {
      const own = this.core.store.get(id);
      if (row.state === 'ready' || row.state === 'released') {
        if (own?.state === 'ready') {
          theirs.delete(id);
          log.info("takeover: this slot owns the device; the stopped slot's row is dropped");
          report.dropped.push(id);
          return;
        }
        if (own && own.state !== 'released') {
          log.error({ own_state: own.state }, 'takeover: both slots have an unfinished row for this device; left alone');
          report.failed.push(id);
          return;
        }
        const elsewhere = this.core.peers.peerRows(id).find((r) => r.slot !== slot && r.record.state !== 'released');
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
        let live = await this.core.locate(row);
        if (live) live = await this.core.driver.recover(live);
        const rec: DeviceRecord = { ...row, state: 'ready', path: live?.path ?? row.path, updatedAtMs: this.core.now() };
        if (own) this.core.store.delete(id); // our stale released row: the move out of this slot is undone
        this.core.store.insert(rec);
        theirs.delete(id);
        this.core.gotBack(id);
        if (!live) {
          if (await this.core.images.exists(rec.backingFile)) {
            const a = await this.core.driver.attach(rec.backingFile, { readOnly: rec.readOnly });
            this.core.store.update(id, { path: a.path }, this.core.now());
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
      this.core.store.insert(row);
      theirs.delete(id);
      await this.core.teardown(row);
      log.info('takeover: finished the cleanup of an interrupted create or delete of the stopped slot');
      report.cleanedUp.push(id);
    } catch (err) {
      log.error({ err }, 'takeover failed for this device; left where it is');
      report.failed.push(id);
    }
  }
}
