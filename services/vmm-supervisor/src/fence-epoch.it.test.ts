/**
 * Integration: VmService.FenceEpoch and the command line of the real vmm-supervisor process
 * (dist/main.js): the fence is raised, survives a kill -9 of the daemon, and a stale caller is
 * ABORTED; the 0.2.0 announcement (a DeleteVm of an unknown id carrying the epoch) still works.
 * Needs what the other vmm-supervisor integration tests need (the daemon starts its runc driver).
 */
import { spawnSync } from 'node:child_process';
import { ClientError, Status } from 'nice-grpc-common';
import { createSandnodeChannel, createServiceClient, VMM_FEATURES } from '@sandnode/shared';
import { VersionServiceDefinition } from '@sandnode/shared/proto/common/v1/version';
import { Fixture, MAIN_JS, missingPrereqs } from './__tests__/fixture';

const missing = missingPrereqs();
if (missing.length) {
  // eslint-disable-next-line no-console
  console.warn(`vmm-supervisor FenceEpoch integration tests skipped: missing ${missing.join(', ')}`);
}
const describeIt = missing.length ? describe.skip : describe;

async function codeOf(p: Promise<unknown>): Promise<{ code: Status; details: string }> {
  try {
    await p;
    return { code: Status.OK, details: '' };
  } catch (err) {
    if (!(err instanceof ClientError)) throw err;
    return { code: err.code, details: err.details };
  }
}

describeIt('vmm-supervisor FenceEpoch (real daemon)', () => {
  let fx: Fixture;
  beforeEach(() => (fx = new Fixture()));
  afterEach(() => fx.cleanup());

  test('raises the fence, persists it across a kill -9, and fences stale callers off', async () => {
    const d1 = await fx.start();
    const version = await createServiceClient(VersionServiceDefinition, createSandnodeChannel(fx.address)).getVersion({});
    expect(version.features).toContain(VMM_FEATURES.fenceEpoch);

    expect((await fx.client().fenceEpoch({ epoch: 5 })).epoch).toBe(5);
    expect((await codeOf(fx.client().fenceEpoch({ epoch: 0 }))).code).toBe(Status.INVALID_ARGUMENT);
    expect((await codeOf(fx.client(5).fenceEpoch({ epoch: 6 }))).code).toBe(Status.INVALID_ARGUMENT);
    expect((await codeOf(fx.client(4).deleteVm({ vmId: 'vm-none' }))).code).toBe(Status.ABORTED);

    d1.proc.kill('SIGKILL');
    await d1.exited;
    await fx.start();
    expect((await codeOf(fx.client(4).deleteVm({ vmId: 'vm-none' }))).code).toBe(Status.ABORTED);
    const stale = await codeOf(fx.client(3).fenceEpoch({ epoch: 3 }));
    expect(stale.code).toBe(Status.ABORTED);
    expect(stale.details).toMatch(/stale epoch 3; this node is at epoch 5/);
    expect((await fx.client(5).fenceEpoch({ epoch: 5 })).epoch).toBe(5);

    // The 0.2.0 announcement still raises the fence: a DeleteVm of an unknown id with the epoch.
    expect((await fx.client(7).deleteVm({ vmId: 'vm-none' })).existed).toBe(false);
    expect((await codeOf(fx.client().fenceEpoch({ epoch: 6 }))).details).toMatch(/this node is at epoch 7/);
  });

  test('--config without a value, an unknown argument and a bad failpoint exit 2 naming them', () => {
    const run = (args: string[], env: Record<string, string> = {}) => {
      const r = spawnSync(process.execPath, [MAIN_JS, ...args], { env: fx.env(env), encoding: 'utf8', timeout: 20_000 });
      return { code: r.status, out: `${r.stdout}${r.stderr}` };
    };
    expect(run(['--config'])).toMatchObject({ code: 2, out: expect.stringContaining('--config needs a file') });
    expect(run(['--config', '--bogus'])).toMatchObject({ code: 2, out: expect.stringContaining('--config needs a file') });
    expect(run(['--bogus'])).toMatchObject({ code: 2, out: expect.stringContaining('unknown argument \\"--bogus\\"') });
    expect(run([], { SANDNODE_VMM_SUPERVISOR_FAILPOINTS: 'runc.nope' })).toMatchObject({
      code: 2,
      out: expect.stringContaining('SANDNODE_VMM_SUPERVISOR_FAILPOINTS: unknown failpoint \\"runc.nope\\"'),
    });
  });
});
