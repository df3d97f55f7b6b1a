/**
 * The warm pool in records.db: a claim is one compare-and-swap on the row, so of many claims
 * (from two connections, as two servers of a handover would be) each member goes to exactly
 * one; a claim whose apply refuses writes nothing; the pool column follows the record (also
 * after a writer without pools left it stale, and in a records.db of a server without pools);
 * pool configs survive a reopen and rows that cannot be trusted are skipped.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { createLogger } from '@sandnode/shared';
import type { SandboxRecord } from '../core/types';
import { SqliteRecordStore } from './sqlite-record-store';

const log = createLogger('test', '0', 'silent');

function member(n: number, key = 'base'): SandboxRecord {
  const id = `sb-${n.toString(16).padStart(16, '0')}`;
  return {
    schema: 1,
    sandboxId: id,
    state: 'RUNNING',
    template: 'base',
    templatePoddVersion: '0',
    templateRootfs: '/t/base/rootfs',
    vm: { vmId: id, driver: 'runc', pid: 100 + n, startTimeTicks: 1, driverVersion: '1', apiSocket: '' },
    devices: [],
    poddAddress: '',
    createdAtMs: 1,
    updatedAtMs: n,
    expiresAtMs: 0,
    metadata: {},
    resources: { vcpus: 1, memoryMib: 512, diskBytes: 1024 ** 3, pids: 0 },
    requestId: '',
    errorMessage: '',
    resumeMethod: '',
    rootfsGeneration: 1,
    forkedFrom: '',
    forkPausedAtMs: 0,
    machineId: '',
    resetUpperDeviceId: '',
    pool: { key, state: 'READY', claimedAtMs: 0 },
  };
}

const claimAs =
  (caller: number) =>
  (r: SandboxRecord): SandboxRecord => ({ ...r, requestId: `req-${caller}`, metadata: { caller: String(caller) }, pool: { ...r.pool!, state: 'NONE', claimedAtMs: 5 } });

describe('warm pool rows in records.db', () => {
  let dir: string;
  let file: string;
  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-pool-'));
    file = path.join(dir, 'records.db');
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('of 20 claims from two connections, each of 5 members goes to exactly one; the rest find none', () => {
    const a = new SqliteRecordStore(file, log);
    const b = new SqliteRecordStore(file, log);
    for (let i = 1; i <= 5; i++) a.put(member(i));
    a.put(member(6, 'other'));
    const got: { caller: number; id: string | undefined }[] = [];
    for (let caller = 0; caller < 20; caller++) got.push({ caller, id: (caller % 2 ? a : b).claimPoolMember('base', claimAs(caller))?.sandboxId });
    const ids = got.flatMap((g) => (g.id ? [g.id] : []));
    expect(ids.sort()).toEqual([1, 2, 3, 4, 5].map((n) => member(n).sandboxId));
    // the first five callers got them, oldest member first; each record names its one caller
    expect(got.slice(0, 5).map((g) => g.id)).toEqual([1, 2, 3, 4, 5].map((n) => member(n).sandboxId));
    for (const g of got.slice(0, 5)) expect([a.get(g.id!)?.requestId, a.get(g.id!)?.pool?.state, a.findByRequestId(`req-${g.caller}`)?.sandboxId]).toEqual([`req-${g.caller}`, 'NONE', g.id]);
    // another pool's member is not taken
    expect(a.get(member(6).sandboxId)?.pool?.state).toBe('READY');
    a.close();
    b.close();
  });

  it('a burst of claims in one transaction: each member to one caller, a refused apply writes nothing and the others stand', () => {
    const s = new SqliteRecordStore(file, log);
    for (let i = 1; i <= 5; i++) s.put(member(i));
    const unfit = () => {
      throw new Error('unfit');
    };
    const got = s.claimPoolMembers('base', [claimAs(0), unfit, claimAs(2), claimAs(3), claimAs(4), claimAs(5), claimAs(6)]);
    expect(got.map((r) => (r instanceof Error ? r.message : r?.sandboxId))).toEqual([1, 'unfit', 2, 3, 4, 5, undefined].map((x) => (typeof x === 'number' ? member(x).sandboxId : x)));
    expect([1, 2, 3, 4, 5].map((n) => s.get(member(n).sandboxId)?.requestId)).toEqual(['req-0', 'req-2', 'req-3', 'req-4', 'req-5']);
    s.close();
  });

  it('a claim of one id takes only that member, only while it is READY and RUNNING', () => {
    const s = new SqliteRecordStore(file, log);
    s.put(member(1));
    s.put({ ...member(2), state: 'ERROR' });
    expect(s.claimPoolMember('base', claimAs(1), member(2).sandboxId)).toBeUndefined();
    expect(s.claimPoolMember('base', claimAs(1), member(1).sandboxId)?.sandboxId).toBe(member(1).sandboxId);
    expect(s.claimPoolMember('base', claimAs(2), member(1).sandboxId)).toBeUndefined();
    s.close();
  });

  it('a claim whose apply throws writes nothing; one that leaves the record READY is refused', () => {
    const s = new SqliteRecordStore(file, log);
    s.put(member(1));
    expect(() =>
      s.claimPoolMember('base', () => {
        throw new Error('unfit');
      }),
    ).toThrow('unfit');
    expect(() => s.claimPoolMember('base', (r) => r)).toThrow(/must take it out of pool base/);
    expect(s.get(member(1).sandboxId)?.pool).toEqual({ key: 'base', state: 'READY', claimedAtMs: 0 });
    expect(s.claimPoolMember('base', claimAs(1))?.sandboxId).toBe(member(1).sandboxId);
    s.close();
  });

  it('a records.db of a server without pools gets the pool column; a stale column is set from the record at open', () => {
    const db = new Database(file);
    db.exec(`CREATE TABLE records (sandbox_id TEXT PRIMARY KEY, state TEXT NOT NULL, request_id TEXT NOT NULL DEFAULT '', updated_at_ms INTEGER NOT NULL, record BLOB NOT NULL)`);
    db.close();
    const s = new SqliteRecordStore(file, log);
    s.put(member(1));
    s.close();
    const raw = new Database(file);
    raw.prepare("UPDATE records SET pool = ''").run();
    raw.close();
    const t = new SqliteRecordStore(file, log);
    expect(t.claimPoolMember('base', claimAs(1))?.sandboxId).toBe(member(1).sandboxId);
    t.close();
  });

  it('pool configs survive a reopen; a row whose key does not match is skipped', () => {
    const s = new SqliteRecordStore(file, log);
    s.pools().set({ key: 'base', template: 'base', resources: undefined, size: 3, updatedAtMs: 1 });
    const r = { vcpus: 2, memoryMib: 256, diskBytes: 16 * 1024 * 1024, pids: 0 };
    s.pools().set({ key: 'base@2c256m16777216d0p', template: 'base', resources: r, size: 1, updatedAtMs: 2 });
    s.close();
    const raw = new Database(file);
    raw.prepare("INSERT INTO pools (key, template, size, resources, updated_at_ms) VALUES ('evil', 'base', 3, '', 0)").run();
    raw.close();
    const t = new SqliteRecordStore(file, log);
    expect(t.pools().list()).toEqual([
      { key: 'base', template: 'base', resources: undefined, size: 3, updatedAtMs: 1 },
      { key: 'base@2c256m16777216d0p', template: 'base', resources: r, size: 1, updatedAtMs: 2 },
    ]);
    // the skipped row is reported where status looks (AdminService quarantined_records), not only in the log
    expect(t.quarantinedRows()).toEqual([{ key: 'pool evil', reason: expect.stringMatching(/^pools table row skipped, not served: key "evil" is not that of template "base"/), quarantinedAtMs: 0 }]);
    t.pools().delete('base');
    expect(
      t
        .pools()
        .list()
        .map((p) => p.key),
    ).toEqual(['base@2c256m16777216d0p']);
    // once the row is gone, so is the report
    t.pools().delete('evil');
    t.pools().list();
    expect(t.quarantinedRows()).toEqual([]);
    t.close();
  });
});
