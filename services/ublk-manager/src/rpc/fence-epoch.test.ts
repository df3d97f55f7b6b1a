/**
 * FenceEpoch through a real gRPC server (the shared server middleware, SharedEpochFence on a
 * temp state dir, the DeviceService handlers on fake devices), on a unix socket.
 */
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Status } from 'nice-grpc-common';
import { createLogger, createSandnodeChannel, createServiceClient, createServiceServer, type ServiceServer } from '@sandnode/shared';
import { DeviceServiceDefinition } from '@sandnode/shared/proto/ublk/v1/ublk';
import { expectCode, makeTempDir } from '@sandnode/testkit';
import { setup } from '../core/__tests__/fakes';
import { FENCE_EPOCH_PATH } from '../main';
import { SharedEpochFence } from '../store/shared-epoch-fence';
import { deviceService } from './device-service';

describe('FenceEpoch', () => {
  let dir: string;
  let server: ServiceServer | undefined;
  let address: string;
  const channels: { close(): void }[] = [];

  /** leaseFile: the node lease the fence checks (as main.ts passes it), or none (the old behaviour). */
  async function start(leaseFile?: string): Promise<void> {
    const fence = new SharedEpochFence(path.join(dir, 'state'), { handlerFenced: [FENCE_EPOCH_PATH], ...(leaseFile ? { leaseFile } : {}) });
    const log = createLogger('test', '0', 'silent');
    server = createServiceServer({ info: { component: 'ublk-manager', version: '0', commit: '', features: [] }, log, fence });
    server.add(DeviceServiceDefinition, deviceService(setup().manager, { fence }));
    await server.listen([address]);
  }

  async function stop(): Promise<void> {
    for (const c of channels.splice(0)) c.close();
    await server?.shutdown(0);
    server = undefined;
  }

  /** client: a DeviceService client sending `sandnode-epoch` = epoch, or no metadata when undefined. */
  function client(epoch?: number) {
    const ch = createSandnodeChannel(address);
    channels.push(ch);
    return createServiceClient(DeviceServiceDefinition, ch, { retryAttempts: 1, timeoutMs: 5000, ...(epoch === undefined ? {} : { epoch: () => epoch }) });
  }

  const onDisk = () => Number(JSON.parse(readFileSync(path.join(dir, 'state', 'epoch'), 'utf8')).epoch);

  beforeEach(async () => {
    dir = makeTempDir('ublk-fence');
    address = `unix://${dir}/ublk.sock`;
    await start();
  });
  // Not useTempDir: the server must stop before its dir is removed.
  afterEach(async () => {
    await stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('raises the fence, persisted before the answer; the same epoch again is a no-op', async () => {
    expect((await client().fenceEpoch({ epoch: 5 })).epoch).toBe(5);
    expect(onDisk()).toBe(5);
    expect((await client(5).fenceEpoch({ epoch: 5 })).epoch).toBe(5);
    expect((await client(7).fenceEpoch({ epoch: 7 })).epoch).toBe(7);
    expect(onDisk()).toBe(7);
    // Every other mutating call of a lower epoch is ABORTED now.
    await expectCode(client(6).deleteDevice({ deviceId: 'nope' }), Status.ABORTED);
  });

  it('a lower epoch is ABORTED naming both epochs; nothing changed', async () => {
    await client(9).fenceEpoch({ epoch: 9 });
    await expectCode(client(4).fenceEpoch({ epoch: 4 }), Status.ABORTED, /stale epoch 4; this node is at epoch 9/);
    // Without metadata the body's epoch is what is fenced (not "epoch 0").
    await expectCode(client().fenceEpoch({ epoch: 8 }), Status.ABORTED, /stale epoch 8; this node is at epoch 9/);
    expect(onDisk()).toBe(9);
  });

  it('epoch 0 and an epoch that is not the metadata one are INVALID_ARGUMENT and change nothing', async () => {
    await client().fenceEpoch({ epoch: 3 });
    await expectCode(client().fenceEpoch({ epoch: 0 }), Status.INVALID_ARGUMENT, /^epoch: 0 is not an epoch/);
    await expectCode(client(12).fenceEpoch({ epoch: 11 }), Status.INVALID_ARGUMENT, /epoch: 11 differs from the call's sandnode-epoch metadata 12/);
    // The metadata epoch of the refused call was not admitted either.
    expect(onDisk()).toBe(3);
    expect((await client(4).fenceEpoch({ epoch: 4 })).epoch).toBe(4);
  });

  it('the fence survives a restart: a lower epoch is still ABORTED, the highest is reported', async () => {
    await client(20).fenceEpoch({ epoch: 20 });
    await stop();
    await start();
    await expectCode(client(19).fenceEpoch({ epoch: 19 }), Status.ABORTED);
    await expectCode(client(19).createDevice({ deviceId: 'd', sizeBytes: 1 << 20, sourceImage: '', filesystem: 0, readOnly: false }), Status.ABORTED);
    expect((await client(20).fenceEpoch({ epoch: 20 })).epoch).toBe(20);
  });

  it('reports the highest epoch another slot persisted (shared file) when that is higher', async () => {
    await client(2).fenceEpoch({ epoch: 2 });
    // Slot b (another process on the same state dir) raised the fence to 30 meanwhile.
    new SharedEpochFence(path.join(dir, 'state')).raise(30, 'test');
    await expectCode(client(25).fenceEpoch({ epoch: 25 }), Status.ABORTED, /stale epoch 25; this node is at epoch 30/);
    expect((await client().fenceEpoch({ epoch: 30 })).epoch).toBe(30);
  });

  it('with the node lease: an epoch above the lease record is FAILED_PRECONDITION naming both epochs and changes nothing; a slot catches up with the file without re-checking', async () => {
    await stop();
    const lease = path.join(dir, 'server.lease');
    writeFileSync(`${lease}.json`, JSON.stringify({ epoch: 4 }));
    await start(lease);
    expect((await client(4).fenceEpoch({ epoch: 4 })).epoch).toBe(4);
    const huge = Number.MAX_SAFE_INTEGER;
    await expectCode(
      client(huge).fenceEpoch({ epoch: huge }),
      Status.FAILED_PRECONDITION,
      new RegExp(`epoch ${huge} is above epoch 4, the highest the node's server lease names.*fence stays at 4, nothing changed`),
    );
    await expectCode(client(5).deleteDevice({ deviceId: 'nope' }), Status.FAILED_PRECONDITION, /epoch 5 is above epoch 4/);
    expect(onDisk()).toBe(4);
    expect((await client(4).deleteDevice({ deviceId: 'nope' })).existed).toBe(false);
    // the lease file itself (what 0.1.0 writes) counts too; the higher of the two records wins
    writeFileSync(lease, JSON.stringify({ epoch: 6 }));
    expect((await client(6).fenceEpoch({ epoch: 6 })).epoch).toBe(6);
    // another slot persisted 6; the lease record is gone (purged): catching up needs no lease check
    rmSync(lease);
    rmSync(`${lease}.json`);
    await stop();
    await start(lease);
    await expectCode(client(5).deleteDevice({ deviceId: 'nope' }), Status.ABORTED, /this node is at epoch 6/);
    expect((await client(6).deleteDevice({ deviceId: 'nope' })).existed).toBe(false);
    await expectCode(client(7).fenceEpoch({ epoch: 7 }), Status.FAILED_PRECONDITION, /epoch 7 is above epoch 0/);
  });
});
