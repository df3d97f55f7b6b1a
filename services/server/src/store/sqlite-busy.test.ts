/**
 * records.db locked by another process (issue 11, SQLITE_BUSY finding): a real sqlite3 CLI
 * process holds the write lock (BEGIN EXCLUSIVE) while a real gRPC server (createServiceServer +
 * SandboxService, scripted peers) serves. Health and reads keep answering within their deadline;
 * CreateSandbox answers UNAVAILABLE with `retry-after-ms` and changes nothing; once the lock is
 * gone, a create succeeds. The event loop's longest block is reported (not asserted: timing).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { createChannel, createClient, Status, type Channel, type Metadata } from 'nice-grpc';
import { HealthDefinition } from 'nice-grpc-server-health';

/** grpc.health.v1 ServingStatus SERVING */
const SERVING = 1;
import { createLogger, createServiceServer, createServiceClient, gateWritesWhileBusy, RETRY_AFTER_MS_TRAILER, StoreBusyError, type ServiceServer } from '@sandnode/shared';
import { SandboxServiceDefinition, type SandboxServiceClient } from '@sandnode/shared/proto/server/v1/sandbox';
import { expectCode, holdSqliteLock, type HeldSqliteLock } from '@sandnode/testkit';
import { Peers, templates } from '../core/__tests__/fake-peers';
import { SandboxManager } from '../core/sandbox-manager';
import { SANDBOX_WRITES } from '../main';
import { sandboxService } from '../rpc/sandbox-service';
import { SqliteRecordStore } from './sqlite-record-store';

const log = createLogger('test', '0', 'silent');

describe('records.db held by another process', () => {
  let dir: string;
  let store: SqliteRecordStore;
  let server: ServiceServer;
  let channel: Channel;
  let client: SandboxServiceClient;
  let holder: HeldSqliteLock | undefined;

  beforeEach(async () => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-busy-'));
    store = await SqliteRecordStore.open(path.join(dir, 'records.db'), log);
    const peers = new Peers();
    const m = new SandboxManager({
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
    server = createServiceServer({ info: { component: 'server', version: '0.0.0', features: [] }, log });
    server.add(SandboxServiceDefinition, gateWritesWhileBusy(sandboxService(m), SANDBOX_WRITES, store, { what: 'records.db', maxWaitMs: 300 }));
    const addr = `unix://${path.join(dir, 's.sock')}`;
    await server.listen([addr]);
    channel = createChannel(addr);
    client = createServiceClient(SandboxServiceDefinition, channel, { timeoutMs: 3000, retryAttempts: 1 });
  });
  afterEach(async () => {
    await holder?.release();
    channel.close();
    await server.shutdown(100);
    store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('health and reads answer, a create is UNAVAILABLE with retry-after-ms and changes nothing, and succeeds once the lock is gone', async () => {
    const first = await client.createSandbox({ template: 'base' });
    holder = await holdSqliteLock(path.join(dir, 'records.db'));
    const loop = monitorEventLoopDelay({ resolution: 1 });
    loop.enable();
    const t0 = Date.now();
    const health = createClient(HealthDefinition, channel);
    expect((await health.check({ service: '' }, { deadline: new Date(Date.now() + 1000) })).status).toBe(SERVING);
    expect((await client.getSandbox({ sandboxId: first.sandbox!.sandboxId }, { deadline: new Date(Date.now() + 1000) })).sandbox?.sandboxId).toBe(first.sandbox!.sandboxId);
    expect((await client.listSandboxes({})).sandboxes).toHaveLength(1);

    let trailer: Metadata | undefined;
    await expectCode(client.createSandbox({ template: 'base' }, { onTrailer: (t) => (trailer = t) }), Status.UNAVAILABLE, /locked by another process.*nothing was changed; retry after \d+ ms/);
    expect(Number(trailer?.get(RETRY_AFTER_MS_TRAILER))).toBeGreaterThan(0);
    await expectCode(client.deleteSandbox({ sandboxId: first.sandbox!.sandboxId }), Status.UNAVAILABLE, /locked by another process/);
    // health answered while the create waited for the lock
    const during = Promise.all([client.createSandbox({ template: 'base' }).catch((e: unknown) => e), health.check({ service: '' }, { deadline: new Date(Date.now() + 1000) })]);
    const [waited, h] = await during;
    expect(h.status).toBe(SERVING);
    expect(waited).toMatchObject({ code: Status.UNAVAILABLE });
    loop.disable();
    const elapsed = Date.now() - t0;
    expect(store.list().map((r) => r.sandboxId)).toEqual([first.sandbox!.sandboxId]);
    // the measurement of the report (not a timed assertion)
    process.stderr.write(`sqlite-busy: event loop max block ${(loop.max / 1e6).toFixed(1)} ms, p99 ${(loop.percentile(99) / 1e6).toFixed(1)} ms over ${elapsed} ms with records.db locked\n`);

    await holder.release();
    const second = await client.createSandbox({ template: 'base' });
    expect(store.list()).toHaveLength(2);
    await client.deleteSandbox({ sandboxId: second.sandbox!.sandboxId });
    expect(store.get(first.sandbox!.sandboxId)?.state).toBe('RUNNING');
  });

  it('a write that finds the lock held mid-call (after the gate) is StoreBusyError at once, not a stall', async () => {
    const { sandbox } = await client.createSandbox({ template: 'base' });
    const rec = store.get(sandbox!.sandboxId)!;
    holder = await holdSqliteLock(path.join(dir, 'records.db'));
    const t0 = Date.now();
    expect(() => store.put({ ...rec, metadata: { changed: 'yes' } })).toThrow(StoreBusyError);
    expect(() => store.delete(rec.sandboxId)).toThrow(StoreBusyError);
    process.stderr.write(`sqlite-busy: a put and a delete on a locked DB returned after ${Date.now() - t0} ms\n`);
    await holder.release();
    expect(store.get(rec.sandboxId)?.metadata).toEqual({});
  });

  it('open waits asynchronously for a database locked even for readers, then answers StoreBusyError', async () => {
    const file = path.join(dir, 'other.db');
    (await SqliteRecordStore.open(file, log)).close();
    holder = await holdSqliteLock(file, { exclusive: true });
    await expect(SqliteRecordStore.open(file, log, { maxWaitMs: 200 })).rejects.toThrow(StoreBusyError);
    await holder.release();
    (await SqliteRecordStore.open(file, log, { maxWaitMs: 200 })).close();
  });
});
