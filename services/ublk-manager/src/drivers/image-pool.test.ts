import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { createLogger } from '@sandnode/shared';
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
