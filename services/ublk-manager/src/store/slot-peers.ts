/**
 * FileSlotPeers: the other slots' tables, read-only, from the state dir both slots share, and
 * the cross-slot lock (`<stateDir>/ublk-manager/handover.lock`); read-write only while this
 * process holds the other slot's lock (`<stateDir>/ublk-manager/<slot>/lock`, so that slot is
 * not running and cannot start). See {@link SlotPeers}.
 */
import { existsSync } from 'node:fs';
import Database from 'better-sqlite3';
import { busyToUnavailable, SQLITE_BUSY_TIMEOUT_MS, waitWhileBusy } from '@sandnode/shared';
import type { DeviceStore, PeerRow, SlotPeers } from '../core/store';
import { ALL_SLOTS, handoverLockPath, slotLockPath, slotName, type Slot } from './layout';
import { FileMutex, tryLockPeer } from './locks';
import { deviceDbPath, fromRow, imagesDirOf, SqliteDeviceStore, type Row } from './sqlite-device-store';

/** FileSlotPeers implements SlotPeers on `<stateDir>/ublk-manager/<slot>/devices.db`. */
export class FileSlotPeers implements SlotPeers {
  readonly self: string;
  private readonly mutex: FileMutex;
  private readonly tables: { slot: string; file: string; lock: string }[];
  readonly others: readonly string[];
  private readonly imagesDir: string | undefined;

  /** imagesDir: the images dir (absolute, symlinks resolved); default `<stateDir>/images` (see imagesDirOf). */
  constructor(stateDir: string, slot: Slot, imagesDir?: string) {
    this.imagesDir = imagesDir;
    this.self = slotName(slot);
    this.mutex = new FileMutex(handoverLockPath(stateDir));
    this.tables = ALL_SLOTS.filter((s) => s !== slot).map((s) => ({ slot: slotName(s), file: deviceDbPath(stateDir, s), lock: slotLockPath(stateDir, s) }));
    this.others = this.tables.map((t) => t.slot);
  }

  /**
   * ifStopped: see {@link SlotPeers.ifStopped}. A slot with neither a lock file nor a table
   * never ran: it is reported stopped without creating anything.
   */
  async ifStopped(slot: string, fn: (table: DeviceStore | undefined) => Promise<void>): Promise<boolean> {
    const t = this.tables.find((x) => x.slot === slot);
    if (!t) throw new Error(`ifStopped: unknown slot ${JSON.stringify(slot)}`);
    if (!existsSync(t.lock) && !existsSync(t.file)) {
      await fn(undefined);
      return true;
    }
    const held = tryLockPeer(t.lock);
    if (!held) return false;
    try {
      if (!existsSync(t.file)) {
        await fn(undefined);
        return true;
      }
      const table = await waitWhileBusy(() => new SqliteDeviceStore(t.file, { imagesDir: this.imagesDir }), { what: `${t.file}: open` });
      try {
        await fn(table);
      } finally {
        table.close();
      }
      return true;
    } finally {
      held.release();
    }
  }

  /**
   * peerRows opens each other slot's table read-only (a fresh connection per call, so it sees
   * every committed write) and returns its row of deviceId. A table that does not exist is
   * skipped; one that cannot be read, or whose row of deviceId is quarantined, throws (the
   * caller must not guess ownership).
   */
  peerRows(deviceId: string): PeerRow[] {
    const out: PeerRow[] = [];
    for (const o of this.tables) {
      if (!existsSync(o.file)) continue;
      const db = busyToUnavailable(`${o.file}: open`, () => new Database(o.file, { readonly: true, fileMustExist: true, timeout: SQLITE_BUSY_TIMEOUT_MS }));
      try {
        const r = busyToUnavailable(`${o.file}: read`, () => db.prepare('SELECT * FROM devices WHERE device_id = ?').get(deviceId) as Row | undefined);
        if (r) out.push({ slot: o.slot, record: fromRow(r, this.imagesDir ?? imagesDirOf(o.file)) });
        // A row the other slot set aside: who owns the device is not ours to judge.
        const hasQ = busyToUnavailable(`${o.file}: read`, () => db.prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'quarantine'").get() !== undefined);
        const q = hasQ
          ? busyToUnavailable(`${o.file}: read`, () => db.prepare('SELECT reason FROM quarantine WHERE device_id = ? LIMIT 1').get(deviceId) as { reason: string } | undefined)
          : undefined;
        if (q) throw new Error(`slot ${o.slot}: the row of device ${deviceId} is quarantined (${q.reason}); its owner cannot be judged`);
      } finally {
        db.close();
      }
    }
    return out;
  }

  /** exclusive runs fn under the cross-slot flock. */
  exclusive<T>(fn: () => Promise<T>): Promise<T> {
    return this.mutex.run(fn);
  }
}
