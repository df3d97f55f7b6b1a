/**
 * Where a slot keeps its state, under the state dir shared by both slots:
 *
 *   <stateDir>/ublk-manager/epoch                 highest epoch seen (shared by all slots)
 *   <stateDir>/ublk-manager/handover.lock         flock held while a decision reads another slot's table
 *   <stateDir>/ublk-manager/<slot>/devices.db     the slot's device table ("default" when slot is "")
 *   <stateDir>/ublk-manager/<slot>/lock           flock held by the one running process of the slot
 *   <stateDir>/images/<id>.img                    image files, shared by all slots
 *
 * Release 0.0.1 kept its single table at `<stateDir>/ublk/devices.db`; the default slot moves
 * it to the new place once ({@link migrateLegacyTable}).
 */
import { existsSync, mkdirSync, renameSync } from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import { fsyncDir } from '@sandnode/shared';

/** The slots a table may belong to; '' is the slot-less default. */
export type Slot = 'a' | 'b' | '';

/** ALL_SLOTS lists every slot, default last. */
export const ALL_SLOTS: readonly Slot[] = ['a', 'b', ''];

/** slotName is the directory name of a slot: "a", "b" or "default". */
export function slotName(slot: Slot | string): string {
  return slot === '' ? 'default' : slot;
}

/** managerDir is `<stateDir>/ublk-manager` (absolute). */
export function managerDir(stateDir: string): string {
  return path.join(path.resolve(stateDir), 'ublk-manager');
}

/** slotDir is `<stateDir>/ublk-manager/<slot or "default">`. */
export function slotDir(stateDir: string, slot: Slot | string): string {
  return path.join(managerDir(stateDir), slotName(slot));
}

/** slotLockPath is `<stateDir>/ublk-manager/<slot or "default">/lock`. */
export function slotLockPath(stateDir: string, slot: Slot | string): string {
  return path.join(slotDir(stateDir, slot), 'lock');
}

/** handoverLockPath is `<stateDir>/ublk-manager/handover.lock`. */
export function handoverLockPath(stateDir: string): string {
  return path.join(managerDir(stateDir), 'handover.lock');
}

/** legacyDeviceDbPath is where release 0.0.1 kept its table: `<stateDir>/ublk/devices.db`. */
export function legacyDeviceDbPath(stateDir: string): string {
  return path.join(path.resolve(stateDir), 'ublk', 'devices.db');
}

/**
 * migrateLegacyTable moves `<stateDir>/ublk/devices.db` to `to` when `to` does not exist yet:
 * the WAL is checkpointed into the main file first, then the file is renamed and both
 * directories are fsynced. Returns true when it moved a table. Only the default slot calls it
 * (release 0.0.1 had no slots). Call it with the slot lock held.
 */
export function migrateLegacyTable(stateDir: string, to: string): boolean {
  const from = legacyDeviceDbPath(stateDir);
  if (existsSync(to) || !existsSync(from)) return false;
  const db = new Database(from);
  try {
    db.pragma('wal_checkpoint(TRUNCATE)');
    db.pragma('journal_mode = DELETE');
  } finally {
    db.close();
  }
  mkdirSync(path.dirname(to), { recursive: true });
  renameSync(from, to);
  fsyncDir(path.dirname(to));
  fsyncDir(path.dirname(from));
  return true;
}
