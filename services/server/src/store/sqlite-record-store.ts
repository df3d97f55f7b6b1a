/**
 * SqliteRecordStore: runtime records in SQLite (better-sqlite3), one row per sandbox holding the
 * RuntimeRecord protobuf bytes. WAL + synchronous=FULL: a write is fsync'd when put() returns,
 * so a transition is durable before it is acknowledged.
 *
 * The row key (sandbox_id, PRIMARY KEY) is the id the blob carries: put() writes both from one
 * value and every read checks they agree, so one id is one row and a listed record is always
 * deletable by the id it shows. A row that cannot be served (blob that does not decode, a newer
 * schema, a blob id other than the key, a key that is not a sandbox id, a VM or device id that is
 * not a resource id, a blob over MAX_RECORD_BYTES) is moved at open to the
 * `quarantine` table with the reason and logged naming the id; it is never served (get answers
 * undefined, so GetSandbox says NOT_FOUND) and adoption never sees it.
 *
 * Lock contention (issue 11): the connection waits at most SQLITE_BUSY_TIMEOUT_MS (a few ms) for
 * a lock another process holds, so the event loop is never held on the DB; a step that still
 * finds the lock held throws StoreBusyError (UNAVAILABLE, retry-after-ms). The waiting is done
 * asynchronously by {@link SqliteRecordStore.open} (at open) and by gateWritesWhileBusy with
 * {@link SqliteRecordStore.probeWrite} (before a writing RPC runs).
 */
import { mkdirSync } from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import { busyToUnavailable, privateDbFile, RESOURCE_ID_RE, SANDBOX_ID_RE, SQLITE_BUSY_TIMEOUT_MS, waitWhileBusy, type Logger, type WriteProbe } from '@sandnode/shared';
import type { RecordStore, SandboxRecord } from '../core/types';
import { decodeRecord, encodeRecord, poolColumn } from './record-codec';
import { SqlitePoolStore } from './sqlite-pool-store';
import { SqliteTokenStore } from './sqlite-token-store';

/**
 * Largest record blob served, bytes (1 MiB). The largest record CreateSandbox can make is about
 * 25 KB (64 metadata entries of 63 + 256 bytes); a bigger row is set aside, so that one
 * sandbox always fits a ListSandboxes page (server.v1 pages are cut at 2 MiB, gRPC's message
 * limit is 4 MiB).
 */
export const MAX_RECORD_BYTES = 1024 * 1024;

/** Longest SqliteRecordStore.open waits for a database another process holds locked, in ms. */
export const DEFAULT_RECORDS_OPEN_WAIT_MS = 10_000;

/** Most quarantined rows GetLeaseStatus reports one by one (the rest are counted in one more row). */
export const MAX_REPORTED_QUARANTINE_ROWS = 200;
/** Longest key and reason of a reported row, characters (a key as stored may be megabytes). */
const MAX_REPORTED_KEY_CHARS = 200;
const MAX_REPORTED_REASON_CHARS = 1000;

/**
 * boundReport keeps the quarantine report small enough for one gRPC answer whatever the tables
 * hold (attacker: one pools row with a 2.2 MB key made GetLeaseStatus exceed 4 MiB, and status,
 * pool set and upgrade then said "no active server"): keys and reasons cut (with their length
 * said), at most MAX_REPORTED_QUARANTINE_ROWS rows and one row counting the others.
 */
export function boundReport(rows: { key: string; reason: string; quarantinedAtMs: number }[]): { key: string; reason: string; quarantinedAtMs: number }[] {
  const cut = (t: string, max: number) => (t.length > max ? `${t.slice(0, max)}... (${t.length} characters)` : t);
  const out = rows
    .slice(0, MAX_REPORTED_QUARANTINE_ROWS)
    .map((r) => ({ key: cut(r.key, MAX_REPORTED_KEY_CHARS), reason: cut(r.reason, MAX_REPORTED_REASON_CHARS), quarantinedAtMs: r.quarantinedAtMs }));
  if (rows.length > out.length)
    out.push({ key: '', reason: `${rows.length - out.length} more rows not shown (${rows.length} in all; see the quarantine and pools tables of records.db)`, quarantinedAtMs: 0 });
  return out;
}

export class SqliteRecordStore implements RecordStore, WriteProbe {
  private readonly db: Database.Database;
  private readonly stmts;
  /** claimPoolMembers' transaction, made once (its BEGIN IMMEDIATE / COMMIT statements are prepared with it). */
  private claimsTx: Database.Transaction<(key: string, applies: ((rec: SandboxRecord) => SandboxRecord)[]) => (SandboxRecord | undefined | Error)[]> | undefined;
  /** Rows set aside (in the quarantine table, or unreadable in a read-only store): id -> reason. */
  readonly quarantined = new Map<string, string>();
  private readonly readOnly: boolean;
  private tokenStore: SqliteTokenStore | undefined;
  private poolStore: SqlitePoolStore | undefined;

  /**
   * open opens the store like the constructor, waiting asynchronously (backoff, at most
   * maxWaitMs, default DEFAULT_RECORDS_OPEN_WAIT_MS) while another process holds the database
   * locked. Throws StoreBusyError (UNAVAILABLE) when the lock stays held.
   */
  static open(file: string, log: Logger, opts: { readOnly?: boolean; maxWaitMs?: number } = {}): Promise<SqliteRecordStore> {
    return waitWhileBusy(() => new SqliteRecordStore(file, log, opts.readOnly ?? false), { what: `${file}: open`, maxWaitMs: opts.maxWaitMs ?? DEFAULT_RECORDS_OPEN_WAIT_MS });
  }

  /**
   * Opens (creating if needed) `<stateDir>/records.db`. readOnly opens without writing. Throws
   * better-sqlite3's SQLITE_BUSY error (the database closed again) when another process holds
   * it locked: use {@link SqliteRecordStore.open} to wait for it.
   */
  constructor(
    file: string,
    private readonly log: Logger,
    readOnly = false,
  ) {
    this.readOnly = readOnly;
    mkdirSync(path.dirname(file), { recursive: true });
    if (!readOnly) privateDbFile(file); // 0600, and so its -wal/-shm (token hashes, records)
    this.db = new Database(file, { readonly: readOnly, fileMustExist: readOnly, timeout: SQLITE_BUSY_TIMEOUT_MS });
    try {
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
        CREATE TABLE IF NOT EXISTS quarantine (
          rowid_was INTEGER NOT NULL,
          sandbox_id TEXT,
          reason TEXT NOT NULL,
          quarantined_at_ms INTEGER NOT NULL,
          record BLOB
        );
      `);
        addPoolColumn(this.db);
      }
      this.stmts = {
        get: this.db.prepare<[string], { record: Buffer }>('SELECT record FROM records WHERE sandbox_id = ?'),
        list: this.db.prepare<[], { sandbox_id: string; record: Buffer }>('SELECT sandbox_id, record FROM records ORDER BY sandbox_id'),
        byRequest: this.db.prepare<[string], { sandbox_id: string; record: Buffer }>('SELECT sandbox_id, record FROM records WHERE request_id = ? LIMIT 1'),
        put: readOnly
          ? undefined
          : this.db.prepare(
              `INSERT INTO records (sandbox_id, state, request_id, updated_at_ms, record, pool) VALUES (?, ?, ?, ?, ?, ?)
             ON CONFLICT(sandbox_id) DO UPDATE SET state = excluded.state, request_id = excluded.request_id,
             updated_at_ms = excluded.updated_at_ms, record = excluded.record, pool = excluded.pool`,
            ),
        poolCandidates: readOnly
          ? undefined
          : this.db.prepare<[{ key: string; id: string }], { sandbox_id: string; record: Buffer }>(
              "SELECT sandbox_id, record FROM records WHERE pool = @key AND state = 'RUNNING' AND (@id = '' OR sandbox_id = @id) ORDER BY updated_at_ms, sandbox_id LIMIT 16",
            ),
        // the compare-and-swap of a claim: the row changes only while it is still a READY member of the pool
        claim: readOnly ? undefined : this.db.prepare("UPDATE records SET state = ?, request_id = ?, updated_at_ms = ?, record = ?, pool = ? WHERE sandbox_id = ? AND pool = ? AND state = 'RUNNING'"),
        del: readOnly ? undefined : this.db.prepare('DELETE FROM records WHERE sandbox_id = ?'),
      };
      if (!readOnly) this.quarantineBadRows();
      // the tokens table is made (and its bad rows set aside) at open too
      if (!readOnly) this.tokens();
    } catch (err) {
      this.db.close();
      throw err;
    }
  }

  /** get returns the record keyed id; undefined when there is none or its row is set aside. */
  get(id: string): SandboxRecord | undefined {
    const row = busyToUnavailable('records.db: read', () => this.stmts.get.get(id));
    return row ? this.readRow(id, row.record) : undefined;
  }

  /** list returns every servable record ordered by id (rows set aside are not in it). */
  list(): SandboxRecord[] {
    const out: SandboxRecord[] = [];
    for (const row of busyToUnavailable('records.db: read', () => this.stmts.list.all())) {
      const rec = this.readRow(row.sandbox_id, row.record);
      if (rec) out.push(rec);
    }
    return out;
  }

  /**
   * mentioning returns the servable records, other than the one keyed exceptId, whose stored
   * bytes contain one of needles (UTF-8; empty ones are ignored): every record that lists one
   * of those ids is among them (a mention elsewhere, in metadata say, only adds a candidate the
   * caller's check drops). The byte search runs in SQLite, so only candidates are decoded.
   */
  mentioning(needles: string[], exceptId: string): SandboxRecord[] {
    const set = [...new Set(needles.filter((n) => n !== ''))];
    // a blob holding a needle holds every part of it: search for the shortest ones only
    const bufs = set.filter((n) => !set.some((m) => m !== n && n.includes(m))).map((n) => Buffer.from(n, 'utf8'));
    if (bufs.length === 0) return [];
    const where = bufs.map(() => 'instr(record, ?) > 0').join(' OR ');
    const rows = busyToUnavailable('records.db: read', () =>
      this.db.prepare<unknown[], { sandbox_id: string; record: Buffer }>(`SELECT sandbox_id, record FROM records WHERE sandbox_id != ? AND (${where}) ORDER BY sandbox_id`).all(exceptId, ...bufs),
    );
    return rows.flatMap((row) => this.readRow(row.sandbox_id, row.record) ?? []);
  }

  findByRequestId(requestId: string): SandboxRecord | undefined {
    const row = busyToUnavailable('records.db: read', () => this.stmts.byRequest.get(requestId));
    return row ? this.readRow(row.sandbox_id, row.record) : undefined;
  }

  /** quarantinedIds lists the ids of rows set aside (sandbox ids only), for the orphan sweep to leave their parts alone. */
  quarantinedIds(): string[] {
    return [...this.quarantined.keys()].filter((id) => SANDBOX_ID_RE.test(id));
  }

  /**
   * probeWrite takes and drops the write lock (BEGIN IMMEDIATE; ROLLBACK), changing nothing.
   * Throws better-sqlite3's SQLITE_BUSY error when another connection holds it (after at most
   * SQLITE_BUSY_TIMEOUT_MS). gateWritesWhileBusy calls it before a writing RPC.
   */
  probeWrite(): void {
    if (this.readOnly) return;
    this.db.exec('BEGIN IMMEDIATE');
    this.db.exec('ROLLBACK');
  }

  /**
   * quarantinedRows lists the rows set aside, oldest first: key (as stored, may be no sandbox id),
   * reason and when (Unix epoch ms; 0 for a row that could not be moved yet). Never throws: with
   * the DB locked it answers what this process has seen.
   */
  quarantinedRows(): { key: string; reason: string; quarantinedAtMs: number }[] {
    let rows: { key: string; reason: string; quarantinedAtMs: number }[] = [];
    try {
      rows = this.db
        .prepare<[], { sandbox_id: string | null; reason: string; quarantined_at_ms: number }>('SELECT sandbox_id, reason, quarantined_at_ms FROM quarantine ORDER BY rowid')
        .all()
        .map((q) => ({ key: q.sandbox_id ?? '', reason: q.reason, quarantinedAtMs: q.quarantined_at_ms }));
    } catch {
      // a read-only store of a DB without the table, or a locked DB: what was seen
    }
    const seen = new Set(rows.map((r) => r.key));
    for (const [key, reason] of this.quarantined) if (!seen.has(key)) rows.push({ key, reason, quarantinedAtMs: 0 });
    // the warm-pool rows this server skips (left in the pools table): a bad row there was only in the log
    return boundReport([...rows, ...(this.poolStore?.skippedRows() ?? [])]);
  }

  /**
   * put inserts or replaces the record keyed rec.sandboxId. Throws Error for an id that is not a
   * sandbox id or a record that would be set aside when read (a bad part id, over
   * MAX_RECORD_BYTES), StoreBusyError (UNAVAILABLE) when the DB is locked (nothing written either way).
   */
  put(rec: SandboxRecord): void {
    if (!this.stmts.put) throw new Error('record store is read-only');
    if (!SANDBOX_ID_RE.test(rec.sandboxId)) throw new Error(`runtime record: ${JSON.stringify(rec.sandboxId)} is not a sandbox id`);
    const bad = partIdProblem(rec);
    if (bad) throw new Error(`runtime record ${rec.sandboxId}: ${bad}`);
    const bytes = encodeRecord(rec);
    if (bytes.length > MAX_RECORD_BYTES) throw new Error(`runtime record ${rec.sandboxId}: ${bytes.length} bytes, more than ${MAX_RECORD_BYTES}`);
    const put = this.stmts.put;
    busyToUnavailable(`records.db: write of ${rec.sandboxId}`, () => put.run(rec.sandboxId, rec.state, rec.requestId, rec.updatedAtMs, Buffer.from(bytes), poolColumn(rec)));
  }

  /**
   * claimPoolMember: see RecordStore. The swap is one UPDATE whose WHERE is the row's pool column
   * (the key of a READY member) and state RUNNING: a second claimer (this process or another
   * server on the same records.db) finds it changed and tries the next member. Throws like put
   * for a record apply made unwritable (nothing written), StoreBusyError (UNAVAILABLE).
   */
  claimPoolMember(key: string, apply: (rec: SandboxRecord) => SandboxRecord, id = ''): SandboxRecord | undefined {
    const candidates = this.stmts.poolCandidates;
    const claim = this.stmts.claim;
    if (!candidates || !claim || !key) return undefined;
    for (const row of busyToUnavailable('records.db: read', () => candidates.all({ key, id }))) {
      const rec = this.readRow(row.sandbox_id, row.record);
      if (!rec || rec.pool?.state !== 'READY' || rec.pool.key !== key) continue;
      const next = apply(rec);
      if (poolColumn(next) === key) throw new Error(`runtime record ${rec.sandboxId}: a claim must take it out of pool ${key}`);
      const bad = partIdProblem(next);
      if (bad) throw new Error(`runtime record ${next.sandboxId}: ${bad}`);
      const bytes = encodeRecord(next);
      if (bytes.length > MAX_RECORD_BYTES) throw new Error(`runtime record ${next.sandboxId}: ${bytes.length} bytes, more than ${MAX_RECORD_BYTES}`);
      const r = busyToUnavailable(`records.db: claim of ${rec.sandboxId}`, () => claim.run(next.state, next.requestId, next.updatedAtMs, Buffer.from(bytes), poolColumn(next), rec.sandboxId, key));
      if (r.changes === 1) return next;
    }
    return undefined;
  }

  /**
   * claimPoolMembers is claimPoolMember for each of applies in one transaction (one fsync for a
   * burst of claims): item i is the record claimed for applies[i], undefined when none was
   * left, or the Error its apply (or the write) threw (that item wrote nothing; the others stand).
   * StoreBusyError (UNAVAILABLE) when the DB is locked (nothing written).
   */
  claimPoolMembers(key: string, applies: ((rec: SandboxRecord) => SandboxRecord)[]): (SandboxRecord | undefined | Error)[] {
    if (!this.stmts.claim) return applies.map(() => undefined);
    this.claimsTx ??= this.db.transaction((k: string, fns: ((rec: SandboxRecord) => SandboxRecord)[]) =>
      fns.map((apply) => {
        try {
          return this.claimPoolMember(k, apply);
        } catch (err) {
          return err instanceof Error ? err : new Error(String(err));
        }
      }),
    );
    const tx = this.claimsTx;
    return busyToUnavailable(`records.db: claims of pool ${key}`, () => tx.immediate(key, applies));
  }

  delete(id: string): void {
    if (!this.stmts.del) throw new Error('record store is read-only');
    const del = this.stmts.del;
    busyToUnavailable(`records.db: delete of ${id}`, () => del.run(id));
  }

  /**
   * readRow decodes a row and checks it against its key; a row that fails is set aside (moved to
   * quarantine when writable) and answers undefined. Never throws for a bad row.
   */
  private readRow(key: string, blob: unknown): SandboxRecord | undefined {
    const why = this.rowProblem(key, blob);
    if (typeof why !== 'string') return why;
    this.setAside(key, why);
    return undefined;
  }

  /** setAside records why the row keyed key is not served and moves it to quarantine when writable. */
  private setAside(key: string, why: string): void {
    if (!this.quarantined.has(key)) this.log.error({ sandbox_id: key, reason: why }, 'runtime record set aside: not served');
    this.quarantined.set(key, why);
    if (!this.readOnly) {
      try {
        this.moveToQuarantine(key, why);
      } catch (err) {
        // still not served; the move is tried again on the next read or open
        this.log.warn({ sandbox_id: key, err }, 'could not move a runtime record to quarantine');
      }
    }
  }

  /** rowProblem gives the decoded record, or the reason the row cannot be served. */
  private rowProblem(key: string, blob: unknown): SandboxRecord | string {
    if (!SANDBOX_ID_RE.test(key)) return `row key ${JSON.stringify(key)} is not a sandbox id`;
    if (!(blob instanceof Uint8Array)) return `record is ${typeof blob}, not protobuf bytes`;
    if (blob.length > MAX_RECORD_BYTES) return `record is ${blob.length} bytes, more than ${MAX_RECORD_BYTES}`;
    let rec: SandboxRecord;
    try {
      rec = decodeRecord(blob);
    } catch (err) {
      return `record does not decode: ${(err as Error).message}`;
    }
    if (rec.sandboxId !== key) return `record carries sandbox id ${JSON.stringify(rec.sandboxId)}, not its row key`;
    return partIdProblem(rec) ?? rec;
  }

  /** quarantineBadRows sets aside, at open, every row rowProblem rejects (the rest are left as they are). */
  private quarantineBadRows(): void {
    const rows = this.db.prepare<[], { sandbox_id: string; record: unknown; pool: string }>('SELECT sandbox_id, record, pool FROM records').all();
    const good: SandboxRecord[] = [];
    for (const row of rows) {
      const rec = this.readRow(row.sandbox_id, row.record);
      if (!rec) continue;
      good.push(rec);
      // the pool column follows the blob (a writer without pools may have copied or rewritten a row)
      if (row.pool !== poolColumn(rec)) this.db.prepare('UPDATE records SET pool = ? WHERE sandbox_id = ?').run(poolColumn(rec), row.sandbox_id);
    }
    for (const [id, why] of borrowedParts(good)) this.setAside(id, why);
    const held = this.db.prepare<[], { sandbox_id: string; reason: string }>('SELECT sandbox_id, reason FROM quarantine ORDER BY rowid').all();
    for (const q of held) if (!this.quarantined.has(q.sandbox_id)) this.quarantined.set(q.sandbox_id, q.reason);
  }

  /** moveToQuarantine moves the rows keyed key to the quarantine table with the reason, in one transaction. */
  private moveToQuarantine(key: string, reason: string): void {
    this.db.transaction(() => {
      this.db
        .prepare('INSERT INTO quarantine (rowid_was, sandbox_id, reason, quarantined_at_ms, record) SELECT rowid, sandbox_id, ?, ?, record FROM records WHERE sandbox_id IS ?')
        .run(reason, Date.now(), key);
      this.db.prepare('DELETE FROM records WHERE sandbox_id IS ?').run(key);
    })();
  }

  /**
   * tokens: the API tokens in this database (sqlite-token-store.ts; the table is made on first
   * use, its bad rows are set aside like records). Throws on a read-only store.
   */
  tokens(): SqliteTokenStore {
    if (this.readOnly) throw new Error('record store is read-only');
    return (this.tokenStore ??= new SqliteTokenStore(this.db, this.log, (key, why) => this.quarantined.set(key, why)));
  }

  /** pools: the warm-pool configs in this database (sqlite-pool-store.ts; the table is made on first use). Throws on a read-only store. */
  pools(): SqlitePoolStore {
    if (this.readOnly) throw new Error('record store is read-only');
    return (this.poolStore ??= new SqlitePoolStore(this.db, this.log));
  }

  /**
   * epoch is the node's current epoch (0 before the first takeover). Throws an Error naming
   * records.db's meta row when the stored value is not a whole number (a bad edit, a bit flip:
   * read as it was it became NaN, Infinity or 3.5 and was written back, or '' read as 0 went
   * below the peers' fences; attacker): nothing is written, and the message says how to set it.
   */
  epoch(): number {
    const row = this.db.prepare<[], { value: unknown }>("SELECT value FROM meta WHERE key = 'epoch'").get();
    if (!row) return 0;
    const text = String(row.value);
    const n = /^\d{1,15}$/.test(text) ? Number(text) : NaN;
    if (!Number.isSafeInteger(n)) {
      throw new Error(
        `records.db: the meta row 'epoch' holds ${JSON.stringify(text.slice(0, 40))}, not a whole number; nothing was changed. Set it to the highest fence epoch \`sandnode status\` shows for vmm-supervisor and ublk-manager (sqlite3 records.db "UPDATE meta SET value = 'N' WHERE key = 'epoch'"), then start the server`,
      );
    }
    return n;
  }

  /**
   * bumpEpoch sets the epoch to max(stored, atLeast) + 1 and persists it (fsync) before it
   * returns. Only the lease holder calls it, at takeover. StoreBusyError when the DB is locked.
   */
  bumpEpoch(atLeast = 0): number {
    return busyToUnavailable('records.db: epoch', () =>
      this.db.transaction(() => {
        const next = Math.max(this.epoch(), atLeast) + 1;
        this.db.prepare("INSERT INTO meta (key, value) VALUES ('epoch', ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value").run(String(next));
        return next;
      })(),
    );
  }

  /**
   * bumpEpochWhenFree is bumpEpoch that waits (asynchronously, backoff, at most maxWaitMs,
   * default DEFAULT_RECORDS_OPEN_WAIT_MS) while another process holds records.db locked, so a
   * takeover neither fails at once nor holds the event loop. StoreBusyError when it stays locked.
   */
  bumpEpochWhenFree(atLeast = 0, maxWaitMs = DEFAULT_RECORDS_OPEN_WAIT_MS): Promise<number> {
    return waitWhileBusy(() => this.bumpEpoch(atLeast), { what: 'records.db: epoch', maxWaitMs });
  }

  /** checkpoint folds the WAL into the DB file (handover: the next server reads a clean file). */
  checkpoint(): void {
    this.db.pragma('wal_checkpoint(TRUNCATE)');
  }

  close(): void {
    this.db.close();
  }
}

/**
 * partIdProblem names the first id of a part (VM, device, a reset's fresh upper) the record
 * carries that is not a resource id (RESOURCE_ID_RE, what the supervisor and ublk-manager
 * accept): such a record could never be torn down. undefined when all are ids.
 */
function partIdProblem(rec: SandboxRecord): string | undefined {
  const bad = (id: string) => !RESOURCE_ID_RE.test(id);
  if (rec.vm && bad(rec.vm.vmId)) return `its VM id ${JSON.stringify(rec.vm.vmId.slice(0, 80))} is not an id`;
  for (const d of rec.devices) if (bad(d.deviceId)) return `its device id ${JSON.stringify(d.deviceId.slice(0, 80))} is not an id`;
  if (rec.resetUpperDeviceId && bad(rec.resetUpperDeviceId)) return `its reset_upper_device_id ${JSON.stringify(rec.resetUpperDeviceId.slice(0, 80))} is not an id`;
  return undefined;
}

/**
 * borrowedParts finds the records that list a VM or device another record also lists and that
 * is named after that other sandbox (`<id>` for a VM, `<id>-...` for a device: how this server
 * names the parts it makes), such as a copied or replayed row: sandbox id -> reason. Such a
 * record would act on (pause, tear down) the other sandbox's parts, so it is set aside. Parts
 * named after none of the records that list them are left to the teardown's own check.
 */
export function borrowedParts(recs: SandboxRecord[]): Map<string, string> {
  const claims = new Map<string, string[]>();
  const claim = (part: string, id: string) => {
    const ids = claims.get(part) ?? [];
    if (!ids.includes(id)) ids.push(id);
    claims.set(part, ids);
  };
  for (const r of recs) {
    if (r.vm) claim(`vm ${r.vm.vmId}`, r.sandboxId);
    for (const d of r.devices) claim(`device ${d.deviceId}`, r.sandboxId);
    if (r.resetUpperDeviceId) claim(`device ${r.resetUpperDeviceId}`, r.sandboxId);
  }
  const out = new Map<string, string>();
  for (const [part, ids] of claims) {
    if (ids.length < 2) continue;
    const name = part.slice(part.indexOf(' ') + 1);
    const owner = ids.find((id) => name === id || name.startsWith(`${id}-`));
    if (!owner) continue;
    for (const id of ids) if (id !== owner && !out.has(id)) out.set(id, `it lists ${part} of sandbox ${owner}`);
  }
  return out;
}

/**
 * addPoolColumn adds records.pool (the pool key of a READY warm-pool member, else "") and its
 * index to a records.db made by a server without pools. Servers without pools name their
 * columns on insert, so the column's default ("") is what they write.
 */
function addPoolColumn(db: Database.Database): void {
  const cols = db.prepare<[], { name: string }>('PRAGMA table_info(records)').all();
  if (!cols.some((c) => c.name === 'pool')) db.exec("ALTER TABLE records ADD COLUMN pool TEXT NOT NULL DEFAULT ''");
  db.exec("CREATE INDEX IF NOT EXISTS records_pool ON records(pool) WHERE pool != ''");
}
