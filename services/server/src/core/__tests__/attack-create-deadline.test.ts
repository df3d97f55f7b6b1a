/**
 * Adversarial finding (issue 11, "a create whose caller went away is undone unless it carries a
 * request id"): the caller's signal is looked at only between two podd Health calls. A caller
 * that goes away (its deadline passes) while a Health call is in flight, one that then answers,
 * gets DEADLINE_EXCEEDED, and the sandbox stays RUNNING: nobody knows its id, nothing deletes it.
 * Seen on a real node: 3 of 5 CreateSandbox calls with grpc-timeout 200..360 ms, 2 of 7 with a
 * client-side cancel at 320..360 ms, left a RUNNING sandbox (a create takes ~390 ms there).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@sandnode/shared';
import { waitFor } from '@sandnode/testkit';
import { SqliteRecordStore } from '../../store/sqlite-record-store';
import { SandboxManager } from '../sandbox-manager';
import type { PoddConnector } from '../types';
import { managerOptions, Peers } from './fake-peers';

const log = createLogger('test', '0', 'silent');

describe('a create without request_id whose caller goes away during a podd Health call', () => {
  let dir: string;
  let store: SqliteRecordStore;
  let peers: Peers;

  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-attack-create-'));
    store = new SqliteRecordStore(path.join(dir, 'records.db'), log);
    peers = new Peers();
  });
  afterEach(() => {
    store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  /** podd whose Health calls wait for the test (when held) and are counted */
  let answerHealth: (ok: boolean) => void = () => undefined;
  let healthCalls = 0;
  let holdHealth = true;
  const heldPodd = (): PoddConnector => ({
    ...peers.podd,
    connect: (address) => ({
      ...peers.podd.connect(address),
      health: () => {
        healthCalls++;
        return holdHealth ? new Promise<boolean>((resolve) => (answerHealth = resolve)) : Promise.resolve(true);
      },
    }),
  });
  beforeEach(() => {
    healthCalls = 0;
    holdHealth = true;
  });

  const manager = (podd: PoddConnector) => new SandboxManager(managerOptions(peers, store, dir, { podd }));

  it('with a request_id it is kept RUNNING (a retry joins it)', async () => {
    const m = manager(heldPodd());
    const ac = new AbortController();
    const p = m.create({ template: 'base', timeoutSeconds: 0, metadata: {}, resources: undefined, requestId: 'r-1' }, ac.signal);
    await waitFor('the first podd Health call', () => healthCalls === 1);
    ac.abort(new Error('caller went away'));
    const retry = m.createDetailed({ template: 'base', timeoutSeconds: 0, metadata: {}, resources: undefined, requestId: 'r-1' });
    answerHealth(true);
    const [first, again] = await Promise.all([p, retry]);
    expect(again.rec.sandboxId).toBe(first.sandboxId);
    expect(again.repeat).toBe(true); // it joined the create in flight: it created nothing
    expect(store.list().map((r) => r.state)).toEqual(['RUNNING']);
  });

  it("a fork without request_id whose caller goes away during the child's Health call is torn down, the parent stays", async () => {
    holdHealth = false;
    const m = manager(heldPodd());
    const parent = await m.create({ template: 'base', timeoutSeconds: 0, metadata: {}, resources: undefined, requestId: '' });
    holdHealth = true;
    healthCalls = 0;
    const ac = new AbortController();
    const outcome = m.fork({ parentId: parent.sandboxId, metadata: {}, timeoutSeconds: 0, maxFreezeMs: 0, requestId: '' }, ac.signal).then(
      () => 'resolved',
      (err: Error) => err.message,
    );
    await waitFor("the child's first podd Health call", () => healthCalls === 1);
    ac.abort(new Error('caller went away'));
    answerHealth(true);
    expect(await outcome).toBe('caller went away');
    expect(store.list().map((r) => `${r.sandboxId} ${r.state}`)).toEqual([`${parent.sandboxId} RUNNING`]);
    expect([...peers.vms.keys()]).toEqual([parent.sandboxId]);
    expect([...peers.devices.keys()].sort()).toEqual([`${parent.sandboxId}-upper`, `${parent.sandboxId}-ws`]);
  });

  it('is torn down, not left RUNNING', async () => {
    const podd = heldPodd();
    const m = new SandboxManager(managerOptions(peers, store, dir, { podd }));
    const ac = new AbortController();
    const p = m.create({ template: 'base', timeoutSeconds: 0, metadata: {}, resources: undefined, requestId: '' }, ac.signal);
    const outcome = p.then(
      () => 'resolved',
      (err: Error) => err.message,
    );
    await waitFor('the first podd Health call', () => healthCalls === 1);
    ac.abort(new Error('caller went away'));
    answerHealth(true); // podd comes up just after the caller's deadline
    expect(await outcome).toBe('caller went away');
    expect(store.list().map((r) => `${r.sandboxId} ${r.state}`)).toEqual([]);
    expect(peers.vms.size).toBe(0);
    expect(peers.devices.size).toBe(0);
  });
});
