import { existsSync, mkdirSync, mkdtempSync, statSync, truncateSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { createLogger, ResourceExhaustedError } from '@sandnode/shared';
import { useTempDir } from '@sandnode/testkit';
import { ImagePool, mountAt } from './image-pool';

const INFO = [
  '22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw',
  '90 22 7:3 / /s/images rw,noatime shared:50 - xfs /dev/loop3 rw,attr2',
  '91 22 7:4 / /s/with\\040space rw shared:51 - ext4 /dev/loop4 rw',
].join('\n');

describe('mountAt (mountinfo)', () => {
  it('finds the mount at a dir with its major:minor and type, decoding octal escapes; undefined when not a mount point', () => {
    expect(mountAt(INFO, '/s/images')).toEqual({ majmin: '7:3', fstype: 'xfs' });
    expect(mountAt(INFO, '/s/with space')).toEqual({ majmin: '7:4', fstype: 'ext4' });
    expect(mountAt(INFO, '/s')).toBeUndefined();
  });

  it('takes the last of stacked mounts (the one a path resolves to)', () => {
    expect(mountAt(`${INFO}\n99 90 7:9 / /s/images rw shared:60 - xfs /dev/loop9 rw`, '/s/images')).toEqual({ majmin: '7:9', fstype: 'xfs' });
  });
});

describe('ImagePool.setup without a pool', () => {
  const tempDir = useTempDir('ublk-pool-unit');
  const log = createLogger('ublk-manager', 'test', 'silent');

  it('imagePool off on a file system without reflink: mode none, the reason names FICLONE and the key; no host command runs', async () => {
    const dir = tempDir();
    const calls: string[] = [];
    const pool = new ImagePool({
      imagesDir: path.join(dir, 'images'),
      poolDir: path.join(dir, 'pool'),
      enabled: false,
      log,
      run: async (cmd) => {
        calls.push(cmd);
        return { stdout: '', stderr: '' };
      },
    });
    const st = await pool.setup();
    // the test host's tmp is ext4 or tmpfs (no reflink); on XFS/btrfs it is "native"
    if (st.mode === 'native') return;
    expect(st).toEqual({ mode: 'none', reason: expect.stringMatching(/no reflink \(FICLONE: E[A-Z]+\) and imagePool is off/) });
    expect(calls).toEqual([]);
    await expect(pool.ensureFree(1 << 30)).resolves.toBeUndefined();
  });

  it('images made without the pool: no pool is made over them (mode none, says why)', async () => {
    const dir = tempDir();
    mkdirSync(path.join(dir, 'images'));
    writeFileSync(path.join(dir, 'images', 'old.img'), '');
    const calls: string[] = [];
    const pool = new ImagePool({
      imagesDir: path.join(dir, 'images'),
      poolDir: path.join(dir, 'pool'),
      enabled: true,
      log,
      run: async (cmd) => {
        calls.push(cmd);
        return { stdout: '', stderr: '' };
      },
    });
    const st = await pool.setup();
    if (st.mode === 'native') return;
    expect(st.reason).toMatch(/holds 1 file\(s\) made without it/);
    expect(calls).toEqual([]);
    expect(existsSync(pool.file)).toBe(false);
  });
});

describe('ImagePool.ensureFree and the host file system under the pool file', () => {
  const tempDir = useTempDir('ublk-pool-host');
  const log = createLogger('ublk-manager', 'test', 'silent');
  const GIB = 2 ** 30;

  /** poolIn makes a pool in mode "pool" over a fake sysfs (loop7 backs the pool file), a sparse pool file of 1 GiB, and the given free bytes for the host and the pool. */
  function poolIn(free: { host: number; pool: number }, extra: { maxBytes?: number } = {}) {
    const dir = mkdtempSync(path.join(tempDir(), 'p-'));
    const poolDir = path.join(dir, 'pool');
    const sys = path.join(dir, 'sys');
    mkdirSync(poolDir);
    mkdirSync(path.join(sys, 'block', 'loop7', 'loop'), { recursive: true });
    const calls: string[] = [];
    const pool = new ImagePool({
      imagesDir: path.join(dir, 'images'),
      poolDir,
      enabled: true,
      minFreeBytes: 2 * GIB,
      hostMinFreeBytes: GIB,
      initialBytes: GIB,
      maxBytes: extra.maxBytes ?? 64 * GIB,
      sysfsRoot: sys,
      log,
      run: async (cmd, args) => {
        calls.push(`${cmd} ${args.join(' ')}`);
        return { stdout: '', stderr: '' };
      },
      freeBytes: async (p) => (p === poolDir ? free.host : free.pool),
    });
    writeFileSync(pool.file, '');
    truncateSync(pool.file, GIB); // sparse: ~0 bytes allocated
    writeFileSync(path.join(sys, 'block', 'loop7', 'loop', 'backing_file'), `${pool.file}\n`);
    writeFileSync(path.join(sys, 'block', 'loop7', 'dev'), '7:7\n');
    // as setup() leaves it after making the pool
    Object.assign(pool, { status: { mode: 'pool', reason: 'made' }, dir: path.join(dir, 'images') });
    return { pool, calls };
  }

  it('refuses an image while the host has less than imagePoolHostMinFreeBytes free (RESOURCE_EXHAUSTED naming the dir and the figures); nothing grows', async () => {
    const { pool, calls } = poolIn({ host: 512 * 2 ** 20, pool: 10 * GIB });
    await expect(pool.ensureFree()).rejects.toThrow(ResourceExhaustedError);
    await expect(pool.ensureFree()).rejects.toThrow(/host file system under the image pool \(.*\/pool\) has 512 MiB free, below imagePoolHostMinFreeBytes \(1024 MiB\)/);
    expect(calls).toEqual([]);
    expect(statSync(pool.file).size).toBe(GIB);
  });

  it('grows a full pool only as far as the host can back it (allocated + host free - reserve), not to double', async () => {
    // the sparse 1 GiB file holds ~nothing; the host has 1.2 GiB free and keeps 1 GiB: 0.2 GiB backed, below its size
    const short = poolIn({ host: 1.2 * GIB, pool: 0 });
    await expect(short.pool.ensureFree(0.1 * GIB)).rejects.toThrow(/cannot back a larger one \(1228 MiB free, imagePoolHostMinFreeBytes 1024 MiB\)/);
    expect(short.calls).toEqual([]);
    expect(statSync(short.pool.file).size).toBe(GIB);

    // host 2.5 GiB free: 1.5 GiB backed; the growth rule alone would make 4 GiB (1 + 1 asked + 2 min free)
    const roomy = poolIn({ host: 2.5 * GIB, pool: 0 });
    await roomy.pool.ensureFree(GIB);
    const allocated = statSync(roomy.pool.file).blocks * 512;
    expect(statSync(roomy.pool.file).size).toBe(Math.floor((allocated + 1.5 * GIB) / 2 ** 20) * 2 ** 20);
    expect(roomy.calls).toEqual(['losetup -c /dev/loop7', `xfs_growfs -d ${path.join(path.dirname(path.dirname(roomy.pool.file)), 'images')}`]);
  });

  it('with a roomy host, grows to at least double as before, and says "largest size" only at imagePoolMaxBytes', async () => {
    const { pool } = poolIn({ host: 100 * GIB, pool: 0 });
    await pool.ensureFree();
    expect(statSync(pool.file).size).toBe(3 * GIB); // max(2 x 1 GiB, 1 GiB + 0 + 2 GiB min free)
    const capped = poolIn({ host: 100 * GIB, pool: 0 }, { maxBytes: GIB });
    await expect(capped.pool.ensureFree(GIB / 2)).rejects.toThrow(/at its largest size \(imagePoolMaxBytes/);
  });
});
