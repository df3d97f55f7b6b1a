/**
 * SqliteDeviceStore: the device table of one slot in SQLite (better-sqlite3) at
 * `<stateDir>/ublk-manager/<slot or "default">/devices.db`, journal_mode=WAL and
 * synchronous=FULL, so every write is on disk (fsynced) before the call returns. The schema
 * version is kept in `user_version`; a database written by a newer schema is refused with a
 * message naming both versions.
 *
 * Schema 2 adds the `released` state and the `handover_token` column (device handover between
 * slots). It is a bump because a schema-1 reader would treat a `released` row (a device that
 * another slot now owns) as an unknown state; schema-1 tables are upgraded in place.
 *
 * The `cloned_from` column (0.2.0, CloneDevice) is NOT a bump: it is added with
 * `ALTER TABLE ... ADD COLUMN cloned_from TEXT NOT NULL DEFAULT ''`, so 0.1.0 (schema 2 too)
 * still opens the table: it reads rows with `SELECT *` and maps the columns it knows (the
 * extra one is ignored), inserts with an explicit column list (the new column gets its
 * default '') and updates only the columns it names (a clone's `cloned_from` survives). Only a
 * row that 0.1.0 re-inserts from another slot's row (RecoverDevice, takeover) loses it; see
 * the README.
 */
import { mkdirSync } from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import type { DeviceStore, RecordChange } from '../core/store';
import type { DeviceRecord, FilesystemKind, RecordState } from '../core/types';
import { slotDir } from './layout';

/** Schema version this release writes and reads. */
export const DEVICE_DB_SCHEMA = 2;

/** deviceDbPath is `<stateDir>/ublk-manager/<slot or "default">/devices.db`. */
export function deviceDbPath(stateDir: string, slot = ''): string {
  return path.join(slotDir(stateDir, slot), 'devices.db');
}

/** A row of the devices table as SQLite returns it. */
export interface Row {
  device_id: string;
  state: string;
  size_bytes: number;
  source_image: string;
  filesystem: string;
  read_only: number;
  backing_file: string;
  path: string;
  created_at_ms: number;
  updated_at_ms: number;
  handover_token?: string;
  /** Absent in tables not yet opened by 0.2.0 (peers read them read-only). */
  cloned_from?: string;
}

const STATES: readonly RecordState[] = ['creating', 'ready', 'deleting', 'released'];
const FILESYSTEMS: readonly FilesystemKind[] = ['ext4', 'none', 'inherited'];

/** fromRow maps a table row to a record; throws on an unknown state or filesystem. */
export function fromRow(r: Row): DeviceRecord {
  if (!STATES.includes(r.state as RecordState)) throw new Error(`devices.db: row ${r.device_id} has unknown state "${r.state}"`);
  if (!FILESYSTEMS.includes(r.filesystem as FilesystemKind)) throw new Error(`devices.db: row ${r.device_id} has unknown filesystem "${r.filesystem}"`);
  return {
    deviceId: r.device_id,
    state: r.state as RecordState,
    sizeBytes: r.size_bytes,
    sourceImage: r.source_image,
    filesystem: r.filesystem as FilesystemKind,
    readOnly: r.read_only !== 0,
    backingFile: r.backing_file,
    path: r.path,
    createdAtMs: r.created_at_ms,
    updatedAtMs: r.updated_at_ms,
    handoverToken: r.handover_token ?? '',
    clonedFrom: r.cloned_from ?? '',
  };
}

/** SqliteDeviceStore is the durable DeviceStore. */
export class SqliteDeviceStore implements DeviceStore {
  private readonly db: Database.Database;

  /**
   * open creates the directory and the database if needed, checks the schema version and
   * upgrades a schema-1 table (adds `handover_token`); adds the `cloned_from` column of 0.2.0
   * to a table that lacks it (no schema bump: 0.1.0 still reads it).
   */
  constructor(file: string) {
    mkdirSync(path.dirname(file), { recursive: true });
    this.db = new Database(file);
    this.db.pragma('journal_mode = WAL');
    this.db.pragma('synchronous = FULL');
    this.db.pragma('busy_timeout = 5000');
    const version = this.db.pragma('user_version', { simple: true }) as number;
    if (version > DEVICE_DB_SCHEMA) {
      this.db.close();
      throw new Error(`${file}: schema ${version} is newer than this release reads (${DEVICE_DB_SCHEMA})`);
    }
    this.db.exec(`
      CREATE TABLE IF NOT EXISTS devices (
        device_id     TEXT PRIMARY KEY,
        state         TEXT NOT NULL,
        size_bytes    INTEGER NOT NULL,
        source_image  TEXT NOT NULL,
        filesystem    TEXT NOT NULL,
        read_only     INTEGER NOT NULL,
        backing_file  TEXT NOT NULL,
        path          TEXT NOT NULL,
        created_at_ms INTEGER NOT NULL,
        updated_at_ms INTEGER NOT NULL,
        handover_token TEXT NOT NULL DEFAULT '',
        cloned_from   TEXT NOT NULL DEFAULT ''
      ) STRICT;
    `);
    const cols = (this.db.prepare('PRAGMA table_info(devices)').all() as { name: string }[]).map((c) => c.name);
    if (!cols.includes('handover_token')) this.db.exec(`ALTER TABLE devices ADD COLUMN handover_token TEXT NOT NULL DEFAULT ''`);
    // Additive, no schema bump: release 0.1.0 reads this table unchanged (see the file comment).
    if (!cols.includes('cloned_from')) this.db.exec(`ALTER TABLE devices ADD COLUMN cloned_from TEXT NOT NULL DEFAULT ''`);
    if (version < DEVICE_DB_SCHEMA) this.db.pragma(`user_version = ${DEVICE_DB_SCHEMA}`);
  }

  /** get returns the row of deviceId or undefined. */
  get(deviceId: string): DeviceRecord | undefined {
    const r = this.db.prepare('SELECT * FROM devices WHERE device_id = ?').get(deviceId) as Row | undefined;
    return r ? fromRow(r) : undefined;
  }

  /** list returns every row ordered by device id. */
  list(): DeviceRecord[] {
    return (this.db.prepare('SELECT * FROM devices ORDER BY device_id').all() as Row[]).map(fromRow);
  }

  /** insert adds a row (durable on return); throws on a duplicate id. */
  insert(r: DeviceRecord): void {
    this.db
      .prepare(
        `INSERT INTO devices (device_id, state, size_bytes, source_image, filesystem, read_only, backing_file, path, created_at_ms, updated_at_ms, handover_token, cloned_from)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
      )
      .run(r.deviceId, r.state, r.sizeBytes, r.sourceImage, r.filesystem, r.readOnly ? 1 : 0, r.backingFile, r.path, r.createdAtMs, r.updatedAtMs, r.handoverToken ?? '', r.clonedFrom ?? '');
  }

  /** update changes state, path and/or handover token (durable on return); throws when there is no row. */
  update(deviceId: string, change: RecordChange, nowMs: number): void {
    const res = this.db
      .prepare('UPDATE devices SET state = COALESCE(?, state), path = COALESCE(?, path), handover_token = COALESCE(?, handover_token), updated_at_ms = ? WHERE device_id = ?')
      .run(change.state ?? null, change.path ?? null, change.handoverToken ?? null, nowMs, deviceId);
    if (res.changes !== 1) throw new Error(`devices.db: device ${deviceId} has no row`);
  }

  /** delete drops the row (durable on return). */
  delete(deviceId: string): boolean {
    return this.db.prepare('DELETE FROM devices WHERE device_id = ?').run(deviceId).changes > 0;
  }

  /** close closes the database. */
  close(): void {
    if (this.db.open) this.db.close();
  }
}
