/**
 * `down --purge` on the real mount table (root, no daemons): a tmpfs the user mounted below
 * the state dir survives with its files, a mount in sandnode's own place (a VM's rootfs) is
 * unmounted, and the report says which dir was left and why. And on a real node whose daemons
 * stopped with a sandbox running: every mount and loop device the node made is taken as its own.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { describeNode, describeWith, makeTempDir, PARTS, startNode, type TestNode } from '@sandnode/testkit';
import { COMPONENTS } from './components';
import { stopComponent } from './stack';
import { loopDevicesBelow, mountsBelow, purgeNode } from './purge';

const sh = (cmd: string, args: string[]) => {
  const r = spawnSync(cmd, args, { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')}: ${r.stderr}`);
};

describeWith('purgeNode with a mount of the user below the state dir', [PARTS.root], () => {
  let dir: string;
  afterEach(() => {
    // unmount whatever the test left mounted before the temp dir is removed (never rm into a mount)
    for (const mp of mountsBelow([dir])) spawnSync('umount', ['-l', mp]);
    rmSync(dir, { recursive: true, force: true });
  });

  it("leaves the user's tmpfs mounted with its files, unmounts sandnode's own, removes the rest and says what it kept", async () => {
    dir = makeTempDir('purge');
    const stateDir = path.join(dir, 'state');
    const runDir = path.join(dir, 'run');
    const mine = path.join(stateDir, 'mine');
    const vmRootfs = path.join(runDir, 'vms', 'vm-a', 'rootfs');
    for (const d of [mine, vmRootfs, path.join(stateDir, 'images')]) mkdirSync(d, { recursive: true });
    writeFileSync(path.join(stateDir, 'records.db'), 'x');
    writeFileSync(path.join(stateDir, 'images', 'sb-1-ws.img'), 'x');
    sh('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'user-tmpfs', mine]);
    writeFileSync(path.join(mine, 'notes.txt'), 'the user data');
    sh('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'sandnode-like', vmRootfs]);

    const report = await purgeNode({ stateDir, runDir, listen: '' });

    expect(mountsBelow([dir])).toEqual([mine]);
    expect(readFileSync(path.join(mine, 'notes.txt'), 'utf8')).toBe('the user data');
    expect(report).toMatchObject({ mounts: [vmRootfs], dirs: [runDir], kept: [{ path: stateDir, why: expect.stringContaining(`${mine} is a tmpfs mount sandnode did not make`) }] });
    expect(existsSync(runDir)).toBe(false);
    expect(existsSync(path.join(stateDir, 'records.db'))).toBe(false);
    expect(existsSync(path.join(stateDir, 'images'))).toBe(false);
  });
});

describeNode('purgeNode after the daemons of a node with a running sandbox stopped', () => {
  let node: TestNode | undefined;
  afterEach(async () => {
    await node?.stop();
  });

  it('removes every mount, loop device and dir the node made, and keeps nothing', async () => {
    node = await startNode();
    const sb = await node.api.sandboxes.createSandbox({ template: 'base' });
    expect(sb.sandbox?.sandboxId).toBeTruthy();
    const { runDir, stateDir } = node.dirs;
    expect(mountsBelow([runDir, stateDir]).length).toBeGreaterThanOrEqual(3);
    for (const c of [...COMPONENTS].reverse()) await stopComponent(node.dirs, c);
    const report = await purgeNode(node.dirs);
    expect(report.kept).toEqual([]);
    expect(report.mounts.length).toBeGreaterThanOrEqual(3);
    expect(report.containers).toHaveLength(1);
    expect(mountsBelow([runDir, stateDir])).toEqual([]);
    expect(loopDevicesBelow(stateDir)).toEqual([]);
    expect(existsSync(runDir) || existsSync(stateDir)).toBe(false);
  });
});
