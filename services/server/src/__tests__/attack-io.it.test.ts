/**
 * Attack (issue 10 §2): a runc sandbox's drives under the supervisor's I/O limits (vmm config
 * ioWriteBps etc., blkio throttles per drive). With ioWriteBps 4 MiB/s both drives of the
 * sandbox (rootfs upper and workspace, the loop devices the host mounted) carry the throttle in
 * its blkio cgroup, a direct write in /workspace goes through it and completes, and the node
 * serves meanwhile. A fork child gets the same limits on its own drives. No timing is asserted:
 * the throughput is measured by hand (see docs/security.md).
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import type { ServerApi } from '@sandnode/shared';
import { describeNode, execCollect, startNode, type TestNode } from '@sandnode/testkit';

jest.setTimeout(300_000);

const MIB = 1024 * 1024;
const WRITE_BPS = 4 * MIB;

async function run(api: ServerApi, id: string, script: string): Promise<{ exitCode: number; stdout: string; stderr: string }> {
  const r = await execCollect(api, id, ['sh', '-c', script]);
  return { exitCode: r.exitCode, stdout: r.stdout, stderr: r.stderr };
}

/** deviceAt: "major:minor" of the file system mounted at dir on the host (mountinfo field 3), undefined if none. */
function deviceAt(dir: string): string | undefined {
  let dev: string | undefined;
  for (const line of readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    const f = line.split(' ');
    if (f[4] === dir) dev = f[2];
  }
  return dev;
}

/** blkio reads one file of the sandbox's blkio cgroup (cgroup v1, cgroupsPath /sandnode/<id>). */
function blkio(id: string, file: string): string {
  return readFileSync(`/sys/fs/cgroup/blkio/sandnode/${id}/${file}`, 'utf8');
}

/** writtenTo: bytes the sandbox's cgroup wrote to dev (blkio.throttle.io_service_bytes "<dev> Write N"). */
function writtenTo(id: string, dev: string): number {
  const m = blkio(id, 'blkio.throttle.io_service_bytes').match(new RegExp(`^${dev} Write (\\d+)$`, 'm'));
  return m ? Number(m[1]) : 0;
}

describeNode('a sandbox under I/O limits (blkio throttles of its drives)', () => {
  let node: TestNode;
  let id: string;
  beforeAll(async () => {
    node = await startNode({ env: { 'vmm-supervisor': { SANDNODE_VMM_SUPERVISOR_IO_WRITE_BPS: String(WRITE_BPS) } } });
    id = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!.sandboxId;
  });
  afterAll(async () => {
    await node?.stop();
  });

  /** drivesOf: the devices of a sandbox's upper drive and workspace as the host mounted them. */
  const drivesOf = (vmId: string) => {
    const dir = path.join(node.dirs.runDir, 'vms', vmId);
    return { upper: deviceAt(path.join(dir, 'upper-dev')), workspace: deviceAt(path.join(dir, 'workspace')) };
  };

  const expectThrottled = (vmId: string) => {
    const { upper, workspace } = drivesOf(vmId);
    expect(upper).toMatch(/^\d+:\d+$/);
    expect(workspace).toMatch(/^\d+:\d+$/);
    expect(upper).not.toBe(workspace);
    const lines = blkio(vmId, 'blkio.throttle.write_bps_device').trim().split('\n').sort();
    expect(lines).toEqual([`${upper} ${WRITE_BPS}`, `${workspace} ${WRITE_BPS}`].sort());
    expect(blkio(vmId, 'blkio.throttle.read_bps_device').trim()).toBe('');
  };

  it('both drives carry the write throttle; the sandbox records vmm.io-limits.v1', async () => {
    expectThrottled(id);
    expect((await node.api.sandboxes.getSandbox({ sandboxId: id })).sandbox!.isolation).toContain('vmm.io-limits.v1');
  });

  it('a direct 8 MiB write in /workspace goes through the throttle and completes; the node serves meanwhile', async () => {
    const { workspace } = drivesOf(id);
    const before = writtenTo(id, workspace!);
    const dd = run(node.api, id, 'dd if=/dev/zero of=/workspace/big bs=1M count=8 oflag=direct 2>&1; echo rc=$?');
    // meanwhile: the server answers, and the same sandbox runs another command
    expect((await node.api.sandboxes.listSandboxes({})).sandboxes.map((s) => s.sandboxId)).toContain(id);
    expect((await run(node.api, id, 'echo ok')).stdout).toBe('ok\n');
    const r = await dd;
    expect(r.stdout).toMatch(/rc=0\s*$/);
    expect((await run(node.api, id, 'wc -c < /workspace/big')).stdout.trim()).toBe(String(8 * MIB));
    expect(writtenTo(id, workspace!) - before).toBeGreaterThanOrEqual(8 * MIB);
  });

  it('a fork child gets the limits on its own drives', async () => {
    const child = (await node.api.sandboxes.forkSandbox({ parentId: id, maxFreezeMs: 2000 })).sandbox!;
    expectThrottled(child.sandboxId);
    expect(child.isolation).toContain('vmm.io-limits.v1');
    await node.api.sandboxes.deleteSandbox({ sandboxId: child.sandboxId });
  });
});
