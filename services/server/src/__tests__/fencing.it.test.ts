/**
 * Lease and epoch fencing (ARCHITECTURE.md section 4): two servers racing for one node's lease
 * (exactly one ACTIVE, the other STANDBY; kill -9 of the active -> the standby takes over with
 * epoch + 1 and adopts the sandboxes), and the epoch fence of vmm-supervisor and ublk-manager:
 * a mutating call with an epoch below the node's current one is ABORTED and changes nothing.
 */
import { spawn } from 'node:child_process';
import { closeSync, mkdirSync, openSync } from 'node:fs';
import path from 'node:path';
import { createSandnodeChannel, createServiceClient, processStartTicks, socketPath, unixAddress } from '@sandnode/shared';
import { ServerRole } from '@sandnode/shared/proto/server/v1/admin';
import { SandboxState, type Sandbox } from '@sandnode/shared/proto/server/v1/sandbox';
import { DeviceServiceDefinition } from '@sandnode/shared/proto/ublk/v1/ublk';
import { DriveRole, VmServiceDefinition } from '@sandnode/shared/proto/vmm/v1/vmm';
import { Status } from 'nice-grpc-common';
import { mainScript } from '@sandnode/node-stack';
import { FlockLease } from '../store/flock-lease';
import { adminStatus, describeNode, execCollect, expectCode, holderStatus, inventory, killProcesses, leaseFile, serverProcesses, startNode, waitFor, type TestNode } from '@sandnode/testkit';

jest.setTimeout(180_000);

describeNode('lease and epoch fencing', () => {
  let node: TestNode;
  let sandboxes: Sandbox[];

  beforeAll(async () => {
    node = await startNode();
    sandboxes = await Promise.all([0, 1].map(async (i) => (await node.api.sandboxes.createSandbox({ template: 'base', metadata: { fence: String(i) } })).sandbox!));
    sandboxes[1] = (await node.api.sandboxes.pauseSandbox({ sandboxId: sandboxes[1]!.sandboxId })).sandbox!;
  });
  afterAll(async () => {
    await node?.stop();
  });

  /** spawnServer starts a server process of the node directly (no pid file: a second one). */
  function spawnServer(name: string): number {
    const logDir = path.join(node.dirs.runDir, 'logs');
    mkdirSync(logDir, { recursive: true });
    const out = openSync(path.join(logDir, `server-${name}.log`), 'a');
    const child = spawn(process.execPath, [mainScript('server')], {
      detached: true,
      stdio: ['ignore', out, out],
      env: { ...process.env, SANDNODE_SERVER_STATE_DIR: node.dirs.stateDir, SANDNODE_SERVER_RUN_DIR: node.dirs.runDir, SANDNODE_SERVER_LISTEN: '' },
    });
    closeSync(out);
    child.unref();
    return child.pid!;
  }
  const adminOf = (pid: number) => unixAddress(path.join(node.dirs.runDir, `server-${pid}-admin.sock`));

  it('lets exactly one of two racing servers be ACTIVE; the standby takes over after kill -9 of the active, with epoch + 1, and adopts', async () => {
    node.api.close();
    await killProcesses(serverProcesses(node.dirs.runDir));
    // both at once, on one state dir
    const pids = [spawnServer('race-1'), spawnServer('race-2')];
    const views = await waitFor(
      'both racing servers to answer, one of them ACTIVE',
      async () => {
        const vs = await Promise.all(pids.map((p) => adminStatus(adminOf(p), 1000)));
        if (vs.every((v) => v && (v.role === ServerRole.SERVER_ROLE_ACTIVE || v.role === ServerRole.SERVER_ROLE_STANDBY)) && vs.some((v) => v?.role === ServerRole.SERVER_ROLE_ACTIVE)) return vs;
        throw new Error(`roles: ${vs.map((v) => (v ? ServerRole[v.role] : 'no answer')).join(', ')}`); // named in the timeout
      },
      30_000,
      100,
    );
    expect(views.map((v) => (v ? ServerRole[v.role] : 'no answer')).sort()).toEqual(['SERVER_ROLE_ACTIVE', 'SERVER_ROLE_STANDBY']);
    const activeIdx = views.findIndex((v) => v!.role === ServerRole.SERVER_ROLE_ACTIVE);
    const activePid = pids[activeIdx]!;
    const standbyPid = pids[1 - activeIdx]!;
    expect(FlockLease.readHolder(leaseFile(node.dirs))?.pid).toBe(activePid);
    const epoch0 = views[activeIdx]!.epoch;
    // the standby knows who holds the lease
    expect(views[1 - activeIdx]!.holderPid).toBe(activePid);
    // the active one serves the sandboxes
    let api = node.reconnect();
    expect((await api.sandboxes.getSandbox({ sandboxId: sandboxes[0]!.sandboxId })).sandbox!.pid).toBe(sandboxes[0]!.pid);

    // kill -9 the active: the standby takes over by itself
    const ticks = processStartTicks(activePid);
    process.kill(activePid, 'SIGKILL');
    await waitFor(`the killed server ${activePid} to be gone`, () => processStartTicks(activePid) !== ticks, 10_000, 10);
    const t0 = Date.now();
    const st = await waitFor(
      `standby ${standbyPid} to become ACTIVE`,
      async () => {
        const v = await adminStatus(adminOf(standbyPid), 1000);
        if (v?.role === ServerRole.SERVER_ROLE_ACTIVE) return v;
        throw new Error(`standby says ${v ? ServerRole[v.role] : 'nothing'}`); // named in the timeout
      },
      30_000,
      50,
    );
    console.log(`failover: standby ${standbyPid} ACTIVE ${Date.now() - t0} ms after kill -9 of ${activePid}; epoch ${epoch0} -> ${st.epoch}`);
    expect(st).toMatchObject({ role: ServerRole.SERVER_ROLE_ACTIVE, epoch: epoch0 + 1, holderPid: standbyPid });
    expect(FlockLease.isHeld(leaseFile(node.dirs))).toBe(true);
    expect(serverProcesses(node.dirs.runDir)).toEqual([standbyPid]);
    // adopted in place
    api = node.reconnect();
    const got = await Promise.all(sandboxes.map(async (s) => (await api.sandboxes.getSandbox({ sandboxId: s.sandboxId })).sandbox!));
    expect(got.map((s) => [s.state, s.pid])).toEqual([
      [SandboxState.SANDBOX_STATE_RUNNING, sandboxes[0]!.pid],
      [SandboxState.SANDBOX_STATE_PAUSED, sandboxes[1]!.pid],
    ]);
    expect((await execCollect(api, sandboxes[0]!.sandboxId, ['echo', 'adopted'])).stdout).toBe('adopted\n');
  });

  it('rejects CreateVm and DeleteDevice with an epoch below the current one (ABORTED, nothing changed)', async () => {
    const current = (await holderStatus(node.dirs))!.epoch;
    expect(current).toBeGreaterThan(1);
    const stale = current - 1; // the epoch of the server the standby replaced
    const vch = createSandnodeChannel(unixAddress(socketPath(node.dirs.runDir, 'vmm-supervisor')));
    const dch = createSandnodeChannel(unixAddress(socketPath(node.dirs.runDir, 'ublk-manager')));
    try {
      const before = await inventory(node.dirs);
      const staleVms = createServiceClient(VmServiceDefinition, vch, { timeoutMs: 10_000, epoch: () => stale });
      const staleDevices = createServiceClient(DeviceServiceDefinition, dch, { timeoutMs: 10_000, epoch: () => stale });
      const spec = {
        templateRootfs: path.join(node.dirs.stateDir, 'templates', 'base', 'rootfs'),
        drives: [
          { driveId: 'upper', path: '/dev/null-stale-upper', role: DriveRole.DRIVE_ROLE_ROOTFS_UPPER, readOnly: false },
          { driveId: 'workspace', path: '/dev/null-stale-ws', role: DriveRole.DRIVE_ROLE_WORKSPACE, readOnly: false },
        ],
        resources: { vcpus: 1, memoryMib: 128, diskBytes: 0 },
        poddSocketDir: path.join(node.dirs.runDir, 'stale'),
        hostname: 'stale',
        env: {},
      };
      const ws = `${sandboxes[0]!.sandboxId}-ws`;
      const createVm = await expectCode(staleVms.createVm({ vmId: 'sb-00000000000000aa', spec }), Status.ABORTED, /stale epoch/);
      const deleteDevice = await expectCode(staleDevices.deleteDevice({ deviceId: ws }), Status.ABORTED, /stale epoch/);
      const deleteVm = await expectCode(staleVms.deleteVm({ vmId: sandboxes[0]!.sandboxId }), Status.ABORTED, /stale epoch/);
      console.log(`stale epoch ${stale} (current ${current}): CreateVm -> ${createVm.details}; DeleteDevice -> ${deleteDevice.details}; DeleteVm -> ${deleteVm.details}`);

      // nothing changed: same VMs, devices, loop devices, containers; the sandbox still works
      expect(await inventory(node.dirs)).toEqual(before);
      const api = node.reconnect();
      await api.sandboxes.writeFile({ sandboxId: sandboxes[0]!.sandboxId, path: 'after-fence.txt', data: Buffer.from('ok') });
      expect((await execCollect(api, sandboxes[0]!.sandboxId, ['cat', '/workspace/after-fence.txt'])).stdout).toBe('ok');

      // the current epoch passes the fence (the call then fails or succeeds on its merits)
      const currentVms = createServiceClient(VmServiceDefinition, vch, { timeoutMs: 10_000, epoch: () => current });
      await expect(currentVms.deleteVm({ vmId: 'sb-00000000000000bb' })).resolves.toBeDefined();
    } finally {
      vch.close();
      dch.close();
    }
  });
});
