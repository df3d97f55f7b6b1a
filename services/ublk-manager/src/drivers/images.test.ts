import { mkdirSync, openSync, readdirSync, symlinkSync, readFileSync, statSync, writeSync, closeSync, ftruncateSync } from 'node:fs';
import path from 'node:path';
import { CommandError, InvalidArgumentError, ResourceExhaustedError, run } from '@sandnode/shared';
import { useTempDir } from '@sandnode/testkit';
import { probeReflink } from './ficlone';
import { CLONE_TEMP_RE, FileImages, type RunFn } from './images';

const MIB = 1024 * 1024;

/** makeSparse writes `data` MiB of non-zero bytes at offset 1 MiB of a sparse file of `size` MiB. */
function makeSparse(file: string, size: number, data: number): void {
  const fd = openSync(file, 'w');
  ftruncateSync(fd, size * MIB);
  writeSync(fd, Buffer.alloc(data * MIB, 0xab), 0, data * MIB, MIB);
  closeSync(fd);
}

describe('FileImages.clone (real cp on the test host)', () => {
  const tempDir = useTempDir('ublk-images');
  let dir: string;
  beforeEach(() => (dir = tempDir()));

  it('tries FICLONE once; where it is unsupported copies sparse (cp of the opened fd) and says why; no temp left', async () => {
    const calls: string[][] = [];
    const rec: RunFn = (cmd, args, opts) => {
      calls.push([cmd, ...args]);
      return run(cmd, args, opts);
    };
    const images = new FileImages(path.join(dir, 'images'), { run: rec });
    const src = path.join(dir, 'src.img');
    makeSparse(src, 64, 2);
    const a = await images.clone(src, images.imagePath('a'));
    const b = await images.clone(src, images.imagePath('b'));
    const native = (await probeReflink(images.dir)).ok && (await probeReflink(dir)).ok;
    if (a.reflinked) {
      // A file system with reflink (btrfs, XFS): every clone shares extents, no process runs.
      expect(native).toBe(true);
      expect(b.reflinked).toBe(true);
      expect(calls).toHaveLength(0);
    } else {
      // ext4/tmpfs: FICLONE fails as unsupported, then sparse copies only (never retried).
      expect(a.copyReason).toMatch(/FICLONE: (EOPNOTSUPP|EXDEV|EINVAL|ENOTTY)/);
      expect(b.reflinked).toBe(false);
      expect(calls.map((c) => c.slice(0, 3))).toEqual([
        ['cp', '--reflink=auto', '--sparse=always'],
        ['cp', '--reflink=auto', '--sparse=always'],
      ]);
      expect(calls[0]?.[4]).toMatch(new RegExp(`^/proc/${process.pid}/fd/\\d+$`));
    }
    const srcSt = statSync(src);
    expect(a.sourceAllocatedBytes).toBe(srcSt.blocks * 512);
    for (const id of ['a', 'b']) {
      const st = statSync(images.imagePath(id));
      expect(st.size).toBe(64 * MIB);
      expect(st.mode & 0o777).toBe(0o600);
      expect(st.blocks * 512).toBeLessThan(4 * MIB); // holes stay holes
      expect(readFileSync(images.imagePath(id)).equals(readFileSync(src))).toBe(true);
    }
    expect(readdirSync(images.dir).sort()).toEqual(['a.img', 'b.img']);
    expect(await images.cloneTemps()).toEqual([]);
  });

  it('a failed copy leaves neither dst nor a temp; out of space is RESOURCE_EXHAUSTED', async () => {
    const fail: RunFn = async (cmd, args) => {
      const tmp = args[args.length - 1] ?? '';
      closeSync(openSync(tmp, 'w')); // cp made the file before failing
      throw new CommandError(`${cmd} failed`, `cp: error writing '${tmp}': No space left on device`, 1);
    };
    const images = new FileImages(path.join(dir, 'images'), { run: fail });
    const src = path.join(dir, 'src.img');
    makeSparse(src, 4, 1);
    await expect(images.clone(src, images.imagePath('a'))).rejects.toBeInstanceOf(ResourceExhaustedError);
    expect(readdirSync(images.dir)).toEqual([]);
  });

  it('lists clone temps with the image they were going to become', async () => {
    const images = new FileImages(path.join(dir, 'images'));
    closeSync(openSync(path.join(images.dir, '.kid.img.clone-0a1b2c3d.tmp'), 'w'));
    closeSync(openSync(path.join(images.dir, 'kid2.img'), 'w'));
    expect(await images.cloneTemps()).toEqual([{ file: path.join(images.dir, '.kid.img.clone-0a1b2c3d.tmp'), target: images.imagePath('kid') }]);
    expect(CLONE_TEMP_RE.test('.x.img.clone-zz.tmp')).toBe(false);
  });
});

describe('FileImages.clone of a confined source (CloneDevice)', () => {
  const tempDir = useTempDir('ublk-images-confined');

  it('refuses a source that is a symbolic link or lies outside the images file system, and makes nothing', async () => {
    const dir = tempDir();
    const images = new FileImages(path.join(dir, 'images'));
    const outside = path.join(dir, 'secret');
    makeSparse(outside, 2, 1);
    symlinkSync(outside, images.imagePath('evil'));
    await expect(images.clone(images.imagePath('evil'), images.imagePath('kid'), { confined: true })).rejects.toThrow(InvalidArgumentError);
    await expect(images.clone(images.imagePath('evil'), images.imagePath('kid'), { confined: true })).rejects.toThrow(/symbolic link/);
    // a directory in the images dir is not an image either
    mkdirSync(images.imagePath('dir'));
    await expect(images.clone(images.imagePath('dir'), images.imagePath('kid'), { confined: true })).rejects.toThrow(/not a regular file/);
    expect(readdirSync(images.dir).sort()).toEqual(['dir.img', 'evil.img']);
  });
});
