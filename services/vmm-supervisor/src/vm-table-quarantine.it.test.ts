/**
 * Integration: the real vmm-supervisor process (dist/main.js) on a state dir whose VM table
 * holds unreadable rows (truncated JSON, `{}`) next to a good one: it starts, ListVms serves the
 * good row, GetVm of a quarantined id is NOT_FOUND, the log names every quarantined row and
 * /metrics counts them.
 * Needs what the other vmm-supervisor integration tests need (VMM_PARTS).
 */
import { createServer } from 'node:net';
import path from 'node:path';
import Database from 'better-sqlite3';
import { Status } from 'nice-grpc-common';
import { describeWith, expectCode } from '@sandnode/testkit';
import { Fixture, VMM_PARTS } from './__tests__/fixture';
import { SqliteVmStore, VM_TABLE_FILE } from './store/sqlite-vm-store';
import type { VmRecord } from './core/types';

/** freePort returns a TCP port of 127.0.0.1 that was free a moment ago. */
function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address() as { port: number };
      srv.close(() => resolve(port));
    });
  });
}

describeWith('vmm-supervisor VM table quarantine (real daemon)', VMM_PARTS, () => {
  let fx: Fixture;
  beforeEach(() => (fx = new Fixture()));
  afterEach(() => fx.cleanup());

  test('starts on a table with a truncated and a {} row, serves the good row and names the bad ones', async () => {
    const good: VmRecord = {
      schema: 1,
      vmId: 'vm-good',
      state: 'stopped',
      pid: 0,
      startTimeTicks: 0,
      driver: 'runc',
      driverVersion: '1.1.5',
      spec: { templateRootfs: path.join(fx.dir, 'none'), drives: [], resources: { vcpus: 0, memoryMib: 0, diskBytes: 0 }, poddSocketDir: path.join(fx.dir, 'podd-good'), hostname: '', env: {} },
      createdAtMs: 1,
      apiSocket: '',
      driverBinary: '',
    };
    const store = SqliteVmStore.forStateDir(fx.stateDir);
    store.put(good);
    store.close();
    const db = new Database(path.join(fx.stateDir, VM_TABLE_FILE));
    const insert = db.prepare('INSERT INTO vms (vm_id, record) VALUES (?, ?)');
    insert.run('vm-trunc', JSON.stringify({ ...good, vmId: 'vm-trunc' }).slice(0, 50));
    insert.run('vm-empty', '{}');
    db.close();

    const metrics = `127.0.0.1:${await freePort()}`;
    const d = await fx.start({ SANDNODE_VMM_SUPERVISOR_METRICS_LISTEN: metrics });
    const vms = (await fx.client().listVms({})).vms;
    expect(vms.map((v) => v.vmId)).toEqual(['vm-good']);
    await expectCode(fx.client().getVm({ vmId: 'vm-empty' }), Status.NOT_FOUND);
    await expectCode(fx.client().getVm({ vmId: 'vm-trunc' }), Status.NOT_FOUND);

    const log = d.log(64 * 1024);
    expect(log).toMatch(/row of vm vm-trunc cannot be read \(record is not JSON/);
    expect(log).toMatch(/row of vm vm-empty cannot be read \(schema is missing/);
    expect(log).toMatch(/2 bad row\(s\) quarantined at start: vm-empty, vm-trunc|2 bad row\(s\) quarantined at start: vm-trunc, vm-empty/);

    const scrape = await (await fetch(`http://${metrics}/metrics`)).text();
    expect(scrape).toMatch(/^sandnode_vmm_quarantined_rows 2$/m);

    const db2 = new Database(path.join(fx.stateDir, VM_TABLE_FILE), { readonly: true });
    const q = db2.prepare('SELECT vm_id, raw FROM quarantine ORDER BY vm_id').all() as { vm_id: string; raw: string }[];
    db2.close();
    expect(q).toEqual([
      { vm_id: 'vm-empty', raw: '{}' },
      { vm_id: 'vm-trunc', raw: expect.stringMatching(/^\{"schema":1,/) },
    ]);
  });
});
