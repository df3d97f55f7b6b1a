/**
 * Integration: VmService.FenceEpoch and the command line of the real vmm-supervisor process
 * (dist/main.js): the fence is raised, survives a kill -9 of the daemon, and a stale caller is
 * ABORTED; the 0.2.0 announcement (a DeleteVm of an unknown id carrying the epoch) still works.
 * Needs what the other vmm-supervisor integration tests need (VMM_PARTS: the daemon starts its runc driver).
 */
import { spawnSync } from 'node:child_process';
import { Status } from 'nice-grpc-common';
import { createSandnodeChannel, createServiceClient, VMM_FEATURES } from '@sandnode/shared';
import { VersionServiceDefinition } from '@sandnode/shared/proto/common/v1/version';
import { describeWith, expectCode } from '@sandnode/testkit';
import { Fixture, MAIN_JS, VMM_PARTS } from './__tests__/fixture';

describeWith('vmm-supervisor FenceEpoch (real daemon)', VMM_PARTS, () => {
  let fx: Fixture;
  beforeEach(() => (fx = new Fixture()));
  afterEach(() => fx.cleanup());

  test('raises the fence, persists it across a kill -9, and fences stale callers off', async () => {
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
