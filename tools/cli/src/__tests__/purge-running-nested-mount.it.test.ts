/**
 * Issue 11 finding 10, with the daemons running: `down --purge` deletes every sandbox through
 * the API first. A mount of the user inside a sandbox's workspace mount
 * (`<runDir>/vms/<id>/workspace/mine`) made the supervisor delete the container and then fail
 * its unmounts (an opaque INTERNAL, the sandbox left DELETING without its container). Now the
 * supervisor refuses to destroy the VM before it deletes anything and the purge fails naming
 * the mount: the user's mount keeps its files, the container is still there (the server's
 * teardown stops it before the destroy), no daemon is stopped, and once the user unmounted it
 * the next purge deletes the sandbox.
 */
import { spawnSync } from 'node:child_process';
import { mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { findRunning } from '@sandnode/node-stack';
import { describeNode, startNode, type TestNode } from '@sandnode/testkit';

jest.setTimeout(240_000);

describeNode('down --purge with a mount of the user inside a running sandbox', () => {
  let node: TestNode;
  let mine = '';
  beforeAll(async () => {
    node = await startNode();
  });
  afterAll(async () => {
    if (mine) spawnSync('umount', [mine]);
    await node?.stop();
  });

  it('fails naming the mount, and deletes neither the container nor the mounts, nor stops a daemon', async () => {
    const s = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    const vmsDir = path.join(node.dirs.runDir, 'vms');
    const [vmId] = readdirSync(vmsDir);
    mine = path.join(vmsDir, vmId!, 'workspace', 'mine');
    mkdirSync(mine);
    const mount = spawnSync('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'user-tmpfs', mine], { encoding: 'utf8' });
    expect(mount.stderr).toBe('');
    writeFileSync(path.join(mine, 'notes.txt'), 'the user data');

    const r = node.cli(['down', '--purge']);
    expect(r.status).not.toBe(0);
    expect(r.stderr).toContain(`could not delete 1 of 1 sandboxes, so nothing was stopped or purged: ${s.sandboxId}: `);
    expect(r.stderr).toContain(`${mine} is mounted below`);
    expect(readFileSync(path.join(mine, 'notes.txt'), 'utf8')).toBe('the user data');
    const runc = spawnSync('runc', ['--root', path.join(node.dirs.runDir, 'runc'), 'state', vmId!], { encoding: 'utf8' });
    // the server's teardown stops the VM before it destroys it: stopped, not deleted
    expect(['running', 'stopped']).toContain(JSON.parse(runc.stdout || '{}').status);
    expect(['vmm-supervisor', 'ublk-manager', 'server'].map((c) => !!findRunning(node.dirs, c as 'server'))).toEqual([true, true, true]);

    // once the user unmounted it, the purge deletes the sandbox
    expect(spawnSync('umount', [mine]).status).toBe(0);
    mine = '';
    const again = node.cli(['down', '--purge', '--json']);
    expect(again.stderr).toBe('');
    expect(JSON.parse(again.stdout).deleted).toEqual([s.sandboxId]);
  });
});
