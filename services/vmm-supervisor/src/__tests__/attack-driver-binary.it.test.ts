/**
 * Adversarial finding (issue 11, bad rows): a VM-table row's `driverBinary` is any string, and
 * the supervisor runs it as root (`<driverBinary> --root ... state|delete ...`) for that VM: at
 * adoption and on DeleteVm (the server's orphan sweep deletes a VM no record owns). Seen on a
 * real node: a planted row naming /tmp/atk/evilbin ran it 3 times during one `sandnode up`, and
 * the row was not quarantined. A row may only name a copy in the supervisor's own binary store
 * (`<stateDir>/vmm-supervisor/bin`); anything else is set aside or ignored, never executed.
 * Needs what the other vmm-supervisor integration tests need (VMM_PARTS).
 */
import { chmodSync, existsSync, mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { describeWith } from '@sandnode/testkit';
import Database from 'better-sqlite3';
import { SqliteVmStore, VM_TABLE_FILE } from '../store/sqlite-vm-store';
import type { VmRecord } from '../core/types';
import { Fixture, VMM_PARTS } from './fixture';

describeWith('vmm-supervisor: a VM row naming a driver binary outside its store (real daemon)', VMM_PARTS, () => {
  let fx: Fixture;
  beforeEach(() => (fx = new Fixture()));
  afterEach(() => fx.cleanup());

  test('is never executed, at adoption or on DeleteVm', async () => {
    const outside = path.join(fx.dir, 'outside');
    mkdirSync(outside, { recursive: true });
    const marker = path.join(outside, 'ran');
    const evil = path.join(outside, 'evil-runc');
    writeFileSync(evil, `#!/bin/sh\necho "$*" >> ${marker}\necho '{"status":"running","pid":1}'\n`);
    chmodSync(evil, 0o755);
    const row: VmRecord = {
      schema: 1,
      vmId: 'vm-evil',
      state: 'running',
      pid: 1,
      startTimeTicks: 1,
      driver: 'runc',
      driverVersion: '1.1.5',
      spec: { templateRootfs: path.join(fx.dir, 'none'), drives: [], resources: { vcpus: 0, memoryMib: 0, diskBytes: 0 }, poddSocketDir: path.join(fx.dir, 'podd-evil'), hostname: '', env: {} },
      createdAtMs: 1,
      apiSocket: '',
      driverBinary: evil,
    };
    // planted straight into the file, as an attacker would (the store's put refuses such a row)
    SqliteVmStore.forStateDir(fx.stateDir).close();
    const db = new Database(path.join(fx.stateDir, VM_TABLE_FILE));
    db.prepare('INSERT INTO vms (vm_id, record) VALUES (?, ?)').run(row.vmId, JSON.stringify(row));
    db.close();

    await fx.start();
    await fx.client().listVms({});
    await fx
      .client()
      .deleteVm({ vmId: 'vm-evil' })
      .catch(() => undefined);
    expect(existsSync(marker)).toBe(false);
  });
});
