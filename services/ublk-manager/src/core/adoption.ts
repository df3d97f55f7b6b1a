/**
 * Adoption and the release sweep: what makes the device table true again after a crash.
 *
 * - {@link Adoption.adopt} (at start): reconciles this slot's rows with the kernel (keep,
 *   re-attach, clean up rows left `creating`/`deleting`, report missing images) and removes
 *   the temp files of clones a crash interrupted.
 * - {@link Adoption.converge} (at start, from ListDevices, and by the sweep timer that a
 *   release schedules): the crash-convergence rule of `released` rows: dropped when another
 *   slot owns the device, taken back when no slot took it over in time.
 */
import type { DeviceCore } from './device-core';

/** What {@link Adoption.converge} did, by device id. */
export interface ConvergeReport {
  /** Released rows whose device another slot owns: dropped. */
  dropped: string[];
  /** Released rows no other slot owns: owned (ready) again. */
  takenBack: string[];
}

/** What {@link Adoption.adopt} did, by device id. */
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

/** Delay between a release and the sweep that converges released rows, in ms. */
export const RELEASE_SWEEP_DELAY_MS = 1000;
/** Longest a sweep is pushed back by releases that keep coming (scheduleSweep), in ms. */
export const RELEASE_SWEEP_MAX_DELAY_MS = 10_000;

/** Adoption runs the start-time adoption and the release sweep on the DeviceManager's core. */
export class Adoption {
  private sweepTimer: NodeJS.Timeout | undefined;
  /** When the pending sweep was first scheduled (performance.now(), ms). */
  private sweepFirstAt = 0;

  constructor(private readonly core: DeviceCore) {}

  /**
   * adopt reconciles the table with the kernel at start: an attached device is kept; an image
   * that is present but not attached is attached again (the new path is logged); rows left
   * `creating` or `deleting` are cleaned up. Only devices backed by files in the images
   * directory are ever touched. Never throws for one device; failures are logged and reported.
   */
  async adopt(): Promise<AdoptionReport> {
    const report: AdoptionReport = { kept: [], reattached: [], cleanedUp: [], missing: [], failed: [], removedTemps: [] };
    const index = await this.core.liveIndex();
    const owned = new Set<string>();
    for (const rec of this.core.store.list()) {
      owned.add(rec.backingFile);
      await this.core.locks.run(rec.deviceId, async () => {
        const log = this.core.log.child({ device_id: rec.deviceId });
        try {
          if (rec.state === 'released') return; // handled by converge()
          if (rec.state !== 'ready') {
            await this.core.teardown(rec);
            log.info({ state: rec.state }, 'adoption: finished the cleanup of an interrupted create or delete');
            report.cleanedUp.push(rec.deviceId);
            return;
          }
          const live = index.get(rec.backingFile);
          if (live?.[0]) {
            if (live.length > 1) log.warn({ paths: live.map((a) => a.path) }, 'adoption: image is attached more than once; reporting the first');
            if (live[0].path !== rec.path) this.core.store.update(rec.deviceId, { path: live[0].path }, this.core.now());
            log.info({ path: live[0].path }, 'adoption: device attached, kept');
            report.kept.push(rec.deviceId);
          } else if (await this.core.images.exists(rec.backingFile)) {
            const a = await this.core.driver.attach(rec.backingFile, { readOnly: rec.readOnly });
            this.core.store.update(rec.deviceId, { path: a.path }, this.core.now());
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
    const quarantined = this.quarantinedImages();
    await this.removeCloneTemps(report, quarantined);
    for (const [file, devs] of index) {
      if (quarantined.has(file)) {
        this.core.log.warn(
          { backing_file: file, paths: devs.map((d) => d.path), device_id: quarantined.get(file) },
          'adoption: a device backed by the images dir belongs to a quarantined row; not ours to judge, left alone',
        );
      } else if (!owned.has(file)) {
        this.core.log.warn({ backing_file: file, paths: devs.map((d) => d.path) }, 'adoption: a device backed by the images dir has no row; left alone');
      }
    }
    this.core.log.info(report, 'adoption done');
    return report;
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
    await this.core.peers.exclusive(async () => {
      for (const rec of this.core.store.list()) {
        if (rec.state !== 'released') continue;
        const log = this.core.log.child({ device_id: rec.deviceId });
        try {
          const owner = this.core.peers.peerRows(rec.deviceId).find((r) => r.record.state !== 'released');
          if (owner) {
            this.core.store.delete(rec.deviceId);
            log.info({ owner: owner.slot }, 'converge: released device is owned by another slot; row dropped');
            report.dropped.push(rec.deviceId);
          } else if (this.core.now() - rec.updatedAtMs >= opts.takeBackAfterMs) {
            await this.core.takeBack(rec);
            this.core.gotBack(rec.deviceId);
            log.warn({ released_ms_ago: this.core.now() - rec.updatedAtMs }, 'converge: released device was not taken over by any slot; owned again');
            report.takenBack.push(rec.deviceId);
          }
        } catch (err) {
          log.error({ err }, 'converge failed for this device');
        }
      }
    });
    if (report.dropped.length + report.takenBack.length > 0) this.core.log.info(report, 'converge done');
    if (this.core.store.list().some((r) => r.state === 'released')) this.scheduleSweep();
    return report;
  }

  /**
   * scheduleSweep runs converge() once RELEASE_SWEEP_DELAY_MS after the last call, so released
   * rows do not linger. Each call pushes the sweep back: while a HandoverAll releases device
   * after device, the sweep (a peer-table read and an fsynced delete per released row, under
   * the cross-slot lock that RecoverDevice needs too) waits until the releases stop instead of
   * stalling the device being moved at that moment; never more than RELEASE_SWEEP_MAX_DELAY_MS
   * after the first call.
   */
  scheduleSweep(): void {
    const now = performance.now();
    if (this.sweepTimer) {
      if (now - this.sweepFirstAt >= RELEASE_SWEEP_MAX_DELAY_MS - RELEASE_SWEEP_DELAY_MS) return;
      clearTimeout(this.sweepTimer);
    } else {
      this.sweepFirstAt = now;
    }
    this.sweepTimer = setTimeout(() => {
      this.sweepTimer = undefined;
      void this.converge({ takeBackAfterMs: this.core.releaseTimeoutMs }).catch((err: unknown) => this.core.log.error({ err }, 'release sweep failed'));
    }, RELEASE_SWEEP_DELAY_MS);
    this.sweepTimer.unref();
  }

  /** stop clears the sweep timer. */
  stop(): void {
    if (this.sweepTimer) clearTimeout(this.sweepTimer);
    this.sweepTimer = undefined;
  }

  /**
   * removeCloneTemps (adoption, after the rows): removes every clone temp file whose device
   * no slot is creating now (no `creating` row here or in another slot's table: a running
   * slot's clone in progress keeps its temp). Such a file is the copy of a clone that crashed
   * before its rename.
   */
  /**
   * quarantinedImages: image path -> device id of each quarantined row (its `<id>.img` and the
   * backing_file it names, when it has one), never touched by adoption.
   */
  private quarantinedImages(): Map<string, string> {
    const out = new Map<string, string>();
    for (const q of this.core.store.quarantined()) {
      if (q.deviceId !== '') out.set(this.core.images.imagePath(q.deviceId), q.deviceId);
      try {
        const bf = (JSON.parse(q.rowJson) as { backing_file?: unknown }).backing_file;
        if (typeof bf === 'string' && bf !== '') out.set(bf, q.deviceId);
      } catch {
        // the raw JSON is ours; unreadable only if edited by hand: the id's image is still kept
      }
    }
    return out;
  }

  private async removeCloneTemps(report: AdoptionReport, quarantined: Map<string, string>): Promise<void> {
    let temps: { file: string; target: string }[];
    try {
      temps = await this.core.images.cloneTemps();
    } catch (err) {
      this.core.log.error({ err }, 'adoption: could not list clone temp files');
      return;
    }
    const creatingHere = new Set(
      this.core.store
        .list()
        .filter((r) => r.state === 'creating')
        .map((r) => r.backingFile),
    );
    for (const t of temps) {
      const id = t.target.endsWith('.img') ? t.target.slice(this.core.images.dir.length + 1, -'.img'.length) : '';
      const creatingElsewhere = id !== '' && this.core.peers.peerRows(id).some((r) => r.record.state === 'creating');
      if (creatingHere.has(t.target) || creatingElsewhere) continue;
      if (quarantined.has(t.target)) {
        this.core.log.warn({ file: t.file, device_id: quarantined.get(t.target) }, 'adoption: a clone temp file of a quarantined row; not ours to judge, left alone');
        continue;
      }
      try {
        await this.core.images.remove(t.file);
        this.core.log.warn({ file: t.file }, 'adoption: removed the temp file of a clone interrupted by a crash');
        report.removedTemps.push(t.file);
      } catch (err) {
        this.core.log.error({ err, file: t.file }, 'adoption: could not remove a clone temp file');
      }
    }
  }
}
