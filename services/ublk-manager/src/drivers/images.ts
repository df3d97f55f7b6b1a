/**
 * FileImages: the image files behind devices, `<imagesDir>/<deviceId>.img`. Empty images
 * are sparse files (ftruncate); ext4 is made with mkfs.ext4 with lazy inode-table and journal
 * init (fast on any size); clones use `cp --reflink=auto --sparse=always` (copy-on-write where
 * the file system can, sparse always). Every made or removed file is fsynced with its
 * directory before the call returns. Out of space maps to ResourceExhaustedError.
 */
import { constants as fsc, mkdirSync, realpathSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { CommandError, InvalidArgumentError, NotFoundError, ResourceExhaustedError, run, type RunResult } from '@sandnode/shared';
import type { ImageOps, SourceImageInfo } from '../core/driver';

/** Time mkfs.ext4 may take, in ms. */
export const DEFAULT_MKFS_TIMEOUT_MS = 120_000;
/** Time a clone (cp) may take, in ms. */
export const DEFAULT_CLONE_TIMEOUT_MS = 600_000;

/** A function with the shape of shared `run` (tests pass a fake). */
export type RunFn = (cmd: string, args: string[], opts?: { timeoutMs?: number }) => Promise<RunResult>;

const NO_SPACE_RE = /No space left on device|Disk quota exceeded|ENOSPC|EDQUOT/i;

/** isNoSpace says whether err is an out-of-space failure of a file call or a host command. */
export function isNoSpace(err: unknown): boolean {
  const code = (err as NodeJS.ErrnoException | undefined)?.code;
  if (code === 'ENOSPC' || code === 'EDQUOT') return true;
  if (err instanceof CommandError) return NO_SPACE_RE.test(err.stderr) || NO_SPACE_RE.test(err.message);
  return false;
}

/** noSpace maps out-of-space failures to ResourceExhaustedError and passes others through. */
function noSpace(err: unknown, what: string): unknown {
  return isNoSpace(err) ? new ResourceExhaustedError(`${what}: no disk space left: ${(err as Error).message}`) : err;
}

async function fsyncPath(p: string, flags: number): Promise<void> {
  const fh = await fs.open(p, flags);
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

/** FileImages implements ImageOps on a directory of the host. */
export class FileImages implements ImageOps {
  /** The images directory, absolute with symlinks resolved (as the kernel reports backing files). */
  readonly dir: string;
  private readonly run: RunFn;

  /** The directory is created if missing. */
  constructor(dir: string, opts: { run?: RunFn } = {}) {
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    this.dir = realpathSync(dir);
    this.run = opts.run ?? run;
  }

  /** imagePath is `<dir>/<deviceId>.img`. */
  imagePath(deviceId: string): string {
    return path.join(this.dir, `${deviceId}.img`);
  }

  /** exists says whether file exists (without following a final symlink). */
  async exists(file: string): Promise<boolean> {
    try {
      await fs.lstat(file);
      return true;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return false;
      throw err;
    }
  }

  /** inspectSource: NotFoundError when missing, InvalidArgumentError unless a regular file. */
  async inspectSource(file: string): Promise<SourceImageInfo> {
    let st;
    try {
      st = await fs.stat(file);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === 'ENOENT' || code === 'ENOTDIR') throw new NotFoundError(`source_image: ${file} does not exist`);
      throw err;
    }
    if (!st.isFile()) throw new InvalidArgumentError(`source_image: ${file} is not a regular file`);
    return { sizeBytes: st.size };
  }

  /** createEmpty makes a sparse file of sizeBytes (fails if it exists), fsynced with its dir. */
  async createEmpty(file: string, sizeBytes: number): Promise<void> {
    try {
      const fh = await fs.open(file, fsc.O_CREAT | fsc.O_EXCL | fsc.O_RDWR, 0o600);
      try {
        await fh.truncate(sizeBytes);
        await fh.sync();
      } finally {
        await fh.close();
      }
      await fsyncPath(path.dirname(file), fsc.O_RDONLY | fsc.O_DIRECTORY);
    } catch (err) {
      throw noSpace(err, `create ${file}`);
    }
  }

  /** formatExt4 runs `mkfs.ext4 -q -F -E lazy_itable_init=1,lazy_journal_init=1 file`. */
  async formatExt4(file: string): Promise<void> {
    try {
      await this.run('mkfs.ext4', ['-q', '-F', '-E', 'lazy_itable_init=1,lazy_journal_init=1', file], { timeoutMs: DEFAULT_MKFS_TIMEOUT_MS });
    } catch (err) {
      throw noSpace(err, `mkfs.ext4 ${file}`);
    }
  }

  /** clone runs `cp --reflink=auto --sparse=always src dst`, then fsyncs dst and its dir. */
  async clone(src: string, dst: string): Promise<void> {
    try {
      await this.run('cp', ['--reflink=auto', '--sparse=always', '--', src, dst], { timeoutMs: DEFAULT_CLONE_TIMEOUT_MS });
      await fs.chmod(dst, 0o600);
      await fsyncPath(dst, fsc.O_RDWR);
      await fsyncPath(path.dirname(dst), fsc.O_RDONLY | fsc.O_DIRECTORY);
    } catch (err) {
      throw noSpace(err, `clone ${src} to ${dst}`);
    }
  }

  /** remove unlinks file and fsyncs its dir; false when it did not exist. */
  async remove(file: string): Promise<boolean> {
    try {
      await fs.unlink(file);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return false;
      throw err;
    }
    await fsyncPath(path.dirname(file), fsc.O_RDONLY | fsc.O_DIRECTORY);
    return true;
  }
}
