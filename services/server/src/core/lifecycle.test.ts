/**
 * The SandboxManager's lifecycle with a real SQLite store and scripted peers: every move goes
 * through the transition table (pause, resume, drain, delete), a caller who goes away stops a
 * create that no retry can join, and a newer server's state is left alone by everything but
 * DeleteSandbox.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createLogger, FailedPreconditionError } from '@sandnode/shared';
import { waitFor } from '@sandnode/testkit';
import { SqliteRecordStore } from '../store/sqlite-record-store';
import { Peers, templates } from './__tests__/fake-peers';
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
    m = new SandboxManager({
      store,
      vms: peers.vmPort,
      devices: peers.devicePort,
      podd: peers.podd,
      templates,
      log,
      runDir: path.join(dir, 'run'),
      resourceDefaults: { vcpus: 1, memoryMib: 512, diskBytes: 1 << 20 },
      poddReadyTimeoutMs: 5000,
      syncHost: async () => undefined,
    });
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

  it('the reaper marks a RUNNING sandbox whose VM process is gone ERROR', async () => {
    const { sandboxId: id } = await create();
    // the fake supervisor's pids are not this host's processes: gone as far as /proc says
    expect(await m.checkLiveness()).toEqual([id]);
    expect(store.get(id)).toMatchObject({ state: 'ERROR', errorMessage: expect.stringMatching(/is gone/) });
    await expect(m.resume(id)).rejects.toThrow(/is ERROR; ResumeSandbox needs PAUSED or DRAINED/);
  });
});
