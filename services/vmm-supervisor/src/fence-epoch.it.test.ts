/**
 * Integration: VmService.FenceEpoch and the command line of the real vmm-supervisor process
 * (dist/main.js): the fence is raised, survives a kill -9 of the daemon, and a stale caller is
 * ABORTED; the 0.2.0 announcement (a DeleteVm of an unknown id carrying the epoch) still works.
 * Needs what the other vmm-supervisor integration tests need (VMM_PARTS: the daemon starts its runc driver).
 */
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { Status } from 'nice-grpc-common';
import { createSandnodeChannel, createServiceClient, VMM_FEATURES } from '@sandnode/shared';
import { VersionServiceDefinition } from '@sandnode/shared/proto/common/v1/version';
import { describeWith, expectCode, writeLeaseRecord } from '@sandnode/testkit';
import { Fixture, MAIN_JS, VMM_PARTS } from './__tests__/fixture';

describeWith('vmm-supervisor FenceEpoch (real daemon)', VMM_PARTS, () => {
  let fx: Fixture;
  beforeEach(() => (fx = new Fixture()));
  afterEach(() => fx.cleanup());

  test('raises the fence, persists it across a kill -9, and fences stale callers off', async () => {
    writeLeaseRecord(fx.stateDir, 7); // the node's lease names epoch 7: fences up to 7 are accepted
    const d1 = await fx.start();
    const version = await createServiceClient(VersionServiceDefinition, createSandnodeChannel(fx.address)).getVersion({});
    expect(version.features).toContain(VMM_FEATURES.fenceEpoch);

    expect((await fx.client().fenceEpoch({ epoch: 5 })).epoch).toBe(5);
    await expectCode(fx.client().fenceEpoch({ epoch: 0 }), Status.INVALID_ARGUMENT);
    await expectCode(fx.client(5).fenceEpoch({ epoch: 6 }), Status.INVALID_ARGUMENT);
    await expectCode(fx.client(4).deleteVm({ vmId: 'vm-none' }), Status.ABORTED);

    await d1.kill('SIGKILL');
    await fx.start();
    await expectCode(fx.client(4).deleteVm({ vmId: 'vm-none' }), Status.ABORTED);
    await expectCode(fx.client(3).fenceEpoch({ epoch: 3 }), Status.ABORTED, /stale epoch 3; this node is at epoch 5/);
    expect((await fx.client(5).fenceEpoch({ epoch: 5 })).epoch).toBe(5);

    // The 0.2.0 announcement still raises the fence: a DeleteVm of an unknown id with the epoch.
    expect((await fx.client(7).deleteVm({ vmId: 'vm-none' })).existed).toBe(false);
    await expectCode(fx.client().fenceEpoch({ epoch: 6 }), Status.ABORTED, /this node is at epoch 7/);
  });

  test('ArmFreeze and DisarmFreeze are fenced like every mutating call; FenceEpoch with require_freeze_arm records the arming epoch', async () => {
    writeLeaseRecord(fx.stateDir, 7);
    await fx.start();
    expect((await fx.client(5).fenceEpoch({ epoch: 5, requireFreezeArm: true })).epoch).toBe(5);
    expect(JSON.parse(readFileSync(path.join(fx.stateDir, 'vmm-supervisor', 'freeze-arm-epoch'), 'utf8'))).toEqual({ epoch: 5 });
    await expectCode(fx.client(4).armFreeze({ vmId: 'vm-none', windowMs: 0 }), Status.ABORTED, /stale epoch 4/);
    await expectCode(fx.client(4).disarmFreeze({ vmId: 'vm-none' }), Status.ABORTED, /stale epoch 4/);
    await expectCode(fx.client(5).armFreeze({ vmId: 'vm-none', windowMs: 0 }), Status.NOT_FOUND);
    expect((await fx.client(5).disarmFreeze({ vmId: 'vm-none' })).wasArmed).toBe(false);
  });

  test('refuses an epoch above the one the node lease names (FAILED_PRECONDITION, nothing changed): a forged huge epoch cannot fence the real server out', async () => {
    writeLeaseRecord(fx.stateDir, 3);
    await fx.start();
    expect((await fx.client(3).fenceEpoch({ epoch: 3 })).epoch).toBe(3);
    const huge = Number.MAX_SAFE_INTEGER;
    await expectCode(fx.client(huge).fenceEpoch({ epoch: huge }), Status.FAILED_PRECONDITION, new RegExp(`epoch ${huge} is above epoch 3.*the fence stays at 3`));
    await expectCode(fx.client().fenceEpoch({ epoch: 4 }), Status.FAILED_PRECONDITION, /epoch 4 is above epoch 3/);
    // the same through the metadata of any mutating call: refused before the handler runs
    await expectCode(fx.client(huge).deleteVm({ vmId: 'vm-none' }), Status.FAILED_PRECONDITION, /is above epoch 3/);
    // nothing changed: the persisted fence is 3, and the real server's epoch still passes
    expect(JSON.parse(readFileSync(path.join(fx.stateDir, 'vmm-supervisor', 'epoch'), 'utf8')).epoch).toBe(3);
    expect((await fx.client(3).deleteVm({ vmId: 'vm-none' })).existed).toBe(false);
    // the next server writes its lease record (epoch 4) before it fences: accepted
    writeLeaseRecord(fx.stateDir, 4);
    expect((await fx.client(4).fenceEpoch({ epoch: 4 })).epoch).toBe(4);
    await expectCode(fx.client(3).deleteVm({ vmId: 'vm-none' }), Status.ABORTED, /stale epoch 3; this node is at epoch 4/);
  });

  test('--config without a value, an unknown argument and a bad failpoint exit 2 naming them', () => {
    const run = (args: string[], env: Record<string, string> = {}) => {
      const r = spawnSync(process.execPath, [MAIN_JS, ...args], { env: fx.env(env), encoding: 'utf8', timeout: 20_000 });
      return { code: r.status, out: `${r.stdout}${r.stderr}` };
    };
    expect(run(['--config'])).toMatchObject({ code: 2, out: expect.stringContaining('--config needs a value') });
    expect(run(['--config', '--bogus'])).toMatchObject({ code: 2, out: expect.stringContaining('--config needs a value') });
    expect(run(['--bogus'])).toMatchObject({ code: 2, out: expect.stringContaining('unknown argument \\"--bogus\\"') });
    // --help prints the usage and exits 0 at once: it never starts a daemon (one used to, on the default dirs)
    expect(run(['--help'])).toMatchObject({ code: 0, out: expect.stringContaining('usage: sandnode-vmm-supervisor') });
    expect(run([], { SANDNODE_VMM_SUPERVISOR_FAILPOINTS: 'runc.nope' })).toMatchObject({
      code: 2,
      out: expect.stringContaining('SANDNODE_VMM_SUPERVISOR_FAILPOINTS: unknown failpoint \\"runc.nope\\"'),
    });
  });
});
