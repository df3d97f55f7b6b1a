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
import { Peers, templates } from './fake-peers';

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

  it('is torn down, not left RUNNING', async () => {
    let answerHealth: (ok: boolean) => void = () => undefined;
    let healthCalls = 0;
    const podd: PoddConnector = {
      ...peers.podd,
      connect: (address) => ({
        ...peers.podd.connect(address),
        health: () => {
          healthCalls++;
          return new Promise<boolean>((resolve) => (answerHealth = resolve));
        },
      }),
    };
    const m = new SandboxManager({
      store,
      vms: peers.vmPort,
      devices: peers.devicePort,
      podd,
      templates,
      log,
      runDir: path.join(dir, 'run'),
      resourceDefaults: { vcpus: 1, memoryMib: 512, diskBytes: 1 << 20 },
      poddReadyTimeoutMs: 5000,
      syncHost: async () => undefined,
    });
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
