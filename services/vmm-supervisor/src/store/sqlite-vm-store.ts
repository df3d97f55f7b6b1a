/**
 * SqliteVmStore: the VM table in a SQLite file (better-sqlite3), one JSON row per VM.
 * `synchronous=FULL` with WAL makes every put/delete durable when it returns. Rows keep fields
 * a newer release wrote that this one does not know (read-modify-write merges them back).
 */
import { mkdirSync } from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import type { VmRecord } from '../core/types';
import type { VmStore } from '../core/vm-store';

/** File name of the VM table inside the state dir. */
export const VM_TABLE_FILE = 'vmm-supervisor/vm-table.db';

/** SqliteVmStore implements VmStore on a SQLite file. */
export class SqliteVmStore implements VmStore {
  private readonly db: Database.Database;

  /** open creates the file (and its dir) if missing; `file` is an absolute or relative path. */
  constructor(file: string) {
    mkdirSync(path.dirname(file), { recursive: true, mode: 0o700 });
    this.db = new Database(file);
    this.db.pragma('journal_mode = WAL');
    this.db.pragma('synchronous = FULL');
    this.db.exec('CREATE TABLE IF NOT EXISTS vms (vm_id TEXT PRIMARY KEY, record TEXT NOT NULL)');
  }

  /** forStateDir opens the table at `<stateDir>/vmm-supervisor/vm-table.db`. */
  static forStateDir(stateDir: string): SqliteVmStore {
    return new SqliteVmStore(path.join(path.resolve(stateDir), VM_TABLE_FILE));
  }

  get(vmId: string): VmRecord | undefined {
    const row = this.db.prepare('SELECT record FROM vms WHERE vm_id = ?').get(vmId) as { record: string } | undefined;
    return row ? (JSON.parse(row.record) as VmRecord) : undefined;
  }

  list(): VmRecord[] {
    const rows = this.db.prepare('SELECT record FROM vms ORDER BY vm_id').all() as { record: string }[];
    return rows.map((r) => JSON.parse(r.record) as VmRecord);
  }

  put(record: VmRecord): void {
    const old = this.get(record.vmId) as Record<string, unknown> | undefined;
    const merged = { ...(old ?? {}), ...record };
    this.db.prepare('INSERT INTO vms (vm_id, record) VALUES (?, ?) ON CONFLICT(vm_id) DO UPDATE SET record = excluded.record').run(record.vmId, JSON.stringify(merged));
  }

  delete(vmId: string): boolean {
    return this.db.prepare('DELETE FROM vms WHERE vm_id = ?').run(vmId).changes > 0;
  }

  close(): void {
    this.db.close();
  }
}
