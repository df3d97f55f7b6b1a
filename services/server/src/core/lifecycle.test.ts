/**
 * The SandboxManager's lifecycle with a real SQLite store and scripted peers: every move goes
 * through the transition table (pause, resume, drain, delete), a caller who goes away stops a
 * create that no retry can join, and a newer server's state is left alone by everything but
 * DeleteSandbox.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createLogger, FailedPreconditionError, UnavailableError } from '@sandnode/shared';
import { waitFor } from '@sandnode/testkit';
import Database from 'better-sqlite3';
import { RuntimeRecord } from '@sandnode/shared/proto/server/v1/record';
import { SqliteRecordStore } from '../store/sqlite-record-store';
import { adoptAll } from './adoption';
import { sweepOrphans } from './orphan-sweep';
import { managerOptions, Peers } from './__tests__/fake-peers';
import { SandboxManager } from './sandbox-manager';
import type { SandboxRecord } from './types';

const log = createLogger('test', '0', 'silent');

describe('SandboxManager lifecycle', () => {
  let dir: string;
  let store: SqliteRecordStore;
  let peers: Peers;
  let m: SandboxManager;

  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-lifecycle-'));
    store = new SqliteRecordStore(path.join(dir, 'records.db'), log);
    peers = new Peers();
    m = new SandboxManager(managerOptions(peers, store, dir));
  });
  afterEach(() => {
    store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const create = (requestId = '', signal?: AbortSignal) => m.create({ template: 'base', timeoutSeconds: 0, metadata: {}, resources: undefined, requestId }, signal);

  it('pause -> resume -> drain -> resume (cold start) -> delete, each a move of the table', async () => {
    const { sandboxId: id } = await create();
    expect((await m.pause(id)).state).toBe('PAUSED');
    await expect(m.pause(id)).rejects.toThrow(new FailedPreconditionError(`sandbox ${id} is PAUSED; PauseSandbox needs RUNNING`));
    expect((await m.resume(id)).state).toBe('RUNNING');
    await m.drainOne(id);
    expect(store.get(id)).toMatchObject({ state: 'DRAINED', resumeMethod: 'cold-start' });
    expect((await m.resume(id)).state).toBe('RUNNING');
    await m.delete(id);
    expect(store.get(id)).toBeUndefined();
  });

  it('a create without request_id whose caller goes away while podd is awaited is torn down', async () => {
    peers.poddHealthy = false;
    const ac = new AbortController();
    const p = create('', ac.signal);
    await waitFor('the VM to be made (podd is awaited next)', () => peers.vms.size === 1);
    ac.abort(new Error('caller went away'));
    await expect(p).rejects.toThrow('caller went away');
    expect(store.list()).toEqual([]);
    expect(peers.devices.size).toBe(0);
    expect(peers.vms.size).toBe(0);
  });

  it('a create with request_id runs on when its caller goes away, so that a retry gets the sandbox', async () => {
    peers.poddHealthy = false;
    const ac = new AbortController();
    const first = create('rq-1', ac.signal);
    await waitFor('the VM to be made (podd is awaited next)', () => peers.vms.size === 1);
    ac.abort();
    const retry = create('rq-1');
    peers.poddHealthy = true;
    const [a, b] = await Promise.all([first, retry]);
    expect(b.sandboxId).toBe(a.sandboxId);
    expect(store.get(a.sandboxId)!.state).toBe('RUNNING');
  });

  it("a newer server's state (UNKNOWN) is left alone by the reaper and refused by lifecycle calls; DeleteSandbox removes it", async () => {
    const { sandboxId: id } = await create();
    const read = store.get(id)!;
    // as a newer server writes it: a state value this one does not know
    const rec: SandboxRecord = { ...read, state: 'UNKNOWN', opaque: { ...(read.opaque as object), state: 42 }, expiresAtMs: 1, updatedAtMs: 0 };
    store.put(rec);
    peers.vms.delete(id); // its VM is gone: the liveness check would mark a RUNNING one ERROR
    expect(await m.checkLiveness()).toEqual([]);
    expect(await m.retryTeardowns(0)).toEqual([]);
    expect(m.expired()).toEqual([]);
    await expect(m.pause(id)).rejects.toThrow(/is UNKNOWN; PauseSandbox needs RUNNING/);
    await expect(m.resume(id)).rejects.toThrow(FailedPreconditionError);
    await expect(m.drainOne(id)).rejects.toThrow(FailedPreconditionError);
    await m.setTimeout(id, 60);
    expect(store.get(id)!).toMatchObject({ state: 'UNKNOWN', opaque: expect.objectContaining({ state: 42 }) });
    await m.delete(id);
    expect(store.get(id)).toBeUndefined();
  });

  it('a state unknown to this version (7, 9) matches no states filter; an unfiltered list shows it', async () => {
    const { sandboxId: known } = await create();
    const ids: string[] = [];
    for (const value of [7, 9]) {
      const { sandboxId: id } = await create();
      const read = store.get(id)!;
      store.put({ ...read, state: 'UNKNOWN', opaque: { ...(read.opaque as object), state: value } });
      ids.push(id);
    }
    const list = (states: SandboxRecord['state'][]) => m.list({ states, pageSize: 0, pageToken: '', metadata: {} }).sandboxes.map((r) => r.sandboxId);
    // ListSandboxes(states=[7]) reaches the manager as ['UNKNOWN'] (rpc/convert statesFromPb)
    expect(list(['UNKNOWN'])).toEqual([]);
    expect(list(['RUNNING', 'UNKNOWN'])).toEqual([known]);
    expect(list([]).sort()).toEqual([known, ...ids].sort());
    expect(ids.map((id) => (store.get(id)!.opaque as { state: number }).state)).toEqual([7, 9]);
  });

  it('a row set aside at open (a newer schema) is not adopted, and its VM and devices are not swept as orphans', async () => {
    const { sandboxId: good } = await create();
    const { sandboxId: id } = await create();
    const raw = new Database(path.join(dir, 'records.db'));
    const row = raw.prepare<[string], { record: Buffer }>('SELECT record FROM records WHERE sandbox_id = ?').get(id)!;
    const newer = RuntimeRecord.encode({ ...RuntimeRecord.decode(row.record), schema: 2 }).finish();
    raw.prepare('UPDATE records SET record = ? WHERE sandbox_id = ?').run(Buffer.from(newer), id);
    raw.close();
    store.close();
    store = new SqliteRecordStore(path.join(dir, 'records.db'), log);
    const o = { store, vms: peers.vmPort, devices: peers.devicePort, log, runDir: path.join(dir, 'run') };
    const report = await adoptAll({ ...o, podd: peers.podd, manager: m });
    expect([...report.adopted, ...report.reconciled, ...report.tornDown, ...report.failed.map((f) => f.sandboxId)]).not.toContain(id);
    expect(report.failed).toEqual([]);
    const swept = await sweepOrphans(o);
    expect(swept).toEqual({ vms: [], devices: [], dirs: [], slots: [], failed: [] });
    expect(peers.vms.has(id)).toBe(true);
    expect(store.quarantined.get(id)).toMatch(/schema 2 is newer/);
    expect(store.get(good)?.state).toBe('RUNNING');
  });

  it('the reaper marks a RUNNING sandbox whose VM process is gone ERROR', async () => {
    const { sandboxId: id } = await create();
    // the fake supervisor's pids are not this host's processes: gone as far as /proc says
    expect(await m.checkLiveness()).toEqual([id]);
    expect(store.get(id)).toMatchObject({ state: 'ERROR', errorMessage: expect.stringMatching(/is gone/) });
    await expect(m.resume(id)).rejects.toThrow(/is ERROR; ResumeSandbox needs PAUSED or DRAINED/);
  });

  it('a create while the ublk-manager does not answer (a drained node) fails FAILED_PRECONDITION at once and leaves no record', async () => {
    peers.devicePort.version = async () => {
      throw new UnavailableError('connect ENOENT /run/sandnode/ublk-manager.sock');
    };
    await expect(create()).rejects.toThrow(new FailedPreconditionError('CreateSandbox: the ublk-manager does not answer (a drain stops it): start it with `sandnode up`; nothing was created'));
    expect(store.list()).toEqual([]);
    expect(peers.devices.size).toBe(0);
    expect(peers.vms.size).toBe(0);
  });
});
