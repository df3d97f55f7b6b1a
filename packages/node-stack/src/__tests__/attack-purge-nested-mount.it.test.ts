/**
 * Adversarial finding (issue 11, "`down --purge` unmounted the user's own mounts"): a mount of
 * the user *inside* one of sandnode's own mounts (a tmpfs at `<runDir>/vms/<id>/workspace/mine`,
 * inside the VM's workspace mount). purgeNode's `umount` of the workspace fails EBUSY and its
 * fallback `umount -l` detaches the whole subtree, the user's tmpfs with it (its files are
 * gone), while the report says the user's mount was "left in place". Seen on a real node with
 * `sandnode down` then `sandnode down --purge`. The user's mount must stay mounted with its
 * files (sandnode's mount above it may then stay too, and the report says so).
 */
import { spawnSync } from 'node:child_process';
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { describeWith, makeTempDir, PARTS } from '@sandnode/testkit';
import { mountsBelow, purgeNode } from '../purge';

const sh = (cmd: string, args: string[]) => {
  const r = spawnSync(cmd, args, { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')}: ${r.stderr}`);
};

describeWith('purgeNode with a mount of the user inside a mount of sandnode', [PARTS.root], () => {
  let dir: string;
  afterEach(() => {
    for (const mp of mountsBelow([dir])) spawnSync('umount', ['-l', mp]);
    rmSync(dir, { recursive: true, force: true });
  });

  it("leaves the user's mount mounted with its files, and says what it kept", async () => {
    dir = makeTempDir('purge-nested');
    const stateDir = path.join(dir, 'state');
    const runDir = path.join(dir, 'run');
    const workspace = path.join(runDir, 'vms', 'sb-0123456789abcdef', 'workspace');
    mkdirSync(stateDir, { recursive: true });
    mkdirSync(workspace, { recursive: true });
    sh('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'sandnode-like', workspace]);
    const mine = path.join(workspace, 'mine');
    mkdirSync(mine);
    sh('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'user-tmpfs', mine]);
    writeFileSync(path.join(mine, 'notes.txt'), 'the user data');

    const report = await purgeNode({ stateDir, runDir, listen: '' });

    expect(mountsBelow([dir])).toContain(mine);
    expect(readFileSync(path.join(mine, 'notes.txt'), 'utf8')).toBe('the user data');
    expect(report.kept).toEqual([{ path: runDir, why: expect.stringContaining(`${mine} is a tmpfs mount sandnode did not make`) }]);
  });
});
