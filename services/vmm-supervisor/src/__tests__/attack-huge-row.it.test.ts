/**
 * Adversarial finding (issue 11, huge rows): the VM table's check accepts a row of any size, so
 * one row whose spec.env holds 5 MB (valid JSON, every field of the right type) is served, and
 * ListVms (the server's adoption and orphan sweep call it at every start) must send it in one
 * message, above grpc-js's 4 MiB limit. The good rows must still be listed (the huge row set
 * aside, or the list paged / bounded).
 * Needs what the other vmm-supervisor integration tests need (VMM_PARTS).
 */
import path from 'node:path';
import { describeWith } from '@sandnode/testkit';
import Database from 'better-sqlite3';
import { SqliteVmStore, VM_TABLE_FILE } from '../store/sqlite-vm-store';
import type { VmRecord } from '../core/types';
import { Fixture, VMM_PARTS } from './fixture';

describeWith('vmm-supervisor: a 5 MB VM-table row (real daemon)', VMM_PARTS, () => {
  let fx: Fixture;
  beforeEach(() => (fx = new Fixture()));
  afterEach(() => fx.cleanup());

  test('does not stop ListVms from listing the good rows', async () => {
    const row = (vmId: string, env: Record<string, string>): VmRecord => ({
      schema: 1,
      vmId,
      state: 'stopped',
      pid: 0,
      startTimeTicks: 0,
      driver: 'runc',
      driverVersion: '1.1.5',
      spec: { templateRootfs: path.join(fx.dir, 'none'), drives: [], resources: { vcpus: 0, memoryMib: 0, diskBytes: 0 }, poddSocketDir: path.join(fx.dir, vmId), hostname: '', env },
      createdAtMs: 1,
      apiSocket: '',
      driverBinary: '',
    });
    const store = SqliteVmStore.forStateDir(fx.stateDir);
    store.put(row('vm-good', {}));
    store.close();
    // planted straight into the file, as an attacker would (the store's put refuses such a row)
    const db = new Database(path.join(fx.stateDir, VM_TABLE_FILE));
    db.prepare('INSERT INTO vms (vm_id, record) VALUES (?, ?)').run('vm-huge', JSON.stringify(row('vm-huge', { A: 'x'.repeat(5 * 1024 * 1024) })));
    db.close();

    await fx.start();
    const res = await fx.client().listVms({});
    const vms = res.vms.map((v) => v.vmId);
    expect(vms).toContain('vm-good');
    expect(vms).not.toContain('vm-huge');
    expect(res.quarantined.map((q) => q.key)).toEqual(['vm-huge']);
  });
});
