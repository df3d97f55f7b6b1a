/**
 * SqliteVmStore: the VM table in a SQLite file (better-sqlite3), one JSON row per VM.
 * `synchronous=FULL` with WAL makes every put/delete durable when it returns. Rows keep fields
 * a newer release wrote that this one does not know (read-modify-write merges them back).
 *
 * A row that cannot be read (not JSON, not an object, a bad or missing field, a newer schema:
 * see {@link parseVmRecord}) is never served: it is moved, in one transaction, to the
 * `quarantine` table of the same file (vm_id, raw, reason, quarantined_at_ms) and reported
 * through `onQuarantine`. Every row is checked when the store opens, and again whenever read.
 *
 * Lock contention (issue 11): the connection waits at most SQLITE_BUSY_TIMEOUT_MS for a lock
 * another process holds (better-sqlite3's default, 5 s, stalled the event loop); a step that
 * still finds it held throws StoreBusyError (UNAVAILABLE, retry-after-ms). main.ts waits for
 * the lock asynchronously at open and before each writing RPC (gateWritesWhileBusy + probeWrite).
 */
import { mkdirSync } from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import { busyToUnavailable, InternalError, isSqliteBusy, privateDbFile, SQLITE_BUSY_TIMEOUT_MS, type WriteProbe } from '@sandnode/shared';
import type { VmRecord } from '../core/types';
import type { VmStore } from '../core/vm-store';
import { parseVmRecord, type VmRowContext } from './vm-record-check';

/** File name of the VM table inside the state dir. */
export const VM_TABLE_FILE = 'vmm-supervisor/vm-table.db';

/** QuarantinedRow is a VM-table row set aside because it cannot be read. */
export interface QuarantinedRow {
  /** The row's key; '' when it had none. */
  vmId: string;
  /** SQLite rowid the row had in `vms` (names it when vmId is ''). */
  rowid: number;
  /** Why it was set aside, e.g. "record is not JSON: Unexpected end of JSON input". */
  reason: string;
  /** When it was moved, Unix epoch ms. */
  quarantinedAtMs: number;
}

/**
 * SqliteVmStoreOptions: onQuarantine is called once for every row moved to quarantine; binDir
 * is the dir of the driver binaries a row may name (default `bin` next to the file, i.e.
 * `<stateDir>/vmm-supervisor/bin` for forStateDir, the DriverBinaries dir).
 */
export interface SqliteVmStoreOptions {
  onQuarantine?: (row: QuarantinedRow) => void;
  binDir?: string;
}

/** Longest quarantine reason kept, in characters (a reason may quote the bad value). */
const MAX_REASON_CHARS = 512;

interface Row {
  rowid: number;
  vm_id: string | null;
  record: unknown;
}

/** SqliteVmStore implements VmStore on a SQLite file. */
export class SqliteVmStore implements VmStore, WriteProbe {
  private readonly db: Database.Database;
  private readonly onQuarantine: (row: QuarantinedRow) => void;
  private readonly ctx: VmRowContext;
  /** The rows moved to quarantine while opening (empty when every row was good). */
  readonly quarantinedAtOpen: QuarantinedRow[];

  /**
   * open creates the file (and its dir) if missing; `file` is an absolute or relative path.
   * Checks every row and moves the bad ones to quarantine (one transaction) before returning.
   * Throws better-sqlite3's SQLITE_BUSY error (closed again) while another process holds the
   * file locked: the caller waits with waitWhileBusy.
   */
  constructor(file: string, opts: SqliteVmStoreOptions = {}) {
    mkdirSync(path.dirname(file), { recursive: true, mode: 0o700 });
    privateDbFile(file); // 0600, and so its -wal/-shm
    this.db = new Database(file, { timeout: SQLITE_BUSY_TIMEOUT_MS });
    this.onQuarantine = opts.onQuarantine ?? (() => {});
    this.ctx = { binDir: path.resolve(opts.binDir ?? path.join(path.dirname(path.resolve(file)), 'bin')) };
    this.quarantinedAtOpen = [];
    try {
      this.db.pragma('journal_mode = WAL');
      this.db.pragma('synchronous = FULL');
      this.db.exec('CREATE TABLE IF NOT EXISTS vms (vm_id TEXT PRIMARY KEY, record TEXT NOT NULL)');
      this.db.exec('CREATE TABLE IF NOT EXISTS quarantine (vm_id TEXT NOT NULL, raw TEXT, reason TEXT NOT NULL, quarantined_at_ms INTEGER NOT NULL)');
      this.readRows(this.db.prepare('SELECT rowid, vm_id, record FROM vms').all() as Row[], this.quarantinedAtOpen, true);
    } catch (err) {
      this.db.close();
      throw err;
    }
  }

  /** database is the open SQLite file (the network slot table lives in it too: store/slot-store.ts). */
  get database(): Database.Database {
    return this.db;
  }

  /** forStateDir opens the table at `<stateDir>/vmm-supervisor/vm-table.db`. */
  static forStateDir(stateDir: string, opts: SqliteVmStoreOptions = {}): SqliteVmStore {
    return new SqliteVmStore(path.join(path.resolve(stateDir), VM_TABLE_FILE), opts);
  }

  get(vmId: string): VmRecord | undefined {
    const row = busyToUnavailable('vm-table.db: read', () => this.db.prepare('SELECT rowid, vm_id, record FROM vms WHERE vm_id = ?').get(vmId) as Row | undefined);
    return row ? this.readRows([row])[0] : undefined;
  }

  list(): VmRecord[] {
    return this.readRows(busyToUnavailable('vm-table.db: read', () => this.db.prepare('SELECT rowid, vm_id, record FROM vms ORDER BY vm_id').all() as Row[]));
  }

  /** quarantined lists the quarantine table, oldest first. */
  quarantined(): (QuarantinedRow & { raw: string | null })[] {
    const rows = busyToUnavailable('vm-table.db: read', () => this.db.prepare('SELECT rowid, vm_id, raw, reason, quarantined_at_ms FROM quarantine ORDER BY rowid').all()) as {
      rowid: number;
      vm_id: string;
      raw: string | null;
      reason: string;
      quarantined_at_ms: number;
    }[];
    return rows.map((r) => ({ vmId: r.vm_id, rowid: r.rowid, raw: r.raw, reason: r.reason, quarantinedAtMs: r.quarantined_at_ms }));
  }

  /**
   * readRows parses rows; the bad ones are moved to quarantine in one transaction (and pushed to
   * `moved`). A locked file leaves them where they are (still not served; moved on a later read),
   * except at open (atOpen), where the lock error is thrown so that the open is retried.
   */
  private readRows(rows: Row[], moved: QuarantinedRow[] = [], atOpen = false): VmRecord[] {
    const good: VmRecord[] = [];
    const bad: (QuarantinedRow & { raw: unknown })[] = [];
    const now = Date.now();
    for (const row of rows) {
      try {
        good.push(parseVmRecord(row.record, row.vm_id ?? '', this.ctx));
      } catch (err) {
        const msg = (err as Error).message;
        const reason = msg.length <= MAX_REASON_CHARS ? msg : `${msg.slice(0, MAX_REASON_CHARS)}... (${msg.length} chars)`;
        bad.push({ vmId: row.vm_id ?? '', rowid: row.rowid, raw: row.record, reason, quarantinedAtMs: now });
      }
    }
    if (bad.length === 0) return good;
    const insert = this.db.prepare('INSERT INTO quarantine (vm_id, raw, reason, quarantined_at_ms) VALUES (?, ?, ?, ?)');
    const remove = this.db.prepare('DELETE FROM vms WHERE rowid = ?');
    try {
      this.db.transaction(() => {
        for (const b of bad) {
          insert.run(b.vmId, typeof b.raw === 'string' ? b.raw : b.raw == null ? null : String(b.raw), b.reason, b.quarantinedAtMs);
          remove.run(b.rowid);
        }
      })();
    } catch (err) {
      if (atOpen || !isSqliteBusy(err)) throw err;
      return good;
    }
    for (const { raw: _raw, ...q } of bad) {
      moved.push(q);
      this.onQuarantine(q);
    }
    return good;
  }

  /**
   * put writes the record (durable on return), merged over the stored one. StoreBusyError
   * (UNAVAILABLE) when the file is locked; InternalError (nothing written) when the row would be
   * one this store refuses to read (see parseVmRecord: too large, a driver binary outside the
   * binary dir...): such a row is never written.
   */
  put(record: VmRecord): void {
    const old = this.get(record.vmId) as Record<string, unknown> | undefined;
    const merged = { ...(old ?? {}), ...record };
    const text = JSON.stringify(merged);
    try {
      parseVmRecord(text, record.vmId, this.ctx);
    } catch (err) {
      throw new InternalError(`vm-table.db: the row of ${record.vmId} would not be readable (${(err as Error).message.slice(0, MAX_REASON_CHARS)}); nothing written`);
    }
    busyToUnavailable(`vm-table.db: write of ${record.vmId}`, () =>
      this.db.prepare('INSERT INTO vms (vm_id, record) VALUES (?, ?) ON CONFLICT(vm_id) DO UPDATE SET record = excluded.record').run(record.vmId, text),
    );
  }

  /** delete drops the row (durable on return). StoreBusyError (UNAVAILABLE) when the file is locked. */
  delete(vmId: string): boolean {
    return busyToUnavailable(`vm-table.db: delete of ${vmId}`, () => this.db.prepare('DELETE FROM vms WHERE vm_id = ?').run(vmId).changes > 0);
  }

  /** probeWrite takes and drops the write lock, changing nothing; throws SQLITE_BUSY (after at most SQLITE_BUSY_TIMEOUT_MS) while another connection holds it. */
  probeWrite(): void {
    this.db.exec('BEGIN IMMEDIATE');
    this.db.exec('ROLLBACK');
  }

  close(): void {
    this.db.close();
  }
}
