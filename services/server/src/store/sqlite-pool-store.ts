/**
 * Warm-pool configs (core/pool-config.ts) in the `pools` table of records.db, so that every
 * server of the node (the next one after a handover or a restart) fills the same pools. The
 * table is made when missing; servers without pools never read it. A row that cannot be
 * trusted (a key that does not match its template and resources, a size out of range) is
 * logged and skipped, never served.
 */
import type Database from 'better-sqlite3';
import { busyToUnavailable, type Logger } from '@sandnode/shared';
import { MAX_POOL_SIZE, poolKey, type PoolConfig, type PoolConfigStore } from '../core/pool-config';
import type { Resources } from '../core/types';
import { TEMPLATE_NAME_RE } from '@sandnode/template-builder';

interface Row {
  key: string;
  template: string;
  size: number;
  resources: string;
  updated_at_ms: number;
}

/** keyText is a pools row's key as reports show it: the text, or a BLOB's bytes as x'hex' (first 64 bytes). */
function keyText(k: unknown): string {
  if (typeof k === 'string') return k;
  if (Buffer.isBuffer(k)) return `x'${k.subarray(0, 64).toString('hex')}'${k.length > 64 ? `... (${k.length} bytes)` : ''}`;
  return String(k);
}

export class SqlitePoolStore implements PoolConfigStore {
  private readonly warned = new Set<string>();
  /** the rows the last list skipped: key -> why */
  private skipped = new Map<string, string>();
  /** The table's statements, prepared once (list runs on every pool claim). */
  private readonly stmts: { list: Database.Statement<[], Row>; set: Database.Statement<[string, string, number, string, number]>; del: Database.Statement<[string]> };

  constructor(
    db: Database.Database,
    private readonly log: Logger,
  ) {
    db.exec(`CREATE TABLE IF NOT EXISTS pools (
      key TEXT PRIMARY KEY,
      template TEXT NOT NULL,
      size INTEGER NOT NULL,
      resources TEXT NOT NULL DEFAULT '',
      updated_at_ms INTEGER NOT NULL
    )`);
    this.stmts = {
      list: db.prepare<[], Row>('SELECT key, template, size, resources, updated_at_ms FROM pools ORDER BY key'),
      set: db.prepare<[string, string, number, string, number]>(
        `INSERT INTO pools (key, template, size, resources, updated_at_ms) VALUES (?, ?, ?, ?, ?)
         ON CONFLICT(key) DO UPDATE SET template = excluded.template, size = excluded.size, resources = excluded.resources, updated_at_ms = excluded.updated_at_ms`,
      ),
      del: db.prepare<[string]>('DELETE FROM pools WHERE key = ?'),
    };
  }

  /** list returns the servable pools ordered by key. StoreBusyError (UNAVAILABLE) when the DB is locked. */
  list(): PoolConfig[] {
    const rows = busyToUnavailable('records.db: read', () => this.stmts.list.all());
    const skipped = new Map<string, string>();
    const out = rows.flatMap((r) => {
      const c = this.fromRow(r);
      if (typeof c !== 'string') return [c];
      // a key that is no text (a BLOB: a new Buffer on every read) is named by its bytes, so it is warned of once
      const key = keyText(r.key);
      if (!this.warned.has(key)) this.log.error({ pool: key.slice(0, 200), reason: c }, 'warm pool row skipped: not served');
      this.warned.add(key);
      skipped.set(key, c);
      return [];
    });
    this.skipped = skipped;
    return out;
  }

  /**
   * skippedRows are the rows of the pools table the last list skipped, as status shows
   * quarantined rows: key "pool <key as stored>", the reason, and quarantinedAtMs 0. They stay in
   * the table, unserved and unchanged (a newer server may read a row this one cannot), until
   * `sandnode pool set` of the same key replaces them or an operator removes them.
   */
  skippedRows(): { key: string; reason: string; quarantinedAtMs: number }[] {
    return [...this.skipped].map(([key, why]) => ({ key: `pool ${key}`, reason: `pools table row skipped, not served: ${why}`, quarantinedAtMs: 0 }));
  }

  /** set inserts or replaces c (durable on return). */
  set(c: PoolConfig): void {
    busyToUnavailable(`records.db: write of pool ${c.key}`, () => this.stmts.set.run(c.key, c.template, c.size, c.resources ? JSON.stringify(c.resources) : '', c.updatedAtMs));
  }

  /** delete removes the pool keyed key (durable on return). */
  delete(key: string): void {
    busyToUnavailable(`records.db: delete of pool ${key}`, () => this.stmts.del.run(key));
  }

  /** fromRow: the pool a row holds, or why it cannot be served. */
  private fromRow(r: Row): PoolConfig | string {
    if (typeof r.key !== 'string') return 'key is not text';
    if (!Number.isInteger(r.size) || r.size < 1 || r.size > MAX_POOL_SIZE) return `size ${r.size} is out of range 1..${MAX_POOL_SIZE}`;
    // what SetPool would have refused (validateTemplateName): such a row was never written by a server
    if (typeof r.template !== 'string' || !TEMPLATE_NAME_RE.test(r.template)) return 'template is not a template name';
    let resources: Resources | undefined;
    if (r.resources) {
      try {
        const v = JSON.parse(r.resources) as Resources;
        if (![v.vcpus, v.memoryMib, v.diskBytes, v.pids].every((n) => Number.isSafeInteger(n) && n >= 0)) return 'resources are not whole numbers';
        // the wire's widths (common/v1/resources.proto: uint32, uint32, uint64, uint32): a larger one could not be answered in GetPoolStatus
        if (![v.vcpus, v.memoryMib, v.pids].every((n) => n <= 0xffffffff)) return 'resources: vcpus, memory_mib or pids above 2^32 - 1';
        resources = { vcpus: v.vcpus, memoryMib: v.memoryMib, diskBytes: v.diskBytes, pids: v.pids };
      } catch {
        return 'resources are not JSON';
      }
    }
    if (poolKey(r.template, resources) !== r.key) return `key ${JSON.stringify(String(r.key).slice(0, 80))} is not that of template ${JSON.stringify(r.template)} and its resources`;
    return { key: r.key, template: r.template, size: r.size, resources, updatedAtMs: r.updated_at_ms };
  }
}
