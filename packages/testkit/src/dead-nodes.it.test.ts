/**
 * The nodes of a killed test run (dead-nodes.ts): a real test node whose owner is made a dead
 * process, with a running sandbox (runc container, loop devices, mounts) and its three daemons,
 * is stopped and purged by sweepDeadTestNodes, leaving nothing; a node of a live owner, a planted
 * root whose run dir is a symlink elsewhere and a root of another uid are left alone.
 */
import { spawnSync } from 'node:child_process';
import { chownSync, existsSync, mkdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { loopDevicesBelow, mountsBelow, sandnodeProcesses } from '@sandnode/node-stack';
import { processStartTicks } from '@sandnode/shared';
import { OWNER_FILE, readOwner, sweepDeadTestNodes, TEST_NODE_PREFIX } from './dead-nodes';
import { describeNode, startNode, type TestNode } from './node-fixture';
import { passableTempDir } from './temp-dir';

jest.setTimeout(240_000);

/** a pid and start ticks of a process that has exited */
function deadOwner(): { pid: number; ticks: number } {
  const r = spawnSync('sh', ['-c', 'echo $$; cat /proc/$$/stat'], { encoding: 'utf8' });
  const [pid, stat] = r.stdout.split('\n');
  const ticks = Number(stat!.split(') ')[1]!.split(' ')[19]);
  expect(processStartTicks(Number(pid))).not.toBe(ticks);
  return { pid: Number(pid), ticks };
}

describeNode('sweep of the test nodes of a killed run', () => {
  let node: TestNode | undefined;
  const planted: string[] = [];

  afterAll(async () => {
    if (node && existsSync(path.dirname(node.dirs.runDir))) await node.stop();
    for (const p of planted) rmSync(p, { recursive: true, force: true });
  });

  it('a node whose owner died is stopped and purged: no daemon, container, loop device, mount or dir is left', async () => {
    node = await startNode();
    const root = path.dirname(node.dirs.runDir);
    const id = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!.sandboxId;
    expect(id).toMatch(/^sb-/);
    expect(readOwner(root)).toMatchObject({ pid: process.pid });
    expect(sandnodeProcesses(node.dirs.runDir)).toHaveLength(3);
    expect(loopDevicesBelow(root).length).toBeGreaterThan(0);
    expect(mountsBelow([root]).length).toBeGreaterThan(0);
    // a live owner: left alone
    expect(await sweepDeadTestNodes()).not.toContain(root);
    expect(sandnodeProcesses(node.dirs.runDir)).toHaveLength(3);

    // the jest process that made it is gone (as after kill -9 of the test run)
    writeFileSync(path.join(root, OWNER_FILE), JSON.stringify({ ...deadOwner(), tag: '' }));
    node.api.close();
    expect(await sweepDeadTestNodes()).toContain(root);
    expect(sandnodeProcesses(node.dirs.runDir)).toEqual([]);
    expect(loopDevicesBelow(root)).toEqual([]);
    expect(mountsBelow([root])).toEqual([]);
    expect(existsSync(root)).toBe(false);
    const runc = spawnSync('runc', ['list', '--format', 'json'], { encoding: 'utf8' }).stdout;
    expect(runc).not.toContain(id);
  });

  it('a planted root (run dir a symlink to a victim dir, or a root of another uid) is not touched', async () => {
    const victim = passableTempDir('sandnode-victim-');
    planted.push(victim);
    writeFileSync(path.join(victim, 'keep'), 'mine');
    const evil = passableTempDir(TEST_NODE_PREFIX);
    planted.push(evil);
    mkdirSync(path.join(evil, 'state'), { mode: 0o700 });
    symlinkSync(victim, path.join(evil, 'run'));
    writeFileSync(path.join(evil, OWNER_FILE), JSON.stringify({ ...deadOwner(), tag: '' }), { mode: 0o600 });
    const other = passableTempDir(TEST_NODE_PREFIX);
    planted.push(other);
    mkdirSync(path.join(other, 'state'));
    mkdirSync(path.join(other, 'run'));
    writeFileSync(path.join(other, OWNER_FILE), JSON.stringify({ ...deadOwner(), tag: '' }), { mode: 0o600 });
    chownSync(other, 65534, 65534);

    const swept = await sweepDeadTestNodes(os.tmpdir());
    expect(swept).not.toContain(evil);
    expect(swept).not.toContain(other);
    expect(readFileSync(path.join(victim, 'keep'), 'utf8')).toBe('mine');
    expect(existsSync(evil) && existsSync(other)).toBe(true);
  });
});
