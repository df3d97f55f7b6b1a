/**
 * Adversarial finding (issue 11, "a duplicate record is an undeletable ghost" / rows that
 * reference the parts of other sandboxes): a record is trusted for the VM and devices it lists.
 * A duplicate of a live sandbox's record under another id (a copy, a replayed row) in state
 * CREATING or DELETING is torn down by adoption at the next server start, and the teardown
 * deletes the VM and the devices the copy lists: those of the live sandbox. Seen on a real node:
 * after one restart the live sandbox was ERROR "its VM process is gone", its container and both
 * images deleted. A teardown may only remove parts no other record owns.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@sandnode/shared';
import { SqliteRecordStore } from '../../store/sqlite-record-store';
import { adoptAll } from '../adoption';
import { SandboxManager } from '../sandbox-manager';
import type { SandboxRecord } from '../types';
import { managerOptions, Peers } from './fake-peers';

const log = createLogger('test', '0', 'silent');

describe.each(['CREATING', 'DELETING'] as const)('a %s record that lists the VM and devices of another, live sandbox', (state) => {
  let dir: string;
  let store: SqliteRecordStore;
  let peers: Peers;
  let m: SandboxManager;

  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-attack-ghost-'));
    store = new SqliteRecordStore(path.join(dir, 'records.db'), log);
    peers = new Peers();
    m = new SandboxManager(managerOptions(peers, store, dir));
  });
  afterEach(() => {
    store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('is torn down at adoption without touching the live sandbox', async () => {
    const live = await m.create({ template: 'base', timeoutSeconds: 0, metadata: {}, resources: undefined, requestId: '' });
    const copy = store.get(live.sandboxId)!;
    const ghost: SandboxRecord = { ...copy, sandboxId: 'sb-dddddddddddddddd', state };
    store.put(ghost);

    await adoptAll({ store, vms: peers.vmPort, devices: peers.devicePort, podd: peers.podd, manager: m, log });

    expect(store.get(live.sandboxId)?.state).toBe('RUNNING');
    expect([...peers.vms.keys()]).toEqual([live.sandboxId]);
    expect([...peers.devices.keys()].sort()).toEqual([`${live.sandboxId}-upper`, `${live.sandboxId}-ws`]);
  });
});
