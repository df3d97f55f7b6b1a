/**
 * A runc VM's pause, stop and delete start no host process (issue 11 §4: a drain's stop made 9,
 * ~8 ms of CPU each): the freezer, the signals, the unmounts and the removal of runc's state are
 * done in-process (drivers/runc-cgroup.ts, drivers/syscalls.ts), counted by the supervisor's
 * metric sandnode_vmm_host_commands_total. And the VM is as gone as `runc delete` leaves it:
 * runc does not know it, its cgroup dirs, mounts and init are gone.
 */
import { existsSync, mkdirSync, readdirSync } from 'node:fs';
import { createServer } from 'node:net';
import path from 'node:path';
import { describeWith, writeLeaseRecord } from '@sandnode/testkit';
import { isSameProcess, processState } from '@sandnode/shared';
import { DriveRole, VmState, type VmSpec } from '@sandnode/shared/proto/vmm/v1/vmm';
import { Fixture, VMM_PARTS } from './__tests__/fixture';
import { mountsUnder } from './drivers/mounts';

async function freePort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const port = (srv.address() as { port: number }).port;
  await new Promise((r) => srv.close(r));
  return port;
}

/** cgroupDirsOf lists the cgroup dirs `/sys/fs/cgroup/<hierarchy>/sandnode/<vmId>` that exist. */
function cgroupDirsOf(vmId: string): string[] {
  return readdirSync('/sys/fs/cgroup')
    .map((h) => path.join('/sys/fs/cgroup', h, 'sandnode', vmId))
    .filter((d) => existsSync(d));
}

describeWith('runc VM stop: no host process per step (integration)', VMM_PARTS, () => {
  let fx: Fixture;
  let client: ReturnType<Fixture['client']>;
  let metrics = '';
  let spec: (id: string) => VmSpec;

  /** commands is sandnode_vmm_host_commands_total by command, scraped from the daemon. */
  const commands = async (): Promise<Record<string, number>> => {
    const text = await (await fetch(`http://${metrics}/metrics`)).text();
    const out: Record<string, number> = {};
    for (const m of text.matchAll(/^sandnode_vmm_host_commands_total\{command="([^"]*)"\} (\S+)$/gm)) out[m[1]!] = Number(m[2]);
    return out;
  };
  /** startedBy is what step started: the commands whose count rose (command -> how many). */
  const startedBy = async (step: () => Promise<unknown>): Promise<Record<string, number>> => {
    const before = await commands();
    await step();
    const after = await commands();
    return Object.fromEntries(Object.entries(after).flatMap(([k, v]) => (v > (before[k] ?? 0) ? [[k, v - (before[k] ?? 0)]] : [])));
  };

  beforeAll(async () => {
    fx = new Fixture();
    writeLeaseRecord(fx.stateDir, 1);
    fx.buildRootfs();
    spec = (id) => {
      const poddDir = path.join(fx.runDir, 'sandboxes', id);
      mkdirSync(poddDir, { recursive: true });
      return {
        templateRootfs: fx.rootfs,
        drives: [
          { driveId: 'upper', path: fx.makeExt4Loop(`${id}-upper`), role: DriveRole.DRIVE_ROLE_ROOTFS_UPPER, readOnly: false },
          { driveId: 'ws', path: fx.makeExt4Loop(`${id}-ws`), role: DriveRole.DRIVE_ROLE_WORKSPACE, readOnly: false },
        ],
        resources: { vcpus: 1, memoryMib: 128, diskBytes: 0, pids: 0 },
        poddSocketDir: poddDir,
        hostname: id,
        env: {},
        machineId: '',
        network: undefined,
      };
    };
    metrics = `127.0.0.1:${await freePort()}`;
    await fx.start({ SANDNODE_VMM_SUPERVISOR_METRICS_LISTEN: metrics });
    client = fx.client();
  });

  afterAll(async () => {
    await fx?.cleanup();
  });

  /** expectGone checks that vmId is as gone as `runc delete` leaves it, and its init (pid, ticks) too. */
  const expectGone = (vmId: string, pid: number, ticks: number) => {
    expect(JSON.parse(fx.runc(['list', '--format', 'json'])) ?? []).not.toContainEqual(expect.objectContaining({ id: vmId }));
    expect(existsSync(path.join(fx.runcRoot, vmId))).toBe(false);
    expect(cgroupDirsOf(vmId)).toEqual([]);
    expect(mountsUnder(path.join(fx.runDir, 'vms', vmId))).toEqual([]);
    expect(mountsUnder(path.join(fx.runDir, 'vm-tmpfs', vmId))).toEqual([]);
    expect(isSameProcess(pid, ticks) && processState(pid) !== 'Z').toBe(false);
  };

  test('the drain path: pause, then delete of the paused VM (SIGKILL to its frozen tasks, thaw, unmounts, runc state)', async () => {
    const { vm } = await client.createVm({ vmId: 'cost-a', spec: spec('cost-a') });
    expect(cgroupDirsOf('cost-a').length).toBeGreaterThan(0);
    expect(await startedBy(() => client.pauseVm({ vmId: 'cost-a' }))).toEqual({});
    // runc agrees that it is paused
    expect((JSON.parse(fx.runc(['state', 'cost-a'])) as { status: string }).status).toBe('paused');
    expect((await client.getVm({ vmId: 'cost-a' })).vm?.state).toBe(VmState.VM_STATE_PAUSED);
    expect(await startedBy(() => client.deleteVm({ vmId: 'cost-a' }))).toEqual({});
    expectGone('cost-a', vm!.pid, Number(vm!.startTimeTicks));
  });

  test('pause and resume as runc sees them; delete of a running VM (SIGTERM to its verified init)', async () => {
    const { vm } = await client.createVm({ vmId: 'cost-b', spec: spec('cost-b') });
    expect(await startedBy(() => client.pauseVm({ vmId: 'cost-b' }))).toEqual({});
    expect(await startedBy(() => client.resumeVm({ vmId: 'cost-b' }))).toEqual({});
    expect((JSON.parse(fx.runc(['state', 'cost-b'])) as { status: string }).status).toBe('running');
    // the init traps TERM and exits 0: no SIGKILL needed
    expect(await startedBy(() => client.deleteVm({ vmId: 'cost-b' }))).toEqual({});
    expectGone('cost-b', vm!.pid, Number(vm!.startTimeTicks));
  });
});
