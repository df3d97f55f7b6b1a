/**
 * Attacker finding (fixed): a sandbox's code (root in the container) edits
 * /opt/sandnode/podd.js so Health answers bulk_transfers: 1 and kills podd (sandnode-init
 * restarts it). The idle actions are then held off "for BULK_HOLD_MAX_MS in a row at most",
 * but the start of the run was kept only in the server's memory: every `sandnode upgrade server`
 * (or restart) started the hour again, so a node upgraded more often than hourly never paused
 * that sandbox. Now the bound counts from the record's last activity, which a handover keeps:
 * the next manager on the same records pauses it BULK_HOLD_MAX_MS after it.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@sandnode/shared';
import { SqliteRecordStore } from '../store/sqlite-record-store';
import { managerOptions, Peers } from './__tests__/fake-peers';
import { BULK_HOLD_MAX_MS } from './idle';
import { SandboxManager } from './sandbox-manager';

const log = createLogger('test', '0', 'silent');

describe('a lying podd and handovers', () => {
  let dir: string;
  let store: SqliteRecordStore;
  let peers: Peers;
  let clock: number;
  const manager = () => new SandboxManager(managerOptions(peers, store, dir, { now: () => clock }));

  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-idle-attack-'));
    store = new SqliteRecordStore(path.join(dir, 'records.db'), log);
    peers = new Peers();
    clock = 1_000_000;
  });
  afterEach(() => {
    store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('podd claiming a bulk transfer forever is paused BULK_HOLD_MAX_MS after the hold began, even with a handover every 30 min', async () => {
    let m = manager();
    const { sandboxId: id } = await m.create({ template: 'base', timeoutSeconds: 0, metadata: {}, resources: undefined, requestId: '', idle: { pauseAfterS: 10, hibernateAfterS: 0, pausedTtlS: 0 } });
    peers.poddBulk = 1;
    clock += 10_000;
    expect(await m.runIdle()).toEqual([]);
    const heldFrom = clock;
    const done: unknown[] = [];
    // 3 h of reaper passes every 10 s, a handover (new manager on the same records) every 30 min
    for (let t = 0; t < 3 * BULK_HOLD_MAX_MS && done.length === 0; t += 10_000) {
      clock += 10_000;
      if (t % 1_800_000 === 0) {
        m.idle.flush(true);
        m = manager();
      }
      done.push(...(await m.runIdle()));
    }
    expect(done).toEqual([{ sandboxId: id, action: 'pause' }]);
    expect(clock - heldFrom).toBeLessThanOrEqual(BULK_HOLD_MAX_MS + 10_000);
  });
});
