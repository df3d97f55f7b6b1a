/**
 * Integration: the real vmm-supervisor daemon (dist/main.js) with the runc driver, on a unix
 * socket in a temp dir, with a busybox template and ext4 loop devices made here. Needs root,
 * runc, busybox, e2fsprogs and /dev/loop-control (VMM_PARTS): skips naming what is missing, or
 * fails under CI=true.
 * Build first: `npx tsc -b services/vmm-supervisor/tsconfig.build.json`.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { chmodSync, existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, readlinkSync, statSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import Database from 'better-sqlite3';
import { ClientError, Status } from 'nice-grpc-common';
import { describeWith, expectCode, waitFor, writeLeaseRecord } from '@sandnode/testkit';
import { createSandnodeChannel, createServiceClient, isSameProcess, processStartTicks, processState } from '@sandnode/shared';
import { VersionServiceDefinition } from '@sandnode/shared/proto/common/v1/version';
import { DriveRole, VmState } from '@sandnode/shared/proto/vmm/v1/vmm';
import type { VmSpec } from '@sandnode/shared/proto/vmm/v1/vmm';
import { Fixture, MAIN_JS, VMM_PARTS } from './__tests__/fixture';
import type { Daemon } from './__tests__/fixture';
import { mountsUnder } from './drivers/mounts';
import { FAILPOINTS, FAILPOINTS_ENV } from './core/failpoints';

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

/** hostUnixListeners lists listening unix sockets of the host netns (/proc/net/unix, flag __SO_ACCEPTCON). */
function hostUnixListeners(): { inode: string; path: string }[] {
  return readFileSync('/proc/net/unix', 'utf8')
    .split('\n')
    .slice(1)
    .map((l) => l.trim().split(/\s+/))
    .filter((f) => f.length >= 8 && (parseInt(f[3]!, 16) & 0x10000) !== 0)
    .map((f) => ({ inode: f[6]!, path: f.slice(7).join(' ') }));
}

/** fdTargets lists the link targets of /proc/<pid>/fd/*. */
function fdTargets(pid: number): string[] {
  const dir = `/proc/${pid}/fd`;
  return readdirSync(dir).map((n) => {
    try {
      return readlinkSync(path.join(dir, n));
    } catch {
      return '';
    }
  });
}

/** connectUnix connects to a unix socket and closes the connection. */
function connectUnix(p: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const c = net.connect(p, () => {
      c.destroy();
      resolve();
    });
    c.once('error', reject);
  });
}

describeWith('vmm-supervisor runc driver (integration)', VMM_PARTS, () => {
  let fx: Fixture;
  let client: ReturnType<Fixture['client']>;
  let specA: VmSpec;
  let specB: VmSpec;
  let poddA: string;
  let pidA = 0;
  let ticksA = 0;
  let daemon: Daemon;
  let binDir = '';
  let runcVersion = '';
  /** tableRow reads a VM's row straight from the supervisor's table (WAL: safe while it runs). */
  const tableRow = (vmId: string): { driverBinary?: string; driverVersion?: string } => {
    const db = new Database(path.join(fx.stateDir, 'vmm-supervisor', 'vm-table.db'), { readonly: true });
    try {
      const row = db.prepare('SELECT record FROM vms WHERE vm_id = ?').get(vmId) as { record: string } | undefined;
      return row ? (JSON.parse(row.record) as { driverBinary?: string }) : {};
    } finally {
      db.close();
    }
  };

  beforeAll(async () => {
    fx = new Fixture();
    writeLeaseRecord(fx.stateDir, 6); // the highest epoch this suite fences with (no server: its lease record)
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
      resources: { vcpus: 1, memoryMib: 128, diskBytes: 0, pids: 0 },
      poddSocketDir: poddA,
      hostname: 'box-a',
      env: { FOO: 'bar' },
      machineId: '',
      network: undefined,
    };
    specB = {
      templateRootfs: fx.rootfs,
      drives: [{ driveId: 'upper', path: upperB, role: DriveRole.DRIVE_ROLE_ROOTFS_UPPER, readOnly: false }],
      resources: undefined,
      poddSocketDir: path.join(fx.runDir, 'sandboxes', 'vm-b'),
      hostname: '',
      env: {},
      machineId: '',
      network: undefined,
    };
    binDir = path.join(fx.stateDir, 'vmm-supervisor', 'bin');
    runcVersion = /runc version (\S+)/.exec(execFileSync('runc', ['--version']).toString())![1]!;
    daemon = await fx.start();
    client = fx.client();
  });

  afterAll(async () => {
    await fx?.cleanup();
  });

  test('driver "firecracker" without a kernel image fails at start naming the key', () => {
    const r = spawnSync(process.execPath, [MAIN_JS], {
      env: {
        ...process.env,
        SANDNODE_VMM_SUPERVISOR_DRIVER: 'firecracker',
        SANDNODE_VMM_SUPERVISOR_RUN_DIR: path.join(fx.dir, 'fc-run'),
        SANDNODE_VMM_SUPERVISOR_STATE_DIR: path.join(fx.dir, 'fc-state'),
      },
      encoding: 'utf8',
      timeout: 20_000,
    });
    expect(r.status).toBe(2);
    expect(r.stderr).toMatch(/key \\?"kernelImage\\?": required with driver \\?"firecracker\\?"/);
  });

  test('a second supervisor on the same state dir exits with a clear message and leaves the socket alone', async () => {
    const before = statSync(fx.socket).ino;
    const r = spawnSync(process.execPath, [MAIN_JS], { env: fx.env(), encoding: 'utf8', timeout: 20_000 });
    expect(r.status).toBe(3);
    expect(r.stdout + r.stderr).toContain('another vmm-supervisor already runs on this state dir');
    expect(r.stdout + r.stderr).toContain(`locked by pid ${daemon.pid}`);
    expect(statSync(fx.socket).ino).toBe(before);
    expect((await client.listVms({})).vms).toEqual([]);
  });

  test('the configured runc is copied into bin/runc-<version>/ at start', () => {
    expect(readdirSync(binDir)).toEqual([`runc-${runcVersion}`]);
    expect(statSync(path.join(binDir, `runc-${runcVersion}`, 'runc')).mode & 0o111).toBeTruthy();
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
    const cgroups = readFileSync(`/proc/${pidA}/cgroup`, 'utf8')
      .split('\n')
      .filter((l) => l && !l.startsWith('0::'));
    expect(cgroups.length).toBeGreaterThan(0);
    for (const l of cgroups) expect(l).toMatch(/:\/sandnode\/vm-a$/);
    // 1 vCPU is a quota of one period, with a burst of one quota (podd's start is not throttled)
    const cpuDir = '/sys/fs/cgroup/cpu/sandnode/vm-a';
    if (existsSync(path.join(cpuDir, 'cpu.cfs_quota_us'))) {
      expect(readFileSync(path.join(cpuDir, 'cpu.cfs_quota_us'), 'utf8').trim()).toBe('100000');
      if (existsSync(path.join(cpuDir, 'cpu.cfs_burst_us'))) expect(readFileSync(path.join(cpuDir, 'cpu.cfs_burst_us'), 'utf8').trim()).toBe('100000');
    }
    const [pgrp, session] = statFields(pidA);
    const [daemonPgrp, daemonSession] = statFields(daemon.pid);
    expect(pgrp).not.toBe(daemonPgrp);
    expect(session).not.toBe(daemonSession);
    // The init saw the podd socket dir bind mount and its env.
    await waitFor('init marker', () => existsSync(path.join(poddA, 'guest', 'init-marker')));
    expect(readFileSync(path.join(poddA, 'guest', 'init-marker'), 'utf8').trim()).toBe('started vm-a');
    expect(tableRow('vm-a').driverBinary).toBe(path.join(binDir, `runc-${runcVersion}`, 'runc'));
  });

  test('podd socket: bound on the host, held by the init as listening fd 3, supervisor copy closed', async () => {
    const sock = path.join(poddA, 'podd.sock');
    const st = lstatSync(sock);
    expect(st.isSocket()).toBe(true);
    expect(st.mode & 0o777).toBe(0o600);
    // The host sees one listening socket bound under poddA (its temp bind name); the init's fd 3 is it.
    const listening = hostUnixListeners().filter((l) => l.path.startsWith(`${poddA}/`));
    expect(listening).toHaveLength(1);
    await waitFor('fd3 report', () => existsSync(path.join(poddA, 'guest', 'fd3')));
    const fd3 = readFileSync(path.join(poddA, 'guest', 'fd3'), 'utf8').trim();
    expect(fd3).toMatch(/^fd=3 .*\/proc\/self\/fd\/3 -> socket:\[\d+\]$/);
    expect(fd3.endsWith(`socket:[${listening[0]!.inode}]`)).toBe(true);
    // Only the container holds it: the supervisor closed its copy.
    expect(fdTargets(daemon.pid)).not.toContain(`socket:[${listening[0]!.inode}]`);
    expect(fdTargets(pidA)).toContain(`socket:[${listening[0]!.inode}]`);
    // A connection reaches the container's socket (queued in its backlog).
    await connectUnix(sock);
    // The container sees only its guest dir, never the socket's dir.
    expect(fx.runc(['exec', 'vm-a', 'ls', '-a', '/run/sandnode']).split('\n').filter(Boolean).sort()).toEqual(['.', '..', 'fd3', 'init-marker']);
  });

  test('a symlink planted by the sandbox at /run/sandnode/podd.sock does not redirect the host socket', async () => {
    const sock = path.join(poddA, 'podd.sock');
    const before = lstatSync(sock);
    fx.runc(['exec', 'vm-a', 'sh', '-c', 'ln -sf /run/other-sandbox/podd.sock /run/sandnode/podd.sock && ln -sfn / /run/sandnode/escape']);
    const after = lstatSync(sock);
    expect(after.isSocket()).toBe(true);
    expect(after.ino).toBe(before.ino);
    expect(lstatSync(path.join(poddA, 'guest', 'podd.sock')).isSymbolicLink()).toBe(true); // landed in guest/, harmless
    await connectUnix(sock);
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
    await daemon.kill('SIGKILL');
    expect(isSameProcess(pidA, ticksA)).toBe(true);
    expect((JSON.parse(fx.runc(['state', 'vm-a'])) as { status: string }).status).toBe('running');

    // The container holds podd's socket: it keeps working with no supervisor at all.
    await connectUnix(path.join(poddA, 'podd.sock'));

    daemon = await fx.start();
    const { vm } = await client.getVm({ vmId: 'vm-a' });
    expect(vm?.state).toBe(VmState.VM_STATE_RUNNING);
    expect(vm?.pid).toBe(pidA);
    expect(vm?.startTimeTicks).toBe(ticksA);
    expect(processStartTicks(pidA)).toBe(ticksA);
    await connectUnix(path.join(poddA, 'podd.sock'));
  });

  test('SIGTERM stops the supervisor and leaves the VM running; a paused VM is adopted paused', async () => {
    await client.pauseVm({ vmId: 'vm-a' });
    expect(await daemon.kill('SIGTERM')).toEqual({ code: 0, signal: null });
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
    await expectCode(bad({ resources: { vcpus: 65, memoryMib: 0, diskBytes: 0, pids: 0 } }), Status.INVALID_ARGUMENT);
    await expectCode(bad({ resources: { vcpus: 0, memoryMib: 16, diskBytes: 0, pids: 0 } }), Status.INVALID_ARGUMENT);
    await expectCode(bad({ resources: { vcpus: 0, memoryMib: 65537, diskBytes: 0, pids: 0 } }), Status.INVALID_ARGUMENT);
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
    const err = await expectCode(client.createVm({ vmId: 'vm-broken', spec: { ...specB, drives: [{ ...specB.drives[0]!, path: '/dev/null' }] } }), Status.INTERNAL);
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
    await daemon.kill('SIGTERM');
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

  test('epoch fence: a mutating call with a lower epoch is ABORTED and changes nothing; the highest epoch survives a restart', async () => {
    const at5 = fx.client(5);
    const at4 = fx.client(4);
    const { vm } = await at5.createVm({ vmId: 'vm-e', spec: { ...specA, drives: [{ ...specA.drives[0]! }], poddSocketDir: path.join(fx.runDir, 'sandboxes', 'vm-e') } });
    const pidE = vm!.pid;
    const ticksE = vm!.startTimeTicks;
    expect(JSON.parse(readFileSync(path.join(fx.stateDir, 'vmm-supervisor', 'epoch'), 'utf8')).epoch).toBe(5);

    const stale = await expectCode(at4.deleteVm({ vmId: 'vm-e' }), Status.ABORTED);
    expect(stale.details).toContain('stale epoch 4');
    await expectCode(at4.pauseVm({ vmId: 'vm-e' }), Status.ABORTED);
    await expectCode(at4.createVm({ vmId: 'vm-e2', spec: specB }), Status.ABORTED);
    await expectCode(client.stopVm({ vmId: 'vm-e', timeoutMs: 0 }), Status.ABORTED); // no epoch = 0
    // Nothing changed: the container runs untouched, no other VM appeared; reads need no epoch.
    expect(alive(pidE, ticksE)).toBe(true);
    expect((JSON.parse(fx.runc(['state', 'vm-e'])) as { status: string }).status).toBe('running');
    expect(readFileSync('/sys/fs/cgroup/freezer/sandnode/vm-e/freezer.state', 'utf8').trim()).toBe('THAWED');
    expect((await client.listVms({})).vms.map((v) => [v.vmId, v.state])).toEqual([['vm-e', VmState.VM_STATE_RUNNING]]);
    expect(existsSync(path.join(fx.runDir, 'vms', 'vm-e2'))).toBe(false);

    await daemon.kill('SIGKILL');
    daemon = await fx.start();
    await expectCode(at4.pauseVm({ vmId: 'vm-e' }), Status.ABORTED);
    expect(alive(pidE, ticksE)).toBe(true);
    const at6 = fx.client(6);
    expect((await at6.pauseVm({ vmId: 'vm-e' })).vm?.state).toBe(VmState.VM_STATE_PAUSED);
    await expectCode(at5.resumeVm({ vmId: 'vm-e' }), Status.ABORTED);
    expect((await at6.deleteVm({ vmId: 'vm-e' })).existed).toBe(true);
    expect(alive(pidE, ticksE)).toBe(false);
  });

  test('driver binaries: a VM keeps the runc it started with across a host upgrade; unused dirs are pruned', async () => {
    const at6 = fx.client(6);
    const copy = path.join(binDir, `runc-${runcVersion}`, 'runc');
    const { vm: old } = await at6.createVm({ vmId: 'vm-v', spec: { ...specB, poddSocketDir: path.join(fx.runDir, 'sandboxes', 'vm-v') } });
    expect(old?.driverVersion).toBe(runcVersion);
    expect(tableRow('vm-v').driverBinary).toBe(copy);

    // "Upgrade" the host package: runcBinary now names a runc that says 9.9.9-test and logs how it is called.
    const host = path.join(fx.dir, 'host-bin');
    mkdirSync(host, { recursive: true });
    const calls = path.join(fx.dir, 'runc-calls.log');
    const realRunc = execFileSync('sh', ['-c', 'command -v runc']).toString().trim();
    writeFileSync(path.join(host, 'runc'), `#!/bin/sh\nif [ "$1" = "--version" ]; then echo "runc version 9.9.9-test"; exit 0; fi\necho "$0 $*" >> ${calls}\nexec ${realRunc} "$@"\n`);
    chmodSync(path.join(host, 'runc'), 0o755);
    mkdirSync(path.join(binDir, 'runc-0.0.1-stale'), { recursive: true });
    await daemon.kill('SIGTERM');
    daemon = await fx.start({ SANDNODE_VMM_SUPERVISOR_RUNC_BINARY: path.join(host, 'runc') });
    const upgraded = path.join(binDir, 'runc-9.9.9-test', 'runc');
    expect(readdirSync(binDir).sort()).toEqual([`runc-${runcVersion}`, 'runc-9.9.9-test']); // stale dir pruned at start

    // The old VM is still managed by its own copy: the new runc is never called for it.
    expect((await at6.pauseVm({ vmId: 'vm-v' })).vm?.state).toBe(VmState.VM_STATE_PAUSED);
    expect((await at6.resumeVm({ vmId: 'vm-v' })).vm?.state).toBe(VmState.VM_STATE_RUNNING);
    expect(existsSync(calls) ? readFileSync(calls, 'utf8') : '').not.toMatch(/vm-v/);
    // A new VM starts with the new copy (not the host path).
    const upperW = fx.makeExt4Loop('upper-w');
    const { vm: neu } = await at6.createVm({
      vmId: 'vm-w',
      spec: { ...specB, drives: [{ ...specB.drives[0]!, path: upperW }], poddSocketDir: path.join(fx.runDir, 'sandboxes', 'vm-w') },
    });
    expect(neu?.driverVersion).toBe('9.9.9-test');
    expect(tableRow('vm-w').driverBinary).toBe(upgraded);
    expect(readFileSync(calls, 'utf8')).toContain(`${upgraded} --root ${fx.runcRoot} run -d --preserve-fds 1`);
    expect(readFileSync(calls, 'utf8')).not.toContain(`${path.join(host, 'runc')} `);

    // Deleting the last VM of the old version removes its dir; the current one stays.
    expect((await at6.deleteVm({ vmId: 'vm-v' })).existed).toBe(true);
    expect(readdirSync(binDir)).toEqual(['runc-9.9.9-test']);
    expect((await at6.deleteVm({ vmId: 'vm-w' })).existed).toBe(true);
    expect(readdirSync(binDir)).toEqual(['runc-9.9.9-test']);
  });
});
