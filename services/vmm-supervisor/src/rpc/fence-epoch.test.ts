import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ClientError, Status } from 'nice-grpc-common';
import { AbortedError, createLogger, createSandnodeChannel, createServiceClient, createServiceServer, InvalidArgumentError, VMM_FEATURES, type ServiceServer } from '@sandnode/shared';
import { VersionServiceDefinition } from '@sandnode/shared/proto/common/v1/version';
import { VmServiceDefinition } from '@sandnode/shared/proto/vmm/v1/vmm';
import { FENCE_EPOCH_RPC, vmmEpochFence } from '../core/epoch';
import { Supervisor } from '../core/supervisor';
import { MemoryVmStore } from '../core/vm-store';
import type { VmDriver } from '../core/driver';
import { createVmService } from './vm-service';

const log = createLogger('vmm-supervisor-test', '0.0.0', 'silent');
let dir: string;
beforeEach(() => (dir = mkdtempSync(path.join(os.tmpdir(), 'vmm-fence-'))));
afterEach(() => rmSync(dir, { recursive: true, force: true }));

const persisted = () => Number(JSON.parse(readFileSync(path.join(dir, 'epoch'), 'utf8')).epoch);

describe('the supervisor fence: fenceEpoch (FenceEpoch)', () => {
  test('raises, is idempotent, and persists before it answers (a restarted supervisor keeps it)', () => {
    const fence = vmmEpochFence(dir);
    expect(fence.fenceEpoch(5, undefined)).toBe(5);
    expect(persisted()).toBe(5);
    expect(fence.fenceEpoch(5, 5)).toBe(5);
    expect(vmmEpochFence(dir).current).toBe(5);
  });

  test('0, a non-integer and a metadata mismatch are INVALID_ARGUMENT and change nothing', () => {
    const fence = vmmEpochFence(dir);
    fence.fenceEpoch(2, undefined);
    expect(() => fence.fenceEpoch(0, undefined)).toThrow(InvalidArgumentError);
    expect(() => fence.fenceEpoch(0, 0)).toThrow(/epoch: 0 is not an epoch/);
    expect(() => fence.fenceEpoch(Number.MAX_SAFE_INTEGER + 2, undefined)).toThrow(InvalidArgumentError);
    expect(() => fence.fenceEpoch(7, 6)).toThrow(/epoch: 7 differs from the call's sandnode-epoch metadata 6/);
    expect(fence.current).toBe(2);
    expect(persisted()).toBe(2);
  });

  test('lower than the highest seen is ABORTED naming both, and changes nothing', () => {
    const fence = vmmEpochFence(dir);
    fence.fenceEpoch(9, undefined);
    expect(() => fence.fenceEpoch(4, 4)).toThrow(AbortedError);
    expect(() => fence.fenceEpoch(4, undefined)).toThrow(/stale epoch 4; this node is at epoch 9/);
    expect(vmmEpochFence(dir).current).toBe(9);
  });

  test('the middleware leaves FenceEpoch to its handler but admits every other mutating call', () => {
    const fence = vmmEpochFence(dir);
    fence.admit(0, FENCE_EPOCH_RPC);
    fence.admit(3, '/sandnode.vmm.v1.VmService/DeleteVm');
    expect(fence.current).toBe(3);
    expect(() => fence.admit(0, FENCE_EPOCH_RPC)).not.toThrow();
    expect(() => fence.admit(2, '/sandnode.vmm.v1.VmService/CreateVm')).toThrow(AbortedError);
  });

  test('FENCE_EPOCH_RPC is the generated path of VmService.FenceEpoch', () => {
    expect(FENCE_EPOCH_RPC).toBe(`/${VmServiceDefinition.fullName}/${VmServiceDefinition.methods.fenceEpoch.name}`);
  });
});

describe('VmService.FenceEpoch over gRPC (shared server, real fence middleware)', () => {
  let server: ServiceServer;
  let address: string;
  let fence: ReturnType<typeof vmmEpochFence>;
  const driver = { name: 'fake', features: [] as string[] } as unknown as VmDriver;

  beforeEach(async () => {
    fence = vmmEpochFence(path.join(dir, 'state'));
    const supervisor = new Supervisor({ store: new MemoryVmStore(), driver, log, defaults: { vcpus: 1, memoryMib: 512, stopTimeoutMs: 100 } });
    server = createServiceServer({ info: { component: 'vmm-supervisor', version: '0.0.0', commit: '', features: supervisor.features() }, log, fence });
    server.add(VmServiceDefinition, createVmService(supervisor, fence));
    address = `unix://${path.join(dir, 'vmm.sock')}`;
    await server.listen([address]);
  });
  afterEach(() => server.shutdown(0));

  const client = (epoch?: number) => createServiceClient(VmServiceDefinition, createSandnodeChannel(address), { timeoutMs: 5000, ...(epoch === undefined ? {} : { epoch: () => epoch }) });
  const codeOf = (p: Promise<unknown>) =>
    p.then(
      () => Status.OK,
      (e: unknown) => (e instanceof ClientError ? e.code : Status.UNKNOWN),
    );

  test('GetVersion lists vmm.fence-epoch.v1', async () => {
    const v = await createServiceClient(VersionServiceDefinition, createSandnodeChannel(address)).getVersion({});
    expect(v.features).toContain(VMM_FEATURES.fenceEpoch);
  });

  test('raises the fence without metadata; then a stale DeleteVm is ABORTED and the current one passes', async () => {
    await expect(client().fenceEpoch({ epoch: 5 })).resolves.toMatchObject({ epoch: 5 });
    expect(await codeOf(client(4).deleteVm({ vmId: 'vm-x' }))).toBe(Status.ABORTED);
    await expect(client(5).deleteVm({ vmId: 'vm-x' })).resolves.toMatchObject({ existed: false });
  });

  test('0 and a metadata mismatch are INVALID_ARGUMENT and leave the fence where it was', async () => {
    await client(3).fenceEpoch({ epoch: 3 });
    expect(await codeOf(client().fenceEpoch({ epoch: 0 }))).toBe(Status.INVALID_ARGUMENT);
    expect(await codeOf(client(6).fenceEpoch({ epoch: 7 }))).toBe(Status.INVALID_ARGUMENT);
    expect(fence.current).toBe(3);
    expect(vmmEpochFence(path.join(dir, 'state')).current).toBe(3);
  });

  test('lower than the highest seen is ABORTED naming both epochs', async () => {
    await client().fenceEpoch({ epoch: 8 });
    const err = await client(2)
      .fenceEpoch({ epoch: 2 })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ClientError);
    expect((err as ClientError).code).toBe(Status.ABORTED);
    expect((err as ClientError).details).toMatch(/stale epoch 2; this node is at epoch 8/);
  });
});
