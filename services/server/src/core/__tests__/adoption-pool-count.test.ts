/**
 * Adoption counts warm-pool members apart from users' sandboxes (newcomer finding: `sandnode
 * upgrade server` said "5 sandboxes adopted" on a node whose `ls` showed 2, the other 3 being
 * pool members ListSandboxes never shows). A member claimed by a CreateSandbox (pool state
 * NONE) is a user's sandbox again.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@sandnode/shared';
import { SqliteRecordStore } from '../../store/sqlite-record-store';
import { adoptAll } from '../adoption';
import { SandboxManager } from '../sandbox-manager';
import { managerOptions, Peers } from './fake-peers';

const log = createLogger('test', '0', 'silent');

describe('adoption report', () => {
  let dir: string;
  let store: SqliteRecordStore;
  let peers: Peers;

  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-adopt-pool-'));
    store = new SqliteRecordStore(path.join(dir, 'records.db'), log);
    peers = new Peers();
  });
  afterEach(() => {
    store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('lists READY and CLAIMING pool members in poolMembers and users sandboxes (claimed ones included) in adopted', async () => {
    const m = new SandboxManager(managerOptions(peers, store, dir));
    const create = () => m.create({ template: 'base', timeoutSeconds: 0, metadata: {}, resources: undefined, requestId: '' });
    const user = await create();
    const ready = await create();
    const claiming = await create();
    const claimed = await create();
    const mark = (id: string, state: 'READY' | 'CLAIMING' | 'NONE') => store.put({ ...store.get(id)!, pool: { key: 'k', state, claimedAtMs: state === 'READY' ? 0 : Date.now() } });
    mark(ready.sandboxId, 'READY');
    mark(claiming.sandboxId, 'CLAIMING');
    mark(claimed.sandboxId, 'NONE');

    const report = await adoptAll({ store, vms: peers.vmPort, devices: peers.devicePort, podd: peers.podd, manager: new SandboxManager(managerOptions(peers, store, dir)), log });
    expect([...report.adopted].sort()).toEqual([user.sandboxId, claimed.sandboxId].sort());
    expect([...report.poolMembers].sort()).toEqual([ready.sandboxId, claiming.sandboxId].sort());
  });
});
