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
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import { createChannel, Status, type Channel, type Metadata } from 'nice-grpc';
import { HealthDefinition } from 'nice-grpc-server-health';

/** grpc.health.v1 ServingStatus SERVING */
const SERVING = 1;
import { createLogger, createServiceServer, createServiceClient, gateWritesWhileBusy, RETRY_AFTER_MS_TRAILER, StoreBusyError, type ServiceServer } from '@sandnode/shared';
import { SandboxServiceDefinition, type SandboxServiceClient } from '@sandnode/shared/proto/server/v1/sandbox';
import { expectCode, holdSqliteLock, type HeldSqliteLock } from '@sandnode/testkit';
import { managerOptions, Peers } from '../core/__tests__/fake-peers';
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
  let probeMaxMs = 0;
  let probes = 0;

  beforeEach(async () => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-busy-'));
    store = await SqliteRecordStore.open(path.join(dir, 'records.db'), log);
    const peers = new Peers();
    const m = new SandboxManager(managerOptions(peers, store, dir));
    server = createServiceServer({ info: { component: 'server', version: '0.0.0', commit: 'test', features: [] }, log });
    // times each write-lock probe: the event loop's block on the DB itself
    const probe = store.probeWrite.bind(store);
    probeMaxMs = 0;
    probes = 0;
    const timed = {
      probeWrite: () => {
        const t0 = performance.now();
        try {
          probe();
        } finally {
          probes++;
          probeMaxMs = Math.max(probeMaxMs, performance.now() - t0);
        }
      },
    };
    server.add(SandboxServiceDefinition, gateWritesWhileBusy(sandboxService(m), SANDBOX_WRITES, timed, { what: 'records.db', maxWaitMs: 300 }));
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
    // the shared client: its deadline middleware makes the 1 s deadline real
    const health = createServiceClient(HealthDefinition, channel, { timeoutMs: 1000, retryAttempts: 1 });
    expect((await health.check({ service: '' })).status).toBe(SERVING);
    expect((await client.getSandbox({ sandboxId: first.sandbox!.sandboxId }, { signal: AbortSignal.timeout(1000) })).sandbox?.sandboxId).toBe(first.sandbox!.sandboxId);
    expect((await client.listSandboxes({})).sandboxes).toHaveLength(1);

    let trailer: Metadata | undefined;
    await expectCode(client.createSandbox({ template: 'base' }, { onTrailer: (t) => (trailer = t) }), Status.UNAVAILABLE, /locked by another process.*nothing was changed; retry after \d+ ms/);
    expect(Number(trailer?.get(RETRY_AFTER_MS_TRAILER))).toBeGreaterThan(0);
    await expectCode(client.deleteSandbox({ sandboxId: first.sandbox!.sandboxId }), Status.UNAVAILABLE, /locked by another process/);
    // health answered while the create waited for the lock
    const during = Promise.all([client.createSandbox({ template: 'base' }).catch((e: unknown) => e), health.check({ service: '' })]);
    const [waited, h] = await during;
    expect(h.status).toBe(SERVING);
    expect(waited).toMatchObject({ code: Status.UNAVAILABLE });
    loop.disable();
    const elapsed = Date.now() - t0;
    expect(store.list().map((r) => r.sandboxId)).toEqual([first.sandbox!.sandboxId]);
    // the measurement of the report (not a timed assertion)
    process.stderr.write(
      `sqlite-busy: with records.db locked for ${elapsed} ms: longest DB step ${probeMaxMs.toFixed(1)} ms over ${probes} lock probes; event loop max delay ${(loop.max / 1e6).toFixed(1)} ms, p99 ${(loop.percentile(99) / 1e6).toFixed(1)} ms (all causes, shared machine)\n`,
    );

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

  it('the epoch bump of a takeover waits for the lock asynchronously: StoreBusyError when it stays, the bump once it goes', async () => {
    const e0 = store.epoch();
    holder = await holdSqliteLock(path.join(dir, 'records.db'));
    expect(() => store.bumpEpoch()).toThrow(StoreBusyError);
    await expect(store.bumpEpochWhenFree(0, 150)).rejects.toThrow(StoreBusyError);
    expect(store.epoch()).toBe(e0);
    const later = store.bumpEpochWhenFree(0, 10_000);
    await new Promise((r) => setTimeout(r, 100));
    await holder.release();
    expect(await later).toBe(e0 + 1);
  });
});
