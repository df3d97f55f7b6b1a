/**
 * Integration: the real vmm-supervisor daemon (dist/main.js) with the firecracker driver.
 * Needs root, a `firecracker` binary in PATH, /dev/kvm, a guest kernel
 * (SANDNODE_TEST_FC_KERNEL, an uncompressed vmlinux) and a template rootfs image
 * (SANDNODE_TEST_FC_ROOTFS, ext4); skips with a message naming what is missing (CI provides
 * none of these but root, so under CI=true it still skips; a CI without root fails).
 * Build first: `npx tsc -b services/vmm-supervisor/tsconfig.build.json`.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, statSync } from 'node:fs';
import path from 'node:path';
import { isSameProcess, processState } from '@sandnode/shared';
import { DriveRole, VmState } from '@sandnode/shared/proto/vmm/v1/vmm';
import type { VmSpec } from '@sandnode/shared/proto/vmm/v1/vmm';
import { built, describeWith, PARTS, type Part } from '@sandnode/testkit';
import { Fixture } from './__tests__/fixture';

const kernel = process.env.SANDNODE_TEST_FC_KERNEL ?? '';
const rootfsImage = process.env.SANDNODE_TEST_FC_ROOTFS ?? '';
/** What this suite needs; CI provides none of it but root and the build. */
const FC_PARTS: Part[] = [
  PARTS.root,
  PARTS.e2fsprogs,
  PARTS.firecracker,
  { name: '/dev/kvm', present: () => existsSync('/dev/kvm'), ciProvides: false },
  { name: 'a kernel image (SANDNODE_TEST_FC_KERNEL=/path/to/vmlinux)', present: () => kernel !== '' && existsSync(kernel), ciProvides: false },
  { name: 'a rootfs image (SANDNODE_TEST_FC_ROOTFS=/path/to/rootfs.ext4)', present: () => rootfsImage !== '' && existsSync(rootfsImage), ciProvides: false },
  built('@sandnode/vmm-supervisor'),
];

function alive(pid: number, ticks: number): boolean {
  return isSameProcess(pid, ticks) && processState(pid) !== 'Z';
}

describeWith('vmm-supervisor firecracker driver (integration)', FC_PARTS, () => {
  let fx: Fixture;
  let spec: VmSpec;
  const env = () => ({ SANDNODE_VMM_SUPERVISOR_DRIVER: 'firecracker', SANDNODE_VMM_SUPERVISOR_KERNEL_IMAGE: kernel });

  beforeAll(() => {
    fx = new Fixture();
    const upper = path.join(fx.dir, 'upper.ext4');
    execFileSync('truncate', ['-s', '64M', upper]);
    execFileSync('mkfs.ext4', ['-q', '-F', upper]);
    spec = {
      templateRootfs: rootfsImage,
      drives: [{ driveId: 'upper', path: upper, role: DriveRole.DRIVE_ROLE_ROOTFS_UPPER, readOnly: false }],
      resources: { vcpus: 1, memoryMib: 128, diskBytes: 0, pids: 0 },
      poddSocketDir: path.join(fx.runDir, 'sandboxes', 'fc-a'),
      hostname: '',
      env: {},
      machineId: '',
      network: undefined,
    };
  });

  afterAll(async () => {
    try {
      const client = fx.client(1_000_000);
      for (const vm of (await client.listVms({})).vms) await client.deleteVm({ vmId: vm.vmId });
    } catch {
      /* best effort */
    }
    await fx?.cleanup();
  });

  test('create, pause/resume, survive kill -9 of the supervisor, adopt, delete', async () => {
    const daemon = await fx.start(env());
    const client = fx.client(1);
    const { vm } = await client.createVm({ vmId: 'fc-a', spec });
    expect(vm?.state).toBe(VmState.VM_STATE_RUNNING);
    expect(vm?.driver).toBe('firecracker');
    const apiSocket = path.join(fx.runDir, 'vms', 'fc-a', 'fc.sock');
    expect(vm?.apiSocket).toBe(apiSocket);
    expect(statSync(apiSocket).isSocket()).toBe(true);
    const pid = vm!.pid;
    const ticks = vm!.startTimeTicks;
    expect(alive(pid, ticks)).toBe(true);
    expect(readdirSync(path.join(fx.stateDir, 'vmm-supervisor', 'bin'))[0]).toMatch(/^firecracker-/);

    expect((await client.pauseVm({ vmId: 'fc-a' })).vm?.state).toBe(VmState.VM_STATE_PAUSED);
    expect((await client.getVm({ vmId: 'fc-a' })).vm?.state).toBe(VmState.VM_STATE_PAUSED);
    expect((await client.resumeVm({ vmId: 'fc-a' })).vm?.state).toBe(VmState.VM_STATE_RUNNING);

    await daemon.kill('SIGKILL');
    expect(alive(pid, ticks)).toBe(true);
    await fx.start(env());
    const adopted = await client.getVm({ vmId: 'fc-a' });
    expect(adopted.vm?.state).toBe(VmState.VM_STATE_RUNNING);
    expect(adopted.vm?.pid).toBe(pid);

    expect((await client.deleteVm({ vmId: 'fc-a' })).existed).toBe(true);
    expect(alive(pid, ticks)).toBe(false);
    expect(existsSync(path.join(fx.runDir, 'vms', 'fc-a'))).toBe(false);
  });
});
