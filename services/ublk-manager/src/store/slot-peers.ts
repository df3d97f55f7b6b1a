/**
 * FileSlotPeers: the other slots' tables, read-only, from the state dir both slots share, and
 * the cross-slot lock (`<stateDir>/ublk-manager/handover.lock`). See {@link SlotPeers}.
 */
import { existsSync } from 'node:fs';
import Database from 'better-sqlite3';
import type { PeerRow, SlotPeers } from '../core/store';
import { ALL_SLOTS, handoverLockPath, slotName, type Slot } from './layout';
import { FileMutex } from './locks';
import { deviceDbPath, fromRow, type Row } from './sqlite-device-store';

/** FileSlotPeers implements SlotPeers on `<stateDir>/ublk-manager/<slot>/devices.db`. */
export class FileSlotPeers implements SlotPeers {
  readonly self: string;
  private readonly mutex: FileMutex;
  private readonly others: { slot: string; file: string }[];

  constructor(stateDir: string, slot: Slot) {
    this.self = slotName(slot);
    this.mutex = new FileMutex(handoverLockPath(stateDir));
    this.others = ALL_SLOTS.filter((s) => s !== slot).map((s) => ({ slot: slotName(s), file: deviceDbPath(stateDir, s) }));
  }

  /**
   * peerRows opens each other slot's table read-only (a fresh connection per call, so it sees
   * every committed write) and returns its row of deviceId. A table that does not exist is
   * skipped; one that cannot be read throws (the caller must not guess ownership).
   */
  peerRows(deviceId: string): PeerRow[] {
    const out: PeerRow[] = [];
    for (const o of this.others) {
      if (!existsSync(o.file)) continue;
      const db = new Database(o.file, { readonly: true, fileMustExist: true });
      try {
        db.pragma('busy_timeout = 5000');
        const r = db.prepare('SELECT * FROM devices WHERE device_id = ?').get(deviceId) as Row | undefined;
        if (r) out.push({ slot: o.slot, record: fromRow(r) });
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
