import { chmodSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import type { VmRecord } from '../core/types';
import { SqliteVmStore, VM_TABLE_FILE, type QuarantinedRow } from './sqlite-vm-store';
import { MAX_VM_ROW_BYTES } from './vm-record-check';
import { useTempDir } from '@sandnode/testkit';

const BIN = '/state/vmm-supervisor/bin';
const rec = (vmId: string, over: Partial<VmRecord> = {}): VmRecord => ({
  schema: 1,
  vmId,
  state: 'running',
  pid: 10,
  startTimeTicks: 20,
  driver: 'runc',
  driverVersion: '1.1.5',
  spec: { templateRootfs: '/t', drives: [], resources: { vcpus: 0, memoryMib: 0, diskBytes: 0 }, poddSocketDir: '/p', hostname: '', env: { A: '1' } },
  createdAtMs: 1,
  apiSocket: '',
  driverBinary: '/state/vmm-supervisor/bin/runc-1.1.5/runc',
  ...over,
});

describe('SqliteVmStore', () => {
  const tmp = useTempDir('vmm-store');
  test('a new vm table and one left 0644 by an older release are 0600 after a write, and so are their -wal and -shm (the umask is not asked)', () => {
    const dir = tmp();
    const old = path.join(dir, 'old.db');
    writeFileSync(old, '');
    chmodSync(old, 0o644);
    const modes: Record<string, string> = {};
    for (const f of [path.join(dir, VM_TABLE_FILE), old]) {
      const s = new SqliteVmStore(f, { binDir: BIN });
      s.put(rec('vm-a'));
      for (const x of ['', '-wal', '-shm']) modes[path.basename(f) + x] = (statSync(f + x).mode & 0o777).toString(8);
      s.close();
    }
    expect(modes).toEqual({ 'vm-table.db': '600', 'vm-table.db-wal': '600', 'vm-table.db-shm': '600', 'old.db': '600', 'old.db-wal': '600', 'old.db-shm': '600' });
  });

  test('put/get/list/delete survive a reopen, ordered by id', () => {
    const dir = tmp();
    const s = SqliteVmStore.forStateDir(dir, { binDir: BIN });
    s.put(rec('vm-b'));
    s.put(rec('vm-a', { state: 'paused' }));
    s.close();
    const t = SqliteVmStore.forStateDir(dir, { binDir: BIN });
    expect(t.list().map((r) => [r.vmId, r.state])).toEqual([
      ['vm-a', 'paused'],
      ['vm-b', 'running'],
    ]);
    expect(t.get('vm-a')).toEqual(rec('vm-a', { state: 'paused' }));
    expect(t.delete('vm-a')).toBe(true);
    expect(t.delete('vm-a')).toBe(false);
    expect(t.get('vm-a')).toBeUndefined();
    t.close();
  });

  test('fields written by a newer release survive a read-modify-write', () => {
    const dir = tmp();
    const s = SqliteVmStore.forStateDir(dir, { binDir: BIN });
    s.put(rec('vm-a'));
    s.close();
    const db = new Database(path.join(dir, VM_TABLE_FILE));
    db.prepare('UPDATE vms SET record = json_set(record, ?, ?) WHERE vm_id = ?').run('$.futureField', 'kept', 'vm-a');
    db.close();
    const t = SqliteVmStore.forStateDir(dir, { binDir: BIN });
    t.put({ ...t.get('vm-a')!, state: 'stopped' });
    expect((t.get('vm-a') as unknown as Record<string, unknown>).futureField).toBe('kept');
    expect(t.get('vm-a')?.state).toBe('stopped');
    t.close();
  });

  /** seed writes good rows through the store, then raw rows straight into the file. */
  const seed = (dir: string, raw: [string | null, string][]) => {
    const s = SqliteVmStore.forStateDir(dir, { binDir: BIN });
    s.put(rec('vm-a'));
    s.put(rec('vm-z', { state: 'stopped', pid: 0, startTimeTicks: 0 }));
    s.close();
    const db = new Database(path.join(dir, VM_TABLE_FILE));
    for (const [id, record] of raw) db.prepare('INSERT INTO vms (vm_id, record) VALUES (?, ?)').run(id, record);
    db.close();
  };

  test('unreadable rows are moved to quarantine with their reason at open; the good rows are served', () => {
    const dir = tmp();
    const good = JSON.stringify(rec('vm-c'));
    seed(dir, [
      ['vm-trunc', JSON.stringify(rec('vm-trunc')).slice(0, 40)],
      ['vm-empty', '{}'],
      ['vm-badfield', JSON.stringify(rec('vm-badfield', { state: 'exploded' as VmRecord['state'] }))],
      ['vm-badpid', JSON.stringify(rec('vm-badpid', { pid: -1 }))],
      ['vm-newer', JSON.stringify(rec('vm-newer', { schema: 2 }))],
      ['vm-other', JSON.stringify(rec('vm-x'))],
      ['vm-c', good],
      [null, good],
    ]);
    const seen: QuarantinedRow[] = [];
    const s = SqliteVmStore.forStateDir(dir, { binDir: BIN, onQuarantine: (q) => seen.push(q) });
    expect(s.list().map((r) => r.vmId)).toEqual(['vm-a', 'vm-c', 'vm-z']);
    expect(s.get('vm-c')).toEqual(rec('vm-c'));
    const reasons = Object.fromEntries(s.quarantined().map((q) => [q.vmId || `rowid ${q.rowid}`, q.reason]));
    expect(reasons).toEqual({
      'vm-trunc': expect.stringMatching(/^record is not JSON: /),
      'vm-empty': 'schema is missing or not a positive integer',
      'vm-badfield': 'state "exploded" is not one of creating, running, paused, stopped',
      'vm-badpid': 'pid is not a non-negative integer',
      'vm-newer': 'schema 2 is newer than this release reads (1)',
      'vm-other': 'vmId "vm-x" differs from the row key "vm-other"',
      [`rowid ${s.quarantined().find((q) => q.vmId === '')?.rowid}`]: 'vmId "vm-c" differs from the row key ""',
    });
    expect(seen.map((q) => q.vmId).sort()).toEqual(['', 'vm-badfield', 'vm-badpid', 'vm-empty', 'vm-newer', 'vm-other', 'vm-trunc']);
    expect(s.quarantinedAtOpen).toEqual(seen);
    // The raw text is kept as it was; the row is gone from the VM table.
    expect(s.quarantined().find((q) => q.vmId === 'vm-empty')?.raw).toBe('{}');
    expect(s.get('vm-empty')).toBeUndefined();
    s.close();

    // Reopening finds nothing more to set aside and keeps the quarantine.
    const again: QuarantinedRow[] = [];
    const t = SqliteVmStore.forStateDir(dir, { binDir: BIN, onQuarantine: (q) => again.push(q) });
    expect(again).toEqual([]);
    expect(t.quarantined()).toHaveLength(7);
    expect(t.list().map((r) => r.vmId)).toEqual(['vm-a', 'vm-c', 'vm-z']);
    t.close();
  });

  test('a row damaged while open is quarantined on read, not returned', () => {
    const dir = tmp();
    const seen: QuarantinedRow[] = [];
    const s = SqliteVmStore.forStateDir(dir, { binDir: BIN, onQuarantine: (q) => seen.push(q) });
    s.put(rec('vm-a'));
    s.put(rec('vm-b'));
    const db = new Database(path.join(dir, VM_TABLE_FILE));
    db.prepare('UPDATE vms SET record = ? WHERE vm_id = ?').run('{"schema":1,"vmId":"vm-b"', 'vm-b');
    db.close();
    expect(s.get('vm-b')).toBeUndefined();
    expect(s.list().map((r) => r.vmId)).toEqual(['vm-a']);
    expect(seen).toEqual([expect.objectContaining({ vmId: 'vm-b', reason: expect.stringMatching(/^record is not JSON/) })]);
    s.close();
  });

  test('rows of older releases (no driverBinary, no machineId) are read', () => {
    const dir = tmp();
    const old = rec('vm-old') as unknown as Record<string, unknown>;
    delete old.driverBinary;
    seed(dir, [['vm-old', JSON.stringify(old)]]);
    const s = SqliteVmStore.forStateDir(dir, { binDir: BIN });
    expect(s.get('vm-old')).toEqual(rec('vm-old', { driverBinary: '' }));
    expect(s.quarantined()).toEqual([]);
    s.close();
  });

  test('issue 10: a row keeps the isolation its VM got across a reopen; a row without it (older release) reads as unknown; a non-list is quarantined', () => {
    const dir = tmp();
    const iso = ['vmm.cgroup-ns.v1', 'vmm.seccomp.v1'];
    seed(dir, [
      ['vm-new', JSON.stringify(rec('vm-new', { isolation: iso }))],
      ['vm-old', JSON.stringify(rec('vm-old'))],
      ['vm-bad', JSON.stringify({ ...rec('vm-bad'), isolation: 'vmm.seccomp.v1' })],
    ]);
    const s = SqliteVmStore.forStateDir(dir, { binDir: BIN });
    expect(s.get('vm-new')?.isolation).toEqual(iso);
    expect(s.get('vm-old')?.isolation).toBeUndefined();
    expect(s.quarantined().map((q) => [q.vmId, q.reason])).toEqual([['vm-bad', 'isolation is not an array of strings']]);
    s.close();
  });

  test('issue 11: rows naming a foreign driver binary, duplicating a key or over the size bound are quarantined, never served', () => {
    const dir = tmp();
    const good = JSON.stringify(rec('vm-c'));
    seed(dir, [
      ['vm-evilbin', JSON.stringify(rec('vm-evilbin', { driverBinary: '/tmp/atk/evilbin' }))],
      ['vm-dotdot', JSON.stringify(rec('vm-dotdot', { driverBinary: `${BIN}/../../../tmp/evil` }))],
      ['vm-flat', JSON.stringify(rec('vm-flat', { driverBinary: `${BIN}/runc` }))],
      // the last "state" wins in JSON.parse: the row is ambiguous
      ['vm-dup', good.replace('"vmId":"vm-c"', '"vmId":"vm-dup"').replace('"state":"running"', '"state":"stopped","state":"running"')],
      ['vm-huge', JSON.stringify(rec('vm-huge', { spec: { ...rec('x').spec, env: { A: 'x'.repeat(5 * 1024 * 1024) } } }))],
      ['vm-c', good],
    ]);
    const s = SqliteVmStore.forStateDir(dir, { binDir: BIN });
    expect(s.list().map((r) => r.vmId)).toEqual(['vm-a', 'vm-c', 'vm-z']);
    const reasons = Object.fromEntries(s.quarantined().map((q) => [q.vmId, q.reason]));
    expect(reasons).toEqual({
      'vm-evilbin': `driverBinary "/tmp/atk/evilbin" is not a copy in ${BIN}`,
      'vm-dotdot': expect.stringMatching(/^driverBinary .* is not a copy in /),
      'vm-flat': expect.stringMatching(/^driverBinary .* is not a copy in /),
      'vm-dup': expect.stringMatching(/^record is not in the form this store writes \(a duplicated key/),
      'vm-huge': expect.stringMatching(/over the 65536-byte bound/),
    });
    s.close();
  });

  test('issue 11: put refuses a row the store would not read back (nothing written)', () => {
    const dir = tmp();
    const s = SqliteVmStore.forStateDir(dir, { binDir: BIN });
    expect(() => s.put(rec('vm-a', { driverBinary: '/usr/bin/runc' }))).toThrow(/would not be readable/);
    expect(() => s.put(rec('vm-b', { spec: { ...rec('x').spec, env: { A: 'x'.repeat(MAX_VM_ROW_BYTES) } } }))).toThrow(/would not be readable/);
    expect(s.list()).toEqual([]);
    s.put(rec('vm-c', { driverBinary: '' }));
    expect(s.get('vm-c')?.driverBinary).toBe('');
    s.close();
  });
});
