/**
 * Mounts and unmounts in-process (mount(2) and umount2(2) through syscalls.ts; no mount or umount
 * process, so none is counted in sandnode_vmm_host_commands_total): mount(8)'s options split into
 * the same flags and data, the kernel's refusals mapped to InternalError naming the errno with
 * nothing mounted; stacked mounts, a busy mount retried until it is free, a symlink never
 * followed; unmount chains (a destroy's): the chains at once (a busy one holds only its own),
 * each in its order (an overlay before the mount its upper dir lies on), no mountinfo read of
 * their own.
 */
import { closeSync, mkdirSync, openSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { InternalError } from '@sandnode/shared';
import { describeWith, PARTS, useTempDir } from '@sandnode/testkit';
import { hostCommands } from '../metrics';
import { isMountPoint, mount, mountArgs, mountinfoReadCount, mountOptions, mountsUnder, mountTable, unmountAllIfMounted, unmountChains, unmountIfMounted } from './mounts';

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

/** superOptions are the superblock options (after the " - type source" fields of mountinfo) of the top mount at dir. */
function superOptions(dir: string): string[] {
  let opts: string[] = [];
  for (const line of readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    const [a, b] = line.split(' - ');
    if (a?.split(' ')[4] === dir && b) opts = (b.split(' ')[2] ?? '').split(',');
  }
  return opts;
}

describe('mountArgs', () => {
  it('turns the flag options into MS_* flags and keeps the rest, in order, as the data string', () => {
    expect(mountArgs(['noatime', 'nosuid', 'nodev'])).toEqual({ flags: 1024 | 2 | 4, data: null });
    expect(mountArgs(['size=1024', 'mode=0700', 'uid=0', 'gid=0', 'nosuid', 'nodev', 'noexec'])).toEqual({ flags: 2 | 4 | 8, data: 'size=1024,mode=0700,uid=0,gid=0' });
    expect(mountArgs(['lowerdir=/a', 'upperdir=/b/upper', 'workdir=/b/work'])).toEqual({ flags: 0, data: 'lowerdir=/a,upperdir=/b/upper,workdir=/b/work' });
    expect(mountArgs(['ro', 'noatime'])).toEqual({ flags: 1 | 1024, data: null });
    expect(mountArgs(['ro', 'rw'])).toEqual({ flags: 0, data: null }); // the later one wins, as in mount(8)
    expect(mountArgs([])).toEqual({ flags: 0, data: null });
  });
});

describeWith('mount in-process', [PARTS.root], () => {
  afterEach(() => {
    for (const m of mountsUnder(tmp()).sort((a, b) => b.length - a.length)) execFileSync('umount', ['-l', m]);
  });

  it('mounts with the flags and data mount(8) would pass, and starts no process', async () => {
    const a = path.join(tmp(), 'a');
    mkdirSync(a);
    const before = await hostProcesses();
    await mount('tmpfs', a, 'tmpfs', ['size=1048576', 'mode=0710', 'nosuid', 'nodev', 'noexec', 'noatime']);
    expect(await hostProcesses()).toBe(before);
    expect(mountOptions(a)).toEqual(expect.arrayContaining(['rw', 'nosuid', 'nodev', 'noexec', 'noatime']));
    expect(superOptions(a)).toEqual(expect.arrayContaining(['size=1024k', 'mode=710']));
  });

  it('mounts read-only: a write fails with EROFS', async () => {
    const a = path.join(tmp(), 'a');
    mkdirSync(a);
    await mount('tmpfs', a, 'tmpfs', ['ro', 'size=65536']);
    expect(mountOptions(a)).toContain('ro');
    expect(() => writeFileSync(path.join(a, 'f'), 'x')).toThrow(/EROFS/);
  });

  it.each([
    ['a missing target', 'tmpfs', 'missing', 'tmpfs', [], /ENOENT/],
    ['an unknown filesystem type', 'x', 'a', 'no-such-fs', [], /ENODEV/],
    ['a source that is no block device', 'file', 'a', 'ext4', [], /ENOTBLK/],
    ['bad filesystem data', 'tmpfs', 'a', 'tmpfs', ['size=banana'], /EINVAL/],
  ])('%s: InternalError naming the errno, nothing mounted', async (_what, source, target, type, options, re) => {
    mkdirSync(path.join(tmp(), 'a'));
    writeFileSync(path.join(tmp(), 'file'), '');
    const src = source === 'file' ? path.join(tmp(), 'file') : source;
    const err = await mount(src, path.join(tmp(), target), type, options as string[]).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(InternalError);
    expect((err as Error).message).toMatch(re);
    expect(mountsUnder(tmp())).toEqual([]);
  });
});

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

  it('unmount chains: each in its order (overlay, then its upper dir), every layer, and no mountinfo read', async () => {
    const lower = path.join(tmp(), 'lower');
    const upperDev = path.join(tmp(), 'upper-dev');
    const rootfs = path.join(tmp(), 'rootfs');
    const ws = path.join(tmp(), 'ws');
    mkdirSync(lower, { recursive: true });
    tmpfsAt(upperDev);
    mkdirSync(path.join(upperDev, 'upper'));
    mkdirSync(path.join(upperDev, 'work'));
    mkdirSync(rootfs);
    execFileSync('mount', ['-t', 'overlay', '-o', `lowerdir=${lower},upperdir=${upperDev}/upper,workdir=${upperDev}/work`, 'overlay', rootfs]);
    tmpfsAt(ws);
    tmpfsAt(ws);
    const table = mountTable();
    const reads = mountinfoReadCount();
    const before = await hostProcesses();
    await unmountChains([[rootfs, upperDev], [ws], [path.join(tmp(), 'not-mounted')]], table);
    expect(mountinfoReadCount()).toBe(reads);
    expect(mountsUnder(tmp())).toEqual([]);
    expect(await hostProcesses()).toBe(before);
  });

  it('unmount chains run at once: a busy mount holds only its own chain, then fails it after the others ended', async () => {
    const a = path.join(tmp(), 'a');
    const b = path.join(tmp(), 'b');
    tmpfsAt(a);
    tmpfsAt(b);
    const fd = openSync(path.join(a, 'open-file'), 'w');
    const done = unmountChains([[a], [b]], mountTable());
    // b is unmounted while a is still busy
    while (isMountPoint(b)) await new Promise((r) => setTimeout(r, 20));
    expect(isMountPoint(a)).toBe(true);
    closeSync(fd);
    await done;
    expect(mountsUnder(tmp())).toEqual([]);
  });

  it('unmount chains: a mount that stays busy fails with the dir named, after the other chains ended', async () => {
    const a = path.join(tmp(), 'a');
    const b = path.join(tmp(), 'b');
    tmpfsAt(a);
    tmpfsAt(b);
    const fd = openSync(path.join(a, 'open-file'), 'w');
    try {
      await expect(unmountChains([[a], [b]], mountTable())).rejects.toThrow(`umount ${a}: still busy`);
      expect(mountsUnder(tmp())).toEqual([a]);
    } finally {
      closeSync(fd);
    }
  });
});
