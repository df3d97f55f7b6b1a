/**
 * A real node whose stores another process holds locked (issue 11, SQLITE_BUSY finding): a
 * sqlite3 CLI holds the write lock of records.db, then of devices.db. Health, reads and status
 * keep answering within their deadline; CreateSandbox (records.db) and CreateDevice
 * (devices.db) answer UNAVAILABLE with a `retry-after-ms` trailer and change nothing; once the
 * lock is gone, creates succeed. The server's event-loop delay is not observable from here; the
 * test reports the slowest health answer while locked (a measurement, not an assertion).
 */
import { readdirSync, statSync } from 'node:fs';
import path from 'node:path';
import { Metadata, Status } from 'nice-grpc';
import { HealthDefinition } from 'nice-grpc-server-health';
import { createSandnodeChannel, createServiceClient, EPOCH_METADATA_KEY, RETRY_AFTER_MS_TRAILER } from '@sandnode/shared';
import { DeviceServiceDefinition } from '@sandnode/shared/proto/ublk/v1/ublk';
import { componentAddress } from '@sandnode/node-stack';
import { describeNode, expectCode, holdSqliteLock, startNode, type HeldSqliteLock, type TestNode } from '@sandnode/testkit';

jest.setTimeout(240_000);

/** grpc.health.v1 ServingStatus SERVING */
const SERVING = 1;

function findFile(dir: string, name: string): string {
  const hits: string[] = [];
  const walk = (d: string) => {
    for (const e of readdirSync(d)) {
      const p = path.join(d, e);
      if (statSync(p, { throwIfNoEntry: false })?.isDirectory()) walk(p);
      else if (e === name) hits.push(p);
    }
  };
  walk(dir);
  if (hits.length !== 1) throw new Error(`expected one ${name} below ${dir}, found ${JSON.stringify(hits)}`);
  return hits[0]!;
}

describeNode('a node whose records.db and devices.db another process holds locked', () => {
  let node: TestNode;
  let holder: HeldSqliteLock | undefined;
  let first: string;

  beforeAll(async () => {
    node = await startNode();
    first = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!.sandboxId;
  });
  afterEach(async () => {
    await holder?.release();
    holder = undefined;
  });
  afterAll(async () => {
    await node?.stop();
  });

  /** healthMs runs a health check with a 1 s deadline and returns how long it took, ms. */
  const healthMs = async (address: string): Promise<number> => {
    const ch = createSandnodeChannel(address);
    try {
      const t0 = Date.now();
      expect((await createServiceClient(HealthDefinition, ch, { timeoutMs: 1000, retryAttempts: 1 }).check({ service: '' })).status).toBe(SERVING);
      return Date.now() - t0;
    } finally {
      ch.close();
    }
  };

  it('records.db locked: health, get, list and status answer; a create is UNAVAILABLE with retry-after-ms and changes nothing; after the lock, a create works', async () => {
    holder = await holdSqliteLock(findFile(node.dirs.stateDir, 'records.db'));
    let trailer: Metadata | undefined;
    const create = node.api.sandboxes.createSandbox({ template: 'base' }, { onTrailer: (t) => (trailer = t) });
    // while the create waits for the lock (asynchronously), health answers
    const during = await Promise.all([healthMs(node.address), healthMs(node.address), healthMs(node.address)]);
    await expectCode(create, Status.UNAVAILABLE, /locked by another process.*nothing was changed; retry after \d+ ms/);
    expect(Number(trailer?.get(RETRY_AFTER_MS_TRAILER))).toBeGreaterThan(0);
    expect((await node.api.sandboxes.getSandbox({ sandboxId: first })).sandbox?.state).toBeDefined();
    expect((await node.api.sandboxes.listSandboxes({})).sandboxes.map((s) => s.sandboxId)).toEqual([first]);
    expect(node.cli(['status']).status).toBe(0);
    process.stderr.write(`store-busy.it: server health answers while records.db was locked: ${during.join(', ')} ms\n`);
    await holder.release();
    const { sandbox } = await node.api.sandboxes.createSandbox({ template: 'base' });
    await node.api.sandboxes.deleteSandbox({ sandboxId: sandbox!.sandboxId });
  });

  it('devices.db locked: ublk-manager health and ListDevices answer; CreateDevice is UNAVAILABLE with retry-after-ms and makes nothing', async () => {
    const address = componentAddress(node.dirs, 'ublk-manager');
    holder = await holdSqliteLock(findFile(node.dirs.stateDir, 'devices.db'));
    const ch = createSandnodeChannel(address);
    try {
      const ublk = createServiceClient(DeviceServiceDefinition, ch, { retryAttempts: 1, timeoutMs: 10_000 });
      const before = (await ublk.listDevices({})).devices.map((d) => d.deviceId);
      let trailer: Metadata | undefined;
      // as the active server would call it: with its epoch (else the fence answers ABORTED first)
      const epoch = (JSON.parse(node.cli(['status', '--json']).stdout) as { epoch: number }).epoch;
      const create = ublk.createDevice({ deviceId: 'busy-probe', sizeBytes: 16 << 20 }, { metadata: Metadata({ [EPOCH_METADATA_KEY]: String(epoch) }), onTrailer: (t) => (trailer = t) });
      const during = await Promise.all([healthMs(address), healthMs(address)]);
      await expectCode(create, Status.UNAVAILABLE, /devices\.db: createDevice: the database is locked by another process/);
      expect(Number(trailer?.get(RETRY_AFTER_MS_TRAILER))).toBeGreaterThan(0);
      expect((await ublk.listDevices({})).devices.map((d) => d.deviceId)).toEqual(before);
      process.stderr.write(`store-busy.it: ublk-manager health answers while devices.db was locked: ${during.join(', ')} ms\n`);
    } finally {
      ch.close();
    }
    await holder.release();
    // the node's own path to ublk-manager works again
    const { sandbox } = await node.api.sandboxes.createSandbox({ template: 'base' });
    await node.api.sandboxes.deleteSandbox({ sandboxId: sandbox!.sandboxId });
  });
});
