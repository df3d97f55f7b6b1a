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
 *
 * Bad rows (issue 11): every row is checked on its own ({@link checkRow}). A row this
 * version cannot read (unknown state or filesystem, e.g. written by a newer release; a
 * missing or mistyped field; garbage) is moved, in one transaction, to the `quarantine`
 * table of the same database (created if missing; no schema bump: older releases ignore it)
 * with its raw JSON and the reason, logged at warn, and from then on is neither served nor
 * swept: get() answers undefined (NOT_FOUND), list() skips it, insert() of its id is refused.
 * Columns this version does not know (added by a newer release without a bump, as
 * `cloned_from` was) are kept as read in {@link DeviceRecord.extra} and written back when a
 * row is re-inserted (RecoverDevice, takeover), never replaced by a default.
 *
 * Lock contention (issue 11): the connection waits at most SQLITE_BUSY_TIMEOUT_MS for a lock
 * another process holds (never the 5 s default that stalled the event loop); a step that still
 * finds it held throws StoreBusyError (UNAVAILABLE, retry-after-ms). main.ts waits for the lock
 * asynchronously at open and before each writing RPC (gateWritesWhileBusy + probeWrite).
 */
import { mkdirSync, realpathSync } from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import { busyToUnavailable, FailedPreconditionError, isSqliteBusy, privateDbFile, RESOURCE_ID_RE, SQLITE_BUSY_TIMEOUT_MS, type Logger, type WriteProbe } from '@sandnode/shared';
import type { DeviceStore, QuarantinedRow, RecordChange } from '../core/store';
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
/** Columns this version reads; any other column of a row is kept in `extra`. */
const KNOWN_COLUMNS = new Set([
  'device_id',
  'state',
  'size_bytes',
  'source_image',
  'filesystem',
  'read_only',
  'backing_file',
  'path',
  'created_at_ms',
  'updated_at_ms',
  'handover_token',
  'cloned_from',
]);
const isInt = (v: unknown): v is number => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;

/**
 * Largest row, in bytes of its JSON (all columns). A real row is a few hundred bytes (its
 * longest fields are two paths, each at most PATH_MAX = 4096 bytes); the bound keeps a planted
 * row from filling ListDevices (no paging): 4 MiB / 16 KiB = 256 rows of the largest size still
 * fit one 4 MiB message, and real rows fit ~10000.
 */
export const MAX_DEVICE_ROW_BYTES = 16 * 1024;
/** Longest quarantine reason kept, in characters (a reason quotes the bad value). */
export const MAX_REASON_CHARS = 512;

/** shortReason cuts a reason to MAX_REASON_CHARS. */
function shortReason(reason: string): string {
  return reason.length <= MAX_REASON_CHARS ? reason : `${reason.slice(0, MAX_REASON_CHARS)}... (${reason.length} chars)`;
}

/**
 * imagesDirOf is the images dir of the layout a table at `file` belongs to:
 * `<stateDir>/images` for `<stateDir>/ublk-manager/<slot>/devices.db` (see layout.ts), with
 * symlinks resolved when it exists (as FileImages names its files).
 */
export function imagesDirOf(file: string): string {
  const dir = path.resolve(path.dirname(file), '..', '..', 'images');
  try {
    return realpathSync(dir);
  } catch {
    return dir;
  }
}

/**
 * checkRow says why this version cannot read a row (unknown state or filesystem, a missing or
 * mistyped field, an id that is not RESOURCE_ID_RE, a row over MAX_DEVICE_ROW_BYTES), or
 * undefined when it can. The row's backing_file must be the row's own image,
 * `<imagesDir>/<device_id>.img` (imagesDir absolute, symlinks resolved): a row naming any other
 * file (outside the images dir, or another device's image) is refused, so nothing ever
 * attaches or unlinks a file a row merely names.
 */
export function checkRow(r: Record<string, unknown>, imagesDir: string): string | undefined {
  const size = Buffer.byteLength(JSON.stringify(r));
  if (size > MAX_DEVICE_ROW_BYTES) return `row is ${size} bytes, over the ${MAX_DEVICE_ROW_BYTES}-byte bound of a device row`;
  if (typeof r.device_id !== 'string' || !RESOURCE_ID_RE.test(r.device_id)) return `device_id ${JSON.stringify(r.device_id ?? null)} is not a device id`;
  if (typeof r.state !== 'string' || !STATES.includes(r.state as RecordState)) return `unknown state ${JSON.stringify(r.state ?? null)}`;
  if (typeof r.filesystem !== 'string' || !FILESYSTEMS.includes(r.filesystem as FilesystemKind)) return `unknown filesystem ${JSON.stringify(r.filesystem ?? null)}`;
  for (const f of ['size_bytes', 'created_at_ms', 'updated_at_ms']) if (!isInt(r[f])) return `${f} ${JSON.stringify(r[f] ?? null)} is not a non-negative integer`;
  if (r.read_only !== 0 && r.read_only !== 1) return `read_only ${JSON.stringify(r.read_only ?? null)} is not 0 or 1`;
  if (typeof r.backing_file !== 'string' || !path.isAbsolute(r.backing_file)) return `backing_file ${JSON.stringify(r.backing_file ?? null)} is not an absolute path`;
  const own = path.join(imagesDir, `${r.device_id}.img`);
  if (r.backing_file !== own) return `backing_file ${JSON.stringify(r.backing_file)} is not this device's image ${own}`;
  for (const f of ['source_image', 'path']) if (typeof r[f] !== 'string') return `${f} is missing or not text`;
  // absent in older tables (read as '')
  for (const f of ['handover_token', 'cloned_from']) if (r[f] !== undefined && r[f] !== null && typeof r[f] !== 'string') return `${f} is not text`;
  return undefined;
}

/** fromRow maps a table row to a record; throws (naming the row and the reason) on a row {@link checkRow} refuses. */
export function fromRow(r: Row, imagesDir: string): DeviceRecord {
  const bad = checkRow(r as unknown as Record<string, unknown>, imagesDir);
  if (bad) throw new Error(`devices.db: row ${JSON.stringify(String((r as { device_id?: unknown }).device_id ?? null).slice(0, 64))} cannot be read: ${shortReason(bad)}`);
  const extra: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(r)) if (!KNOWN_COLUMNS.has(k)) extra[k] = v;
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
    ...(Object.keys(extra).length > 0 ? { extra } : {}),
  };
}

/** A devices row with its rowid (kept out of the record and the quarantined JSON). */
type RawRow = Record<string, unknown> & { __rowid__: number };
const SELECT_RAW = 'SELECT rowid AS __rowid__, * FROM devices';

/** SqliteDeviceStore is the durable DeviceStore. */
export class SqliteDeviceStore implements DeviceStore, WriteProbe {
  private readonly db: Database.Database;
  private readonly log: Logger | undefined;
  /** The images dir rows must name their own image in (see {@link checkRow}). */
  readonly imagesDir: string;

  /**
   * open creates the directory and the database if needed, checks the schema version and
   * upgrades a schema-1 table (adds `handover_token`); adds the `cloned_from` column of 0.2.0
   * to a table that lacks it (no schema bump: 0.1.0 still reads it); creates the `quarantine`
   * table and moves every row this version cannot read into it (each logged at warn on log).
   * opts.imagesDir is the dir of the images (absolute, symlinks resolved, as FileImages.dir);
   * default {@link imagesDirOf}(file), the `<stateDir>/images` of the layout.
   * Throws better-sqlite3's SQLITE_BUSY error (closed again) when another process holds the
   * database locked: the caller waits with waitWhileBusy.
   */
  constructor(file: string, opts: { log?: Logger; imagesDir?: string } = {}) {
    this.log = opts.log;
    this.imagesDir = opts.imagesDir ?? imagesDirOf(file);
    mkdirSync(path.dirname(file), { recursive: true });
    privateDbFile(file); // 0600, and so its -wal/-shm
    this.db = new Database(file, { timeout: SQLITE_BUSY_TIMEOUT_MS });
    try {
      this.open(file);
    } catch (err) {
      this.db.close();
      throw err;
    }
  }

  private open(file: string): void {
    this.db.pragma('journal_mode = WAL');
    this.db.pragma('synchronous = FULL');
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
    // Not a schema bump: older releases never open this table.
    this.db.exec(`
      CREATE TABLE IF NOT EXISTS quarantine (
        device_id         TEXT NOT NULL,
        row_json          TEXT NOT NULL,
        reason            TEXT NOT NULL,
        quarantined_at_ms INTEGER NOT NULL
      ) STRICT;
    `);
    this.good(this.db.prepare(SELECT_RAW).all() as RawRow[]);
  }

  /** get returns the row of deviceId or undefined (also when the row cannot be read: it is quarantined). */
  get(deviceId: string): DeviceRecord | undefined {
    const r = busyToUnavailable('devices.db: read', () => this.db.prepare(`${SELECT_RAW} WHERE device_id = ?`).get(deviceId) as RawRow | undefined);
    return r ? this.good([r])[0] : undefined;
  }

  /** list returns every readable row ordered by device id (a row that cannot be read is quarantined, not returned). */
  list(): DeviceRecord[] {
    return this.good(busyToUnavailable('devices.db: read', () => this.db.prepare(`${SELECT_RAW} ORDER BY device_id`).all() as RawRow[]));
  }

  /**
   * insert adds a row (durable on return), with its `extra` columns that this table has (one
   * the table lacks is logged at warn: it cannot be kept). Throws on a duplicate id, and
   * FailedPreconditionError when the id is quarantined (its image is not ours to reuse).
   */
  insert(r: DeviceRecord): void {
    const q = busyToUnavailable('devices.db: read', () => this.db.prepare('SELECT reason FROM quarantine WHERE device_id = ? LIMIT 1').get(r.deviceId) as { reason: string } | undefined);
    if (q)
      throw new FailedPreconditionError(
        `device_id "${r.deviceId}": its row in ${this.db.name} is quarantined (${q.reason}); the id cannot be reused until an operator removes it from the quarantine table; nothing changed`,
      );
    const cols = ['device_id', 'state', 'size_bytes', 'source_image', 'filesystem', 'read_only', 'backing_file', 'path', 'created_at_ms', 'updated_at_ms', 'handover_token', 'cloned_from'];
    const vals: unknown[] = [
      r.deviceId,
      r.state,
      r.sizeBytes,
      r.sourceImage,
      r.filesystem,
      r.readOnly ? 1 : 0,
      r.backingFile,
      r.path,
      r.createdAtMs,
      r.updatedAtMs,
      r.handoverToken ?? '',
      r.clonedFrom ?? '',
    ];
    if (r.extra) {
      const have = new Set((this.db.prepare('PRAGMA table_info(devices)').all() as { name: string }[]).map((c) => c.name));
      for (const [k, v] of Object.entries(r.extra)) {
        if (have.has(k) && !KNOWN_COLUMNS.has(k)) {
          cols.push(k);
          vals.push(v);
        } else if (!have.has(k)) {
          this.log?.warn({ device_id: r.deviceId, column: k }, 'devices.db: this table has no column for a value written by a newer release; it is not kept');
        }
      }
    }
    const names = cols.map((c) => `"${c.replaceAll('"', '""')}"`).join(', ');
    busyToUnavailable(`devices.db: insert of ${r.deviceId}`, () => this.db.prepare(`INSERT INTO devices (${names}) VALUES (${cols.map(() => '?').join(', ')})`).run(...vals));
  }

  /** quarantined returns the quarantined rows, oldest first. */
  quarantined(): QuarantinedRow[] {
    return (
      this.db.prepare('SELECT device_id, row_json, reason, quarantined_at_ms FROM quarantine ORDER BY rowid').all() as {
        device_id: string;
        row_json: string;
        reason: string;
        quarantined_at_ms: number;
      }[]
    ).map((q) => ({
      deviceId: q.device_id,
      rowJson: q.row_json,
      reason: q.reason,
      quarantinedAtMs: q.quarantined_at_ms,
    }));
  }

  /**
   * good returns the records of the rows that can be read; the others are moved to the
   * quarantine table in one transaction and logged at warn (device and reason).
   */
  private good(rows: RawRow[]): DeviceRecord[] {
    const out: DeviceRecord[] = [];
    const bad: { rowid: number; id: string; json: string; reason: string }[] = [];
    for (const { __rowid__: rowid, ...row } of rows) {
      const reason = checkRow(row, this.imagesDir);
      if (reason === undefined) out.push(fromRow(row as unknown as Row, this.imagesDir));
      else bad.push({ rowid, id: typeof row.device_id === 'string' ? row.device_id : String(row.device_id ?? ''), json: JSON.stringify(row), reason: shortReason(reason) });
    }
    if (bad.length === 0) return out;
    const now = Date.now();
    const move = this.db.transaction(() => {
      const ins = this.db.prepare('INSERT INTO quarantine (device_id, row_json, reason, quarantined_at_ms) VALUES (?, ?, ?, ?)');
      const del = this.db.prepare('DELETE FROM devices WHERE rowid = ?');
      for (const b of bad) {
        ins.run(b.id, b.json, b.reason, now);
        del.run(b.rowid);
      }
    });
    try {
      move();
    } catch (err) {
      // still not served; moved on a later read or open
      if (!isSqliteBusy(err)) throw err;
      this.log?.warn({ devices: bad.map((b) => b.id) }, 'devices.db: rows this version cannot read are not served; the database is locked, they are moved to quarantine later');
      return out;
    }
    for (const b of bad) {
      this.log?.warn(
        { device_id: b.id, reason: b.reason, row: b.json.length <= 2048 ? b.json : `${b.json.slice(0, 2048)}... (${b.json.length} chars)` },
        'devices.db: a row this version cannot read was quarantined; it is not served, and its image and device are left alone',
      );
    }
    return out;
  }

  /** update changes state, path and/or handover token (durable on return); throws when there is no row, StoreBusyError when the DB is locked. */
  update(deviceId: string, change: RecordChange, nowMs: number): void {
    const res = busyToUnavailable(`devices.db: update of ${deviceId}`, () =>
      this.db
        .prepare('UPDATE devices SET state = COALESCE(?, state), path = COALESCE(?, path), handover_token = COALESCE(?, handover_token), updated_at_ms = ? WHERE device_id = ?')
        .run(change.state ?? null, change.path ?? null, change.handoverToken ?? null, nowMs, deviceId),
    );
    if (res.changes !== 1) throw new Error(`devices.db: device ${deviceId} has no row`);
  }

  /** delete drops the row (durable on return). */
  delete(deviceId: string): boolean {
    return busyToUnavailable(`devices.db: delete of ${deviceId}`, () => this.db.prepare('DELETE FROM devices WHERE device_id = ?').run(deviceId).changes > 0);
  }

  /** probeWrite takes and drops the write lock, changing nothing; throws SQLITE_BUSY (after at most SQLITE_BUSY_TIMEOUT_MS) while another connection holds it. */
  probeWrite(): void {
    this.db.exec('BEGIN IMMEDIATE');
    this.db.exec('ROLLBACK');
  }

  /** close closes the database. */
  close(): void {
    if (this.db.open) this.db.close();
  }
}
