/**
 * SqliteRecordStore: runtime records in SQLite (better-sqlite3), one row per sandbox holding the
 * RuntimeRecord protobuf bytes. WAL + synchronous=FULL: a write is fsync'd when put() returns,
 * so a transition is durable before it is acknowledged.
 */
import { mkdirSync } from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import type { Logger } from '@sandnode/shared';
import type { RecordStore, SandboxRecord } from '../core/types';
import { decodeRecord, encodeRecord } from './record-codec';

export class SqliteRecordStore implements RecordStore {
  private readonly db: Database.Database;
  private readonly stmts;
  /** Records this version cannot read (newer schema): id -> reason. Never modified. */
  readonly unreadable = new Map<string, string>();

  /** Opens (creating if needed) `<stateDir>/records.db`. readOnly opens without writing. */
  constructor(
    file: string,
    private readonly log: Logger,
    readOnly = false,
  ) {
    mkdirSync(path.dirname(file), { recursive: true });
    this.db = new Database(file, { readonly: readOnly, fileMustExist: readOnly });
    if (!readOnly) {
      this.db.pragma('journal_mode = WAL');
      this.db.pragma('synchronous = FULL');
      this.db.exec(`
        CREATE TABLE IF NOT EXISTS records (
          sandbox_id TEXT PRIMARY KEY,
          state TEXT NOT NULL,
          request_id TEXT NOT NULL DEFAULT '',
          updated_at_ms INTEGER NOT NULL,
          record BLOB NOT NULL
        );
        CREATE INDEX IF NOT EXISTS records_request_id ON records(request_id) WHERE request_id != '';
        CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
      `);
    }
    this.db.pragma('busy_timeout = 5000');
    this.stmts = {
      get: this.db.prepare<[string], { record: Buffer }>('SELECT record FROM records WHERE sandbox_id = ?'),
      list: this.db.prepare<[], { sandbox_id: string; record: Buffer }>('SELECT sandbox_id, record FROM records ORDER BY sandbox_id'),
      byRequest: this.db.prepare<[string], { record: Buffer }>('SELECT record FROM records WHERE request_id = ? LIMIT 1'),
      put: readOnly
        ? undefined
        : this.db.prepare(
            `INSERT INTO records (sandbox_id, state, request_id, updated_at_ms, record) VALUES (?, ?, ?, ?, ?)
             ON CONFLICT(sandbox_id) DO UPDATE SET state = excluded.state, request_id = excluded.request_id,
             updated_at_ms = excluded.updated_at_ms, record = excluded.record`,
          ),
      del: readOnly ? undefined : this.db.prepare('DELETE FROM records WHERE sandbox_id = ?'),
    };
  }

  get(id: string): SandboxRecord | undefined {
    const row = this.stmts.get.get(id);
    return row ? decodeRecord(row.record) : undefined;
  }

  list(): SandboxRecord[] {
    const out: SandboxRecord[] = [];
    for (const row of this.stmts.list.all()) {
      try {
        out.push(decodeRecord(row.record));
      } catch (err) {
        if (!this.unreadable.has(row.sandbox_id)) this.log.error({ sandbox_id: row.sandbox_id, err }, 'record left untouched');
        this.unreadable.set(row.sandbox_id, (err as Error).message);
      }
    }
    return out;
  }

  findByRequestId(requestId: string): SandboxRecord | undefined {
    const row = this.stmts.byRequest.get(requestId);
    return row ? decodeRecord(row.record) : undefined;
  }

  put(rec: SandboxRecord): void {
    if (!this.stmts.put) throw new Error('record store is read-only');
    const bytes = encodeRecord(rec);
    this.stmts.put.run(rec.sandboxId, rec.state, rec.requestId, rec.updatedAtMs, Buffer.from(bytes));
  }

  delete(id: string): void {
    if (!this.stmts.del) throw new Error('record store is read-only');
    this.stmts.del.run(id);
  }

  /** epoch is the node's current epoch (0 before the first takeover). */
  epoch(): number {
    const row = this.db.prepare<[], { value: string }>("SELECT value FROM meta WHERE key = 'epoch'").get();
    return row ? Number(row.value) : 0;
  }

  /**
   * bumpEpoch sets the epoch to max(stored, atLeast) + 1 and persists it (fsync) before it
   * returns. Only the lease holder calls it, at takeover.
   */
  bumpEpoch(atLeast = 0): number {
    return this.db.transaction(() => {
      const next = Math.max(this.epoch(), atLeast) + 1;
      this.db.prepare("INSERT INTO meta (key, value) VALUES ('epoch', ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value").run(String(next));
      return next;
    })();
  }

  /** checkpoint folds the WAL into the DB file (handover: the next server reads a clean file). */
  checkpoint(): void {
    this.db.pragma('wal_checkpoint(TRUNCATE)');
  }

  close(): void {
    this.db.close();
  }
}
