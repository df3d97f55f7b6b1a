import { mkdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { CommandError, createLogger, FailedPreconditionError, ResourceExhaustedError } from '@sandnode/shared';
import { makeTempDir } from '@sandnode/testkit';
import { findMount, LoopDriver, unescapeMountinfo } from './loop';
import type { RunFn } from './images';

/** A fake sysfs/procfs tree in a temp dir. */
class FakeHost {
  readonly root = makeTempDir('ublk-loop');
  readonly sys = path.join(this.root, 'sys');
  readonly proc = path.join(this.root, 'proc');
  constructor() {
    mkdirSync(path.join(this.sys, 'block'), { recursive: true });
    mkdirSync(path.join(this.proc, 'self'), { recursive: true });
    writeFileSync(path.join(this.proc, 'self', 'mountinfo'), '');
  }
  loop(n: number, backing: string | undefined, opts: { ro?: boolean; dio?: boolean; holders?: string[] } = {}): void {
    const blk = path.join(this.sys, 'block', `loop${n}`);
    mkdirSync(path.join(blk, 'holders'), { recursive: true });
    writeFileSync(path.join(blk, 'dev'), `7:${n}\n`);
    writeFileSync(path.join(blk, 'ro'), opts.ro ? '1\n' : '0\n');
    for (const h of opts.holders ?? []) mkdirSync(path.join(blk, 'holders', h));
    if (backing !== undefined) {
      mkdirSync(path.join(blk, 'loop'), { recursive: true });
      writeFileSync(path.join(blk, 'loop', 'backing_file'), `${backing}\n`);
      writeFileSync(path.join(blk, 'loop', 'dio'), opts.dio ? '1\n' : '0\n');
    }
  }
  unbind(n: number): void {
    rmSync(path.join(this.sys, 'block', `loop${n}`, 'loop'), { recursive: true, force: true });
  }
  cleanup(): void {
    rmSync(this.root, { recursive: true, force: true });
  }
}

const log = createLogger('test', '0', 'silent');

describe('LoopDriver (fake sysfs)', () => {
  let host: FakeHost;
  beforeEach(() => (host = new FakeHost()));
  afterEach(() => host.cleanup());

  it('lists only devices backed directly by files in the images dir, in device order', async () => {
    host.loop(10, '/images/b.img', { dio: true });
    host.loop(2, '/images/a.img (deleted)', { ro: true });
    host.loop(3, '/other/c.img');
    host.loop(4, '/images/sub/d.img');
    host.loop(5, undefined);
    const d = new LoopDriver({ directIo: true, log, sysfsRoot: host.sys, procRoot: host.proc, devRoot: `${host.sys}/no-dev` });
    expect(await d.listAttached('/images')).toEqual([
      { path: '/dev/loop2', backingFile: '/images/a.img', readOnly: true, flags: [] },
      { path: '/dev/loop10', backingFile: '/images/b.img', readOnly: false, flags: ['direct-io'] },
    ]);
  });

  it('lookup reads one device node directly; undefined when unbound, absent or not a loop device', async () => {
    host.loop(7, '/images/a.img', { dio: true });
    host.loop(8, '/images/b.img (deleted)', { ro: true });
    host.loop(9, undefined);
    const d = new LoopDriver({ directIo: true, log, sysfsRoot: host.sys, procRoot: host.proc, devRoot: `${host.sys}/no-dev` });
    expect(await d.lookup('/dev/loop7')).toEqual({ path: '/dev/loop7', backingFile: '/images/a.img', readOnly: false, flags: ['direct-io'] });
    expect(await d.lookup('/dev/loop8')).toEqual({ path: '/dev/loop8', backingFile: '/images/b.img', readOnly: true, flags: [] });
    expect(await d.lookup('/dev/loop9')).toBeUndefined();
    expect(await d.lookup('/dev/loop10')).toBeUndefined();
    expect(await d.lookup('/dev/sda')).toBeUndefined();
  });

  it('quiesce syncs without spawning a process (no blockdev)', async () => {
    const run: RunFn = async (cmd) => {
      throw new Error(`unexpected command ${cmd}`);
    };
    const d = new LoopDriver({ directIo: false, log, run, sysfsRoot: host.sys, procRoot: host.proc, devRoot: `${host.sys}/no-dev` });
    // /dev/loop999999 does not exist here: the fsync of the device node fails with the fs error.
    await expect(d.quiesce({ path: '/dev/loop999999', backingFile: '/images/a.img', readOnly: false, flags: [] })).rejects.toMatchObject({ code: 'ENOENT' });
    await expect(d.quiesce({ path: '/dev/sda', backingFile: '/images/a.img', readOnly: false, flags: [] })).rejects.toThrow(/not a loop device/);
  });

  it('attaches with --direct-io=on and reads the result from sysfs', async () => {
    const calls: string[][] = [];
    const run: RunFn = async (_cmd, args) => {
      calls.push(args);
      host.loop(0, '/images/a.img', { dio: true, ro: true });
      return { stdout: '/dev/loop0\n', stderr: '' };
    };
    const d = new LoopDriver({ directIo: true, log, run, sysfsRoot: host.sys, procRoot: host.proc, devRoot: `${host.sys}/no-dev` });
    expect(await d.attach('/images/a.img', { readOnly: true })).toEqual({ path: '/dev/loop0', backingFile: '/images/a.img', readOnly: true, flags: ['direct-io'] });
    expect(calls).toEqual([['--find', '--show', '--sector-size=512', '--read-only', '--direct-io=on', '/images/a.img']]);
  });

  it('falls back to buffered I/O when losetup refuses direct I/O, detaching a half-made device', async () => {
    const calls: string[][] = [];
    const run: RunFn = async (_cmd, args) => {
      calls.push(args);
      if (args.includes('--direct-io=on')) {
        host.loop(1, '/images/a.img'); // set up, then failed to switch on direct I/O
        throw new CommandError('losetup: set direct io failed', 'losetup: /dev/loop1: set direct io failed: Invalid argument', 1);
      }
      if (args[0] === '-d') {
        host.unbind(1);
        return { stdout: '', stderr: '' };
      }
      host.loop(2, '/images/a.img');
      return { stdout: '/dev/loop2\n', stderr: '' };
    };
    const d = new LoopDriver({ directIo: true, log, run, sysfsRoot: host.sys, procRoot: host.proc, devRoot: `${host.sys}/no-dev` });
    expect(await d.attach('/images/a.img', { readOnly: false })).toEqual({ path: '/dev/loop2', backingFile: '/images/a.img', readOnly: false, flags: [] });
    expect(calls).toEqual([
      ['--find', '--show', '--sector-size=512', '--direct-io=on', '/images/a.img'],
      ['-d', '/dev/loop1'],
      ['--find', '--show', '--sector-size=512', '/images/a.img'],
    ]);
  });

  it('maps "no free loop device" to RESOURCE_EXHAUSTED without retrying', async () => {
    let n = 0;
    const run: RunFn = async () => {
      n++;
      throw new CommandError('losetup: cannot find an unused loop device', 'losetup: could not find any free loop device', 1);
    };
    const d = new LoopDriver({ directIo: true, log, run, sysfsRoot: host.sys, procRoot: host.proc, devRoot: `${host.sys}/no-dev` });
    await expect(d.attach('/images/a.img', { readOnly: false })).rejects.toBeInstanceOf(ResourceExhaustedError);
    expect(n).toBe(1);
  });

  it('detach tolerates a device that is already gone, and refuses non-loop paths', async () => {
    const run: RunFn = async () => {
      throw new CommandError('losetup -d: No such device or address', 'No such device or address', 1);
    };
    const d = new LoopDriver({ directIo: false, log, run, sysfsRoot: host.sys, procRoot: host.proc, devRoot: `${host.sys}/no-dev` });
    await expect(d.detach('/dev/loop3')).resolves.toBeUndefined();
    await expect(d.detach('/dev/sda')).rejects.toThrow(/not a loop device/);
    host.loop(3, '/images/a.img');
    await expect(d.detach('/dev/loop3')).rejects.toBeInstanceOf(CommandError);
  });

  it('busyReason names holders and mounts in any mount namespace', async () => {
    host.loop(1, '/images/a.img', { holders: ['dm-0'] });
    host.loop(2, '/images/b.img');
    host.loop(3, '/images/c.img');
    const d = new LoopDriver({ directIo: false, log, sysfsRoot: host.sys, procRoot: host.proc, devRoot: `${host.sys}/no-dev` });
    expect(await d.busyReason('/dev/loop1')).toBe('held by dm-0');
    writeFileSync(path.join(host.proc, 'self', 'mountinfo'), '36 25 7:2 / /mnt/my\\040disk rw,relatime shared:1 - ext4 /dev/loop2 rw\n');
    expect(await d.busyReason('/dev/loop2')).toBe('mounted at /mnt/my disk');
    mkdirSync(path.join(host.proc, '4242'));
    writeFileSync(path.join(host.proc, '4242', 'mountinfo'), '40 30 7:3 / /sandbox/root rw - ext4 /dev/loop3 rw\n');
    expect(await d.busyReason('/dev/loop3')).toBeUndefined(); // no ns link: not a process we can see
  });

  it('checkAvailable names a missing /dev/loop-control', async () => {
    const d = new LoopDriver({ directIo: false, log, loopControl: path.join(host.root, 'loop-control') });
    const err = await d.checkAvailable().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(FailedPreconditionError);
    expect((err as Error).message).toContain('loop-control is missing');
  });
});

describe('mountinfo parsing', () => {
  it('finds a mount by major:minor and decodes escapes', () => {
    const text = '22 1 8:1 / / rw - ext4 /dev/vda rw\n36 25 7:0 / /a\\011b rw - ext4 /dev/loop0 rw\n';
    expect(findMount(text, new Set(['7:0']))).toBe('/a\tb');
    expect(findMount(text, new Set(['7:9']))).toBeUndefined();
    expect(unescapeMountinfo('x\\134y')).toBe('x\\y');
  });
});

describe('LoopDriver backing files seen through another mount namespace', () => {
  it('maps /images/<name> to the images dir file when the backing inode is that file', async () => {
    const root = makeTempDir('ublk-loopns');
    try {
      const images = path.join(root, 'images');
      mkdirSync(images);
      writeFileSync(path.join(images, 'sb-a-ws.img'), 'x');
      const st = statSync(path.join(images, 'sb-a-ws.img'));
      const sys = path.join(root, 'sys');
      for (const [n, backing] of [
        ['loop5', '/images/sb-a-ws.img'],
        ['loop6', '/images/sb-a-ws.img'],
      ] as const) {
        mkdirSync(path.join(sys, 'block', n, 'loop'), { recursive: true });
        writeFileSync(path.join(sys, 'block', n, 'loop', 'backing_file'), `${backing}\n`);
        writeFileSync(path.join(sys, 'block', n, 'ro'), '0\n');
      }
      const major = Math.floor(st.dev / 256) & 0xfff;
      const minor = (st.dev & 0xff) | (Math.floor(st.dev / 4096) & 0xfff00);
      const d = new LoopDriver({
        directIo: true,
        log,
        sysfsRoot: sys,
        procRoot: path.join(root, 'proc'),
        devRoot: path.join(root, 'dev'),
        imagesDir: images,
        // loop5 is our file; loop6 is another file of the same name in some other namespace
        backingInode: (dev) => (dev === '/dev/loop5' ? { ino: st.ino, major, minor } : { ino: st.ino + 1, major, minor }),
      });
      expect((await d.lookup('/dev/loop5'))?.backingFile).toBe(path.join(images, 'sb-a-ws.img'));
      expect((await d.lookup('/dev/loop6'))?.backingFile).toBe('/images/sb-a-ws.img');
      expect((await d.listAttached(images)).map((x) => x.path)).toEqual(['/dev/loop5']);
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  });
});
