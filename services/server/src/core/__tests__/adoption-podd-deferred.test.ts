/**
 * Adoption of a server taking over does not wait for podds (attacker finding, issue 11: a
 * sandbox that stops its podd with SIGSTOP, so that connect succeeds and Health hangs, made every
 * handover's hold DEFAULT_ADOPT_PODD_TIMEOUT_MS = 2 s longer). With deferPoddChecks the Health
 * calls are left to checkPodds, which the server runs after the switch; the answer changes
 * nothing either way (the sandbox stays RUNNING), it is only reported.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@sandnode/shared';
import { SqliteRecordStore } from '../../store/sqlite-record-store';
import { adoptAll, checkPodds } from '../adoption';
import { SandboxManager } from '../sandbox-manager';
import type { PoddConnector } from '../types';
import { managerOptions, Peers } from './fake-peers';

const log = createLogger('test', '0', 'silent');

describe('adoption with a podd that never answers', () => {
  let dir: string;
  let store: SqliteRecordStore;
  let peers: Peers;
  const release: (() => void)[] = [];

  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-adopt-podd-'));
    store = new SqliteRecordStore(path.join(dir, 'records.db'), log);
    peers = new Peers();
  });
  afterEach(() => {
    for (const r of release.splice(0)) r();
    store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  /** a connector whose Health of the stopped sandbox's podd hangs until the test ends, the others answer */
  const stoppedPodd = (stoppedAddress: () => string, asked: string[]): PoddConnector => ({
    ...peers.podd,
    connect: (address) => ({
      ...peers.podd.connect(address),
      health: async () => {
        asked.push(address);
        if (address !== stoppedAddress()) return true;
        await new Promise<void>((r) => release.push(r));
        return false;
      },
    }),
  });

  it('deferred: adoption returns without asking any podd; checkPodds asks each once and reports the one that does not answer', async () => {
    const m = new SandboxManager(managerOptions(peers, store, dir));
    const create = () => m.create({ template: 'base', timeoutSeconds: 0, metadata: {}, resources: undefined, requestId: '' });
    const good = await create();
    const stopped = await create();
    const asked: string[] = [];
    const podd = stoppedPodd(() => stopped.poddAddress, asked);
    // an hour of timeout: if adoption waited for the stopped podd, this test would time out
    const deps = { store, vms: peers.vmPort, devices: peers.devicePort, podd, manager: new SandboxManager(managerOptions(peers, store, dir)), log, poddTimeoutMs: 3_600_000, deferPoddChecks: true };
    const report = await adoptAll(deps);
    expect([...report.adopted].sort()).toEqual([good.sandboxId, stopped.sandboxId].sort());
    expect(asked).toEqual([]);
    expect(report.poddToCheck?.map((t) => t.sandboxId).sort()).toEqual([good.sandboxId, stopped.sandboxId].sort());
    expect(report.poddUnhealthy).toEqual([]);

    const checked = checkPodds({ ...deps, poddTimeoutMs: 100 }, report);
    setTimeout(() => release.splice(0).forEach((r) => r()), 200);
    expect(await checked).toBe(1);
    expect(report.poddUnhealthy).toEqual([stopped.sandboxId]);
    expect(asked.sort()).toEqual([good.poddAddress, stopped.poddAddress].sort());
    expect(report.poddToCheck).toEqual([]);
    // nothing changed for either sandbox
    expect([store.get(good.sandboxId)?.state, store.get(stopped.sandboxId)?.state]).toEqual(['RUNNING', 'RUNNING']);
  });

  it('not deferred (a start without a handover): Health inline, as before', async () => {
    const m = new SandboxManager(managerOptions(peers, store, dir));
    const s = await m.create({ template: 'base', timeoutSeconds: 0, metadata: {}, resources: undefined, requestId: '' });
    peers.poddHealthy = false;
    const report = await adoptAll({ store, vms: peers.vmPort, devices: peers.devicePort, podd: peers.podd, manager: new SandboxManager(managerOptions(peers, store, dir)), log });
    expect(report.poddUnhealthy).toEqual([s.sandboxId]);
    expect(report.poddToCheck).toBeUndefined();
  });
});
