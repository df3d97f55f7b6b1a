import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Metadata } from 'nice-grpc-common';
import { AbortedError, FailedPreconditionError } from './errors';
import { EPOCH_METADATA_KEY, EpochFence, isMutating, parseEpoch, readLeaseEpoch, serverLeasePath } from './epoch-fence';

describe('EpochFence', () => {
  const dirs: string[] = [];
  afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));
  const dir = () => {
    const d = mkdtempSync(path.join(os.tmpdir(), 'fence-'));
    dirs.push(d);
    return d;
  };

  it('accepts equal or higher epochs, refuses lower ones, and remembers across restarts', () => {
    const d = dir();
    const f = new EpochFence(d);
    f.admit(0, '/x');
    f.admit(5, '/x');
    f.admit(5, '/x');
    expect(() => f.admit(4, '/sandnode.vmm.v1.VmService/DeleteVm')).toThrow(AbortedError);
    expect(() => f.admit(4, '/sandnode.vmm.v1.VmService/DeleteVm')).toThrow(/stale epoch 4; this node is at epoch 5/);
    const again = new EpochFence(d);
    expect(again.current).toBe(5);
    expect(() => again.admit(0, '/x')).toThrow(AbortedError);
  });

  it('with a lease file: raises only up to the epoch the lease names (FAILED_PRECONDITION naming both, nothing persisted)', () => {
    const d = dir();
    const lease = serverLeasePath(d);
    const f = new EpochFence(path.join(d, 'peer'), { leaseFile: lease, handlerFenced: ['/fence'] });
    // no lease record: no server ever took the lease, so no epoch exists
    expect(() => f.admit(1, '/x')).toThrow(FailedPreconditionError);
    f.admit(0, '/x');
    writeFileSync(`${lease}.json`, JSON.stringify({ pid: 1, epoch: 3 }));
    writeFileSync(lease, JSON.stringify({ pid: 1, epoch: 2 })); // the 0.1.0 record: the higher one counts
    expect(readLeaseEpoch(lease)).toBe(3);
    expect(f.fenceEpoch(3, undefined)).toBe(3);
    expect(() => f.fenceEpoch(Number.MAX_SAFE_INTEGER, undefined)).toThrow(
      /epoch 9007199254740991 is above epoch 3, the highest the node's server lease names .*the fence stays at 3, nothing changed/,
    );
    expect(() => f.admit(4, '/sandnode.vmm.v1.VmService/DeleteVm')).toThrow(FailedPreconditionError);
    expect(new EpochFence(path.join(d, 'peer')).current).toBe(3);
    // a lower epoch is still ABORTED (not the lease's business), the lease's own epoch passes
    expect(() => f.admit(2, '/x')).toThrow(AbortedError);
    f.admit(3, '/x');
    // a handler-fenced method is let through by admit (its handler checks)
    f.admit(99, '/fence');
    expect(f.current).toBe(3);
  });

  it('fences only sandnode calls that may change state', () => {
    expect(isMutating({ path: '/sandnode.vmm.v1.VmService/DeleteVm', options: {} })).toBe(true);
    expect(isMutating({ path: '/sandnode.vmm.v1.VmService/GetVm', options: { idempotencyLevel: 'NO_SIDE_EFFECTS' } })).toBe(false);
    expect(isMutating({ path: '/grpc.health.v1.Health/Check', options: {} })).toBe(false);
    expect(isMutating({ path: '/grpc.reflection.v1.ServerReflection/ServerReflectionInfo', options: {} })).toBe(false);
  });

  it('parses the metadata', () => {
    expect(parseEpoch(Metadata())).toBe(0);
    expect(parseEpoch(Metadata({ [EPOCH_METADATA_KEY]: '7' }))).toBe(7);
    expect(() => parseEpoch(Metadata({ [EPOCH_METADATA_KEY]: 'x' }))).toThrow(/sandnode-epoch/);
  });

  it.each(['0x2', '1e0', ' 1', '2.0', '-1', '+3', '9007199254740992', '99999999999999999'])('refuses %j as an epoch (decimal digits up to 2^53-1 only)', (raw) => {
    expect(() => parseEpoch(Metadata({ [EPOCH_METADATA_KEY]: raw }))).toThrow(/is not an epoch/);
  });
});
