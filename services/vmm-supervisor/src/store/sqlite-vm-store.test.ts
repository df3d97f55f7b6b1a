import path from 'node:path';
import Database from 'better-sqlite3';
import type { VmRecord } from '../core/types';
import { SqliteVmStore, VM_TABLE_FILE } from './sqlite-vm-store';
import { useTempDir } from '@sandnode/testkit';

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
  test('put/get/list/delete survive a reopen, ordered by id', () => {
    const dir = tmp();
    const s = SqliteVmStore.forStateDir(dir);
    s.put(rec('vm-b'));
    s.put(rec('vm-a', { state: 'paused' }));
    s.close();
    const t = SqliteVmStore.forStateDir(dir);
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
    const s = SqliteVmStore.forStateDir(dir);
    s.put(rec('vm-a'));
    s.close();
    const db = new Database(path.join(dir, VM_TABLE_FILE));
    db.prepare('UPDATE vms SET record = json_set(record, ?, ?) WHERE vm_id = ?').run('$.futureField', 'kept', 'vm-a');
    db.close();
    const t = SqliteVmStore.forStateDir(dir);
    t.put({ ...t.get('vm-a')!, state: 'stopped' });
    expect((t.get('vm-a') as unknown as Record<string, unknown>).futureField).toBe('kept');
    expect(t.get('vm-a')?.state).toBe('stopped');
    t.close();
  });
});
