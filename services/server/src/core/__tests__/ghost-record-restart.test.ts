/**
 * A copy of a live sandbox's record under another id (issue 11, finding 3), the cases the
 * attack test (attack-ghost-record.test.ts) leaves: the copy is RUNNING, and it is met at a
 * server start (set aside at open, the original adopted and later deleted in full) or through
 * DeleteSandbox (the copy goes, the original's VM and devices stay).
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
const GHOST = 'sb-eeeeeeeeeeeeeeee';

describe('a RUNNING copy of a live sandbox record', () => {
  let dir: string;
  let file: string;
  let store: SqliteRecordStore;
  let peers: Peers;

  const manager = (s: SqliteRecordStore) => new SandboxManager(managerOptions(peers, s, dir));

  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-ghost-'));
    file = path.join(dir, 'records.db');
    store = new SqliteRecordStore(file, log);
    peers = new Peers();
  });
  afterEach(() => {
    store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('is set aside at the next start; the original is adopted and its delete removes all its parts', async () => {
    const live = await manager(store).create({ template: 'base', timeoutSeconds: 0, metadata: {}, resources: undefined, requestId: '' });
    store.put({ ...store.get(live.sandboxId)!, sandboxId: GHOST });
    store.close();

    store = new SqliteRecordStore(file, log);
    const m = manager(store);
    expect(store.list().map((r) => r.sandboxId)).toEqual([live.sandboxId]);
    expect(store.quarantinedRows()).toEqual([{ key: GHOST, reason: `it lists vm ${live.sandboxId} of sandbox ${live.sandboxId}`, quarantinedAtMs: expect.any(Number) }]);
    const report = await adoptAll({ store, vms: peers.vmPort, devices: peers.devicePort, podd: peers.podd, manager: m, log });
    expect(report.adopted).toEqual([live.sandboxId]);

    await m.delete(live.sandboxId);
    expect([...peers.vms.keys()]).toEqual([]);
    expect([...peers.devices.keys()]).toEqual([]);
  });

  it('is deleted by DeleteSandbox without touching the original', async () => {
    const m = manager(store);
    const live = await m.create({ template: 'base', timeoutSeconds: 0, metadata: {}, resources: undefined, requestId: '' });
    store.put({ ...store.get(live.sandboxId)!, sandboxId: GHOST });

    await m.delete(GHOST);
    expect(store.list().map((r) => `${r.sandboxId} ${r.state}`)).toEqual([`${live.sandboxId} RUNNING`]);
    expect([...peers.vms.keys()]).toEqual([live.sandboxId]);
    expect([...peers.devices.keys()].sort()).toEqual([`${live.sandboxId}-upper`, `${live.sandboxId}-ws`]);
  });
});
