/**
 * Unmounts in-process (umount2(2) through syscalls.ts; no umount process, so none is counted in
 * sandnode_vmm_host_commands_total): stacked mounts, a busy mount retried until it is free, a
 * symlink never followed.
 */
import { closeSync, mkdirSync, openSync, symlinkSync } from 'node:fs';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { describeWith, PARTS, useTempDir } from '@sandnode/testkit';
import { hostCommands } from '../metrics';
import { mountsUnder, unmountAllIfMounted, unmountIfMounted } from './mounts';

const tmp = useTempDir('mounts');

/** hostProcesses is how many host processes sandnode_vmm_host_commands_total counted so far in this process. */
async function hostProcesses(): Promise<number> {
  return (await hostCommands.get()).values.reduce((a, v) => a + v.value, 0);
}

/** tmpfsAt mounts a small tmpfs at dir (made first). */
function tmpfsAt(dir: string): void {
  mkdirSync(dir, { recursive: true });
  execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'tmpfs', dir]);
}

describeWith('unmount in-process', [PARTS.root], () => {
  afterEach(() => {
    // a failed test leaves no mount behind
    for (const m of mountsUnder(tmp()).sort((a, b) => b.length - a.length)) execFileSync('umount', ['-l', m]);
  });

  it('unmounts every layer stacked on each dir, in order, and starts no process', async () => {
    const a = path.join(tmp(), 'a');
    const b = path.join(tmp(), 'b');
    tmpfsAt(a);
    tmpfsAt(a);
    tmpfsAt(b);
    tmpfsAt(path.join(b, 'inner'));
    const before = await hostProcesses();
    await unmountAllIfMounted([path.join(b, 'inner'), b, a, path.join(tmp(), 'not-mounted')]);
    expect(mountsUnder(tmp())).toEqual([]);
    expect(await hostProcesses()).toBe(before);
  });

  it('retries a busy mount until it is free', async () => {
    const a = path.join(tmp(), 'a');
    tmpfsAt(a);
    const fd = openSync(path.join(a, 'open-file'), 'w');
    setTimeout(() => closeSync(fd), 300);
    await unmountIfMounted(a);
    expect(mountsUnder(tmp())).toEqual([]);
  });

  it('never follows a symlink to a mount point: the mount stays', async () => {
    const a = path.join(tmp(), 'a');
    tmpfsAt(a);
    symlinkSync(a, path.join(tmp(), 'link'));
    await unmountAllIfMounted([path.join(tmp(), 'link')]);
    await unmountIfMounted(path.join(tmp(), 'link'));
    expect(mountsUnder(tmp())).toEqual([a]);
  });
});
