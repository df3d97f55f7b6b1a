/**
 * Integration: the real vmm-supervisor daemon (dist/main.js) with the runc driver, on a unix
 * socket in a temp dir, with a busybox template and ext4 loop devices made here. Needs root,
 * runc, busybox and /dev/loop-control; skips with a message naming what is missing.
 * Build first: `npx tsc -b services/vmm-supervisor/tsconfig.build.json`.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync, mkdirSync } from 'node:fs';
import path from 'node:path';
import { ClientError, Status } from 'nice-grpc-common';
import { createSandnodeChannel, createServiceClient, isSameProcess, processStartTicks, processState } from '@sandnode/shared';
import { VersionServiceDefinition } from '@sandnode/shared/proto/common/v1/version';
import { DriveRole, VmState } from '@sandnode/shared/proto/vmm/v1/vmm';
import type { VmSpec } from '@sandnode/shared/proto/vmm/v1/vmm';
import { Fixture, MAIN_JS, missingPrereqs } from './__tests__/fixture';
import type { Daemon } from './__tests__/fixture';
import { mountsUnder } from './drivers/mounts';
import { FAILPOINTS, FAILPOINTS_ENV } from './core/failpoints';

const missing = missingPrereqs();
if (missing.length) {
  // eslint-disable-next-line no-console
  console.warn(`vmm-supervisor integration tests skipped: missing ${missing.join(', ')}`);
}
const describeIt = missing.length ? describe.skip : describe;

async function expectCode(p: Promise<unknown>, code: Status): Promise<ClientError> {
  try {
    await p;
  } catch (err) {
    expect(err).toBeInstanceOf(ClientError);
    const ce = err as ClientError;
    if (ce.code !== code) throw new Error(`expected ${Status[code]}, got ${Status[ce.code]}: ${ce.details}`);
    return ce;
  }
  throw new Error(`expected ${Status[code]}, call succeeded`);
}

/** alive says whether pid is the process started at ticks and not a zombie waiting to be reaped. */
function alive(pid: number, ticks: number): boolean {
  return isSameProcess(pid, ticks) && processState(pid) !== 'Z';
}

/** statFields returns [pgrp, session] of pid from /proc/<pid>/stat (fields 5 and 6). */
function statFields(pid: number): [number, number] {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return [Number(f[2]), Number(f[3])];
}

async function waitFor(what: string, cond: () => boolean, ms = 5000): Promise<void> {
  const until = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

describeIt('vmm-supervisor runc driver (integration)', () => {
  let fx: Fixture;
  let client: ReturnType<Fixture['client']>;
  let specA: VmSpec;
  let specB: VmSpec;
  let poddA: string;
  let pidA = 0;
  let ticksA = 0;
  let daemon: Daemon;

  beforeAll(async () => {
    if (!existsSync(MAIN_JS)) throw new Error(`${MAIN_JS} missing: run npx tsc -b services/vmm-supervisor/tsconfig.build.json`);
    fx = new Fixture();
    fx.buildRootfs();
    const upperA = fx.makeExt4Loop('upper-a');
    const wsA = fx.makeExt4Loop('ws-a');
    const upperB = fx.makeExt4Loop('upper-b');
    poddA = path.join(fx.runDir, 'sandboxes', 'vm-a');
    mkdirSync(poddA, { recursive: true });
    specA = {
      templateRootfs: fx.rootfs,
      drives: [
        { driveId: 'upper', path: upperA, role: DriveRole.DRIVE_ROLE_ROOTFS_UPPER, readOnly: false },
        { driveId: 'ws', path: wsA, role: DriveRole.DRIVE_ROLE_WORKSPACE, readOnly: false },
      ],
      resources: { vcpus: 1, memoryMib: 128, diskBytes: 0 },
      poddSocketDir: poddA,
      hostname: 'box-a',
      env: { FOO: 'bar' },
    };
    specB = {
      templateRootfs: fx.rootfs,
      drives: [{ driveId: 'upper', path: upperB, role: DriveRole.DRIVE_ROLE_ROOTFS_UPPER, readOnly: false }],
      resources: undefined,
      poddSocketDir: path.join(fx.runDir, 'sandboxes', 'vm-b'),
      hostname: '',
      env: {},
    };
    daemon = await fx.start();
    client = fx.client();
  });

  afterAll(async () => {
    await fx?.cleanup();
  });

  test('driver "firecracker" fails at start with a clear message', () => {
    const r = spawnSync(process.execPath, [MAIN_JS], {
      env: { ...process.env, SANDNODE_VMM_SUPERVISOR_DRIVER: 'firecracker', SANDNODE_VMM_SUPERVISOR_RUN_DIR: path.join(fx.dir, 'fc-run') },
      encoding: 'utf8',
      timeout: 20_000,
    });
    expect(r.status).toBe(2);
    expect(r.stderr).toMatch(/firecracker.*not built in this release/);
  });

  test('GetVersion names the component and its features', async () => {
    const v = await createServiceClient(VersionServiceDefinition, createSandnodeChannel(fx.address)).getVersion({});
    expect(v.component).toBe('vmm-supervisor');
    expect(v.features).toEqual(expect.arrayContaining(['vmm.runc', 'vmm.adoption.v1']));
  });

  test('CreateVm starts a detached container whose pid and start ticks match', async () => {
    const { vm } = await client.createVm({ vmId: 'vm-a', spec: specA });
    expect(vm?.state).toBe(VmState.VM_STATE_RUNNING);
    expect(vm?.driver).toBe('runc');
    expect(vm?.driverVersion).toMatch(/^1\./);
    pidA = vm!.pid;
    ticksA = vm!.startTimeTicks;
    expect(pidA).toBeGreaterThan(0);
    expect(processStartTicks(pidA)).toBe(ticksA);
    // The container is in its own session and cgroup, not the supervisor's.
    const daemonPid = (JSON.parse(fx.runc(['state', 'vm-a'])) as { pid: number }).pid;
    expect(daemonPid).toBe(pidA);
    const cgroups = readFileSync(`/proc/${pidA}/cgroup`, 'utf8').split('\n').filter((l) => l && !l.startsWith('0::'));
    expect(cgroups.length).toBeGreaterThan(0);
    for (const l of cgroups) expect(l).toMatch(/:\/sandnode\/vm-a$/);
    const [pgrp, session] = statFields(pidA);
    const [daemonPgrp, daemonSession] = statFields(daemon.proc.pid!);
    expect(pgrp).not.toBe(daemonPgrp);
    expect(session).not.toBe(daemonSession);
    // The init saw the podd socket dir bind mount and its env.
    await waitFor('init marker', () => existsSync(path.join(poddA, 'init-marker')));
    expect(readFileSync(path.join(poddA, 'init-marker'), 'utf8').trim()).toBe('started vm-a');
    expect(fx.runc(['exec', 'vm-a', 'hostname']).trim()).toBe('box-a');
    expect(fx.runc(['exec', 'vm-a', 'sh', '-c', 'echo $FOO']).trim()).toBe('bar');
  });

  test('a file written into the workspace mount on the host is visible inside', async () => {
    writeFileSync(path.join(fx.runDir, 'vms', 'vm-a', 'workspace', 'x'), 'hello from host\n');
    expect(fx.runc(['exec', 'vm-a', 'cat', '/workspace/x'])).toBe('hello from host\n');
  });

  test('CreateVm is idempotent on vm_id; another spec is ALREADY_EXISTS', async () => {
    const again = await client.createVm({ vmId: 'vm-a', spec: specA });
    expect(again.vm?.pid).toBe(pidA);
    await expectCode(client.createVm({ vmId: 'vm-a', spec: { ...specA, hostname: 'other' } }), Status.ALREADY_EXISTS);
  });

  test('PauseVm freezes the container, ResumeVm thaws it with the same pid', async () => {
    const paused = await client.pauseVm({ vmId: 'vm-a' });
    expect(paused.vm?.state).toBe(VmState.VM_STATE_PAUSED);
    expect(paused.vm?.pid).toBe(pidA);
    expect(readFileSync('/sys/fs/cgroup/freezer/sandnode/vm-a/freezer.state', 'utf8').trim()).toBe('FROZEN');
    // A frozen task sleeps uninterruptibly in the freezer (D), never runs (R) or sleeps (S).
    expect(processState(pidA)).toBe('D');
    expect((await client.getVm({ vmId: 'vm-a' })).vm?.state).toBe(VmState.VM_STATE_PAUSED);
    await expectCode(client.pauseVm({ vmId: 'vm-a' }), Status.FAILED_PRECONDITION);

    const resumed = await client.resumeVm({ vmId: 'vm-a' });
    expect(resumed.vm?.state).toBe(VmState.VM_STATE_RUNNING);
    expect(resumed.vm?.pid).toBe(pidA);
    expect(isSameProcess(pidA, ticksA)).toBe(true);
    await expectCode(client.resumeVm({ vmId: 'vm-a' }), Status.FAILED_PRECONDITION);
  });

  test('kill -9 of the supervisor leaves the VM running; a restart adopts it unchanged', async () => {
    daemon.proc.kill('SIGKILL');
    await daemon.exited;
    expect(isSameProcess(pidA, ticksA)).toBe(true);
    expect((JSON.parse(fx.runc(['state', 'vm-a'])) as { status: string }).status).toBe('running');

    daemon = await fx.start();
    const { vm } = await client.getVm({ vmId: 'vm-a' });
    expect(vm?.state).toBe(VmState.VM_STATE_RUNNING);
    expect(vm?.pid).toBe(pidA);
    expect(vm?.startTimeTicks).toBe(ticksA);
    expect(processStartTicks(pidA)).toBe(ticksA);
  });

  test('SIGTERM stops the supervisor and leaves the VM running; a paused VM is adopted paused', async () => {
    await client.pauseVm({ vmId: 'vm-a' });
    daemon.proc.kill('SIGTERM');
    expect(await daemon.exited).toEqual({ code: 0, signal: null });
    expect(isSameProcess(pidA, ticksA)).toBe(true);
    expect((JSON.parse(fx.runc(['state', 'vm-a'])) as { status: string }).status).toBe('paused');

    daemon = await fx.start();
    const { vms } = await client.listVms({});
    expect(vms.map((v) => [v.vmId, v.state, v.pid])).toEqual([['vm-a', VmState.VM_STATE_PAUSED, pidA]]);
    expect((await client.resumeVm({ vmId: 'vm-a' })).vm?.pid).toBe(pidA);
  });

  test('bad input gets the documented status codes and changes nothing', async () => {
    const upper = specA.drives[0]!;
    const ws = specA.drives[1]!;
    const bad = (spec: Partial<VmSpec>) => client.createVm({ vmId: 'vm-bad', spec: { ...specB, ...spec } });
    await expectCode(client.createVm({ vmId: 'Bad_Id', spec: specB }), Status.INVALID_ARGUMENT);
    await expectCode(client.createVm({ vmId: '', spec: specB }), Status.INVALID_ARGUMENT);
    await expectCode(client.createVm({ vmId: 'vm-bad', spec: undefined }), Status.INVALID_ARGUMENT);
    const noUpper = await expectCode(bad({ drives: [ws] }), Status.INVALID_ARGUMENT);
    expect(noUpper.details).toContain('spec.drives');
    const twoUppers = await expectCode(bad({ drives: [upper, { ...upper, driveId: 'u2' }] }), Status.INVALID_ARGUMENT);
    expect(twoUppers.details).toContain('spec.drives');
    const twoWs = await expectCode(bad({ drives: [upper, ws, { ...ws, driveId: 'ws2' }] }), Status.INVALID_ARGUMENT);
    expect(twoWs.details).toContain('spec.drives');
    await expectCode(bad({ drives: [{ ...upper, role: DriveRole.DRIVE_ROLE_UNSPECIFIED }] }), Status.INVALID_ARGUMENT);
    await expectCode(bad({ templateRootfs: 'relative/rootfs' }), Status.INVALID_ARGUMENT);
    await expectCode(bad({ poddSocketDir: 'relative' }), Status.INVALID_ARGUMENT);
    await expectCode(bad({ resources: { vcpus: 65, memoryMib: 0, diskBytes: 0 } }), Status.INVALID_ARGUMENT);
    await expectCode(bad({ resources: { vcpus: 0, memoryMib: 16, diskBytes: 0 } }), Status.INVALID_ARGUMENT);
    await expectCode(bad({ resources: { vcpus: 0, memoryMib: 65537, diskBytes: 0 } }), Status.INVALID_ARGUMENT);
    await expectCode(bad({ templateRootfs: path.join(fx.dir, 'no-such-rootfs') }), Status.FAILED_PRECONDITION);
    await expectCode(bad({ drives: [{ ...upper, path: '/dev/no-such-loop' }] }), Status.FAILED_PRECONDITION);
    await expectCode(client.getVm({ vmId: 'vm-none' }), Status.NOT_FOUND);
    await expectCode(client.getVm({ vmId: 'NOPE' }), Status.INVALID_ARGUMENT);
    await expectCode(client.pauseVm({ vmId: 'vm-none' }), Status.NOT_FOUND);
    await expectCode(client.resumeVm({ vmId: 'vm-none' }), Status.NOT_FOUND);
    await expectCode(client.stopVm({ vmId: 'vm-none', timeoutMs: 0 }), Status.NOT_FOUND);
    expect((await client.deleteVm({ vmId: 'vm-none' })).existed).toBe(false);
    expect((await client.listVms({})).vms.map((v) => v.vmId)).toEqual(['vm-a']);
    expect(existsSync(path.join(fx.runDir, 'vms', 'vm-bad'))).toBe(false);
  });

  test('a create that fails on the host is undone and says what failed', async () => {
    const err = await expectCode(
      client.createVm({ vmId: 'vm-broken', spec: { ...specB, drives: [{ ...specB.drives[0]!, path: '/dev/null' }] } }),
      Status.INTERNAL,
    );
    expect(err.details).toContain('mount rootfs upper drive /dev/null');
    expect((await client.listVms({})).vms.map((v) => v.vmId)).toEqual(['vm-a']);
    expect(existsSync(path.join(fx.runDir, 'vms', 'vm-broken'))).toBe(false);
    expect(() => fx.runc(['state', 'vm-broken'])).toThrow();
  });

  test('StopVm stops a paused VM; stop is idempotent; a stopped VM cannot be paused', async () => {
    const { vm } = await client.createVm({ vmId: 'vm-b', spec: specB });
    expect(vm?.state).toBe(VmState.VM_STATE_RUNNING);
    const pidB = vm!.pid;
    const ticksB = vm!.startTimeTicks;
    // Default resources were applied to the cgroup.
    expect(readFileSync('/sys/fs/cgroup/memory/sandnode/vm-b/memory.limit_in_bytes', 'utf8').trim()).toBe(String(512 * 1024 * 1024));
    expect(readFileSync('/sys/fs/cgroup/cpu/sandnode/vm-b/cpu.cfs_quota_us', 'utf8').trim()).toBe('100000');
    await client.pauseVm({ vmId: 'vm-b' });
    const stopped = await client.stopVm({ vmId: 'vm-b', timeoutMs: 500 });
    expect(stopped.vm?.state).toBe(VmState.VM_STATE_STOPPED);
    expect(stopped.vm?.pid).toBe(0);
    expect(alive(pidB, ticksB)).toBe(false);
    expect((await client.stopVm({ vmId: 'vm-b', timeoutMs: 0 })).vm?.state).toBe(VmState.VM_STATE_STOPPED);
    expect((await client.getVm({ vmId: 'vm-b' })).vm?.state).toBe(VmState.VM_STATE_STOPPED);
    await expectCode(client.pauseVm({ vmId: 'vm-b' }), Status.FAILED_PRECONDITION);
    await expectCode(client.resumeVm({ vmId: 'vm-b' }), Status.FAILED_PRECONDITION);
  });

  test('a VM whose processes die behind the supervisor is reported STOPPED', async () => {
    const b = await client.deleteVm({ vmId: 'vm-b' });
    expect(b.existed).toBe(true);
    const { vm } = await client.createVm({ vmId: 'vm-b', spec: specB });
    fx.runc(['kill', '--all', 'vm-b', 'KILL']);
    await waitFor('vm-b init gone', () => !alive(vm!.pid, vm!.startTimeTicks));
    const got = await client.getVm({ vmId: 'vm-b' });
    expect(got.vm?.state).toBe(VmState.VM_STATE_STOPPED);
    expect(got.vm?.pid).toBe(0);
  });

  test('a supervisor killed mid-create leaves a CREATING row that the restart undoes', async () => {
    daemon.proc.kill('SIGTERM');
    await daemon.exited;
    daemon = await fx.start({ [FAILPOINTS_ENV]: FAILPOINTS.createAfterMounts });
    const upperC = fx.makeExt4Loop('upper-c');
    const specC = { ...specB, drives: [{ ...specB.drives[0]!, path: upperC }], poddSocketDir: path.join(fx.runDir, 'sandboxes', 'vm-c') };
    await expect(client.createVm({ vmId: 'vm-c', spec: specC })).rejects.toBeInstanceOf(ClientError);
    expect((await daemon.exited).signal).toBe('SIGKILL');
    const vmDir = path.join(fx.runDir, 'vms', 'vm-c');
    expect(mountsUnder(vmDir).length).toBe(2); // upper-dev and the overlay rootfs

    daemon = await fx.start();
    await expectCode(client.getVm({ vmId: 'vm-c' }), Status.NOT_FOUND);
    expect(mountsUnder(vmDir)).toEqual([]);
    expect(existsSync(vmDir)).toBe(false);
    // The other VMs were not touched.
    expect(isSameProcess(pidA, ticksA)).toBe(true);
    expect((await client.getVm({ vmId: 'vm-a' })).vm?.state).toBe(VmState.VM_STATE_RUNNING);
  });

  test('DeleteVm removes the container, the mounts and the dir; a second delete says existed=false', async () => {
    const vmDir = path.join(fx.runDir, 'vms', 'vm-a');
    expect(mountsUnder(vmDir).length).toBe(3);
    expect((await client.deleteVm({ vmId: 'vm-a' })).existed).toBe(true);
    expect(alive(pidA, ticksA)).toBe(false);
    expect(mountsUnder(vmDir)).toEqual([]);
    expect(existsSync(vmDir)).toBe(false);
    expect(() => fx.runc(['state', 'vm-a'])).toThrow();
    await expectCode(client.getVm({ vmId: 'vm-a' }), Status.NOT_FOUND);
    expect((await client.deleteVm({ vmId: 'vm-a' })).existed).toBe(false);

    expect((await client.deleteVm({ vmId: 'vm-b' })).existed).toBe(true);
    expect(mountsUnder(path.join(fx.runDir, 'vms'))).toEqual([]);
    expect((await client.listVms({})).vms).toEqual([]);
  });
});
