/**
 * FileImages: the image files behind devices, `<imagesDir>/<deviceId>.img`. Empty images
 * are sparse files (ftruncate); ext4 is made with mkfs.ext4 with lazy inode-table and journal
 * init (fast on any size); clones use `cp --reflink=auto --sparse=always` (copy-on-write where
 * the file system can, sparse always) into a temp name, fsynced and renamed (see
 * {@link FileImages.clone} for how `reflinked` is learnt). Every made or removed file is
 * fsynced with its directory before the call returns. Out of space maps to
 * ResourceExhaustedError.
 */
import { randomBytes } from 'node:crypto';
import { constants as fsc, mkdirSync, realpathSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { CommandError, InvalidArgumentError, NotFoundError, ResourceExhaustedError, run, type RunResult } from '@sandnode/shared';
import type { CloneResult, ImageOps, SourceImageInfo } from '../core/driver';
import { failpoint } from '../core/failpoints';

/** Time mkfs.ext4 may take, in ms (config mkfsTimeoutMs). */
export const DEFAULT_MKFS_TIMEOUT_MS = 120_000;
/** Time a clone (cp) may take, in ms (config cloneTimeoutMs). */
export const DEFAULT_CLONE_TIMEOUT_MS = 600_000;

/** A function with the shape of shared `run` (tests pass a fake). */
export type RunFn = (cmd: string, args: string[], opts?: { timeoutMs?: number; signal?: AbortSignal }) => Promise<RunResult>;

/**
 * cp(1) --reflink=always fails like this when the file system has no FICLONE
 * (ioctl_ficlone(2): EOPNOTSUPP / EINVAL / EXDEV / ENOTTY): then reflink is not tried again.
 */
const NO_REFLINK_RE = /Operation not supported|Invalid argument|Invalid cross-device link|Inappropriate ioctl|not supported/i;

/** Suffix of the temp name a clone is written under: `.<name>.clone-<random>.tmp` in the same dir. */
export const CLONE_TEMP_RE = /^\.(.+)\.clone-[0-9a-f]+\.tmp$/;

const NO_SPACE_RE = /No space left on device|Disk quota exceeded|ENOSPC|EDQUOT/i;

/** isNoSpace says whether err is an out-of-space failure of a file call or a host command. */
export function isNoSpace(err: unknown): boolean {
  const code = (err as NodeJS.ErrnoException | undefined)?.code;
  if (code === 'ENOSPC' || code === 'EDQUOT') return true;
  if (err instanceof CommandError) return NO_SPACE_RE.test(err.stderr) || NO_SPACE_RE.test(err.message);
  return false;
}

/**
 * noSpace maps out-of-space failures to ResourceExhaustedError (a short message: the command's
 * stderr stays in `cause`, for the log) and passes others through.
 */
function noSpace(err: unknown, what: string): unknown {
  if (!isNoSpace(err)) return err;
  return Object.assign(new ResourceExhaustedError(`${what}: no disk space left on the images file system`), { cause: err });
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
  /**
   * Whether the images dir's file system has FICLONE: undefined until the first clone tried
   * `cp --reflink=always`, then true (it worked) or false (it failed as "not supported").
   */
  private reflink: boolean | undefined;

  private readonly mkfsTimeoutMs: number;
  private readonly cloneTimeoutMs: number;

  /**
   * The directory is created if missing. mkfsTimeoutMs / cloneTimeoutMs bound one mkfs.ext4 /
   * cp, in ms (config mkfsTimeoutMs / cloneTimeoutMs; default DEFAULT_MKFS_TIMEOUT_MS /
   * DEFAULT_CLONE_TIMEOUT_MS).
   */
  constructor(dir: string, opts: { run?: RunFn; mkfsTimeoutMs?: number; cloneTimeoutMs?: number } = {}) {
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    this.dir = realpathSync(dir);
    this.run = opts.run ?? run;
    this.mkfsTimeoutMs = opts.mkfsTimeoutMs ?? DEFAULT_MKFS_TIMEOUT_MS;
    this.cloneTimeoutMs = opts.cloneTimeoutMs ?? DEFAULT_CLONE_TIMEOUT_MS;
  }

  /** cloneTempPath is `<dir of dst>/.<basename of dst>.clone-<8 random hex>.tmp` (a new name per call). */
  cloneTempPath(dst: string): string {
    return path.join(path.dirname(dst), `.${path.basename(dst)}.clone-${randomBytes(4).toString('hex')}.tmp`);
  }

  /**
   * cloneTemps lists the clone temp files in the images dir as `{ file, target }` (target =
   * the image the clone was going to be renamed to). Used at start to remove the leftovers of
   * a clone interrupted by a crash.
   */
  async cloneTemps(): Promise<{ file: string; target: string }[]> {
    const out: { file: string; target: string }[] = [];
    for (const name of await fs.readdir(this.dir)) {
      const m = CLONE_TEMP_RE.exec(name);
      if (m?.[1]) out.push({ file: path.join(this.dir, name), target: path.join(this.dir, m[1]) });
    }
    return out;
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
      await this.run('mkfs.ext4', ['-q', '-F', '-E', 'lazy_itable_init=1,lazy_journal_init=1', file], { timeoutMs: this.mkfsTimeoutMs });
    } catch (err) {
      throw noSpace(err, `mkfs.ext4 ${file}`);
    }
  }

  /**
   * clone makes dst a copy of src: cp(1) writes `cloneTempPath(dst)`, which is fsynced,
   * renamed to dst, and the directory fsynced; src is only read. How extents are copied:
   * - while the images dir is not known to lack reflink, `cp --reflink=always` first: it
   *   shares every extent with the FICLONE ioctl (ioctl_ficlone(2); btrfs, XFS with reflink,
   *   bcachefs) or fails without copying anything. If it fails as "not supported" (ext4,
   *   tmpfs, ...) the dir is remembered as lacking reflink and not asked again (one failed cp,
   *   a few ms, on the first clone of the process);
   * - else `cp --reflink=auto --sparse=always`: the allocated ranges are copied, holes stay
   *   holes (cp finds them with SEEK_DATA/SEEK_HOLE).
   * So `reflinked` is true only when FICLONE really shared the extents. Returns the times and
   * the source's allocated bytes (st_blocks * 512, read before the copy). On failure the temp
   * file is removed and dst is never created; ResourceExhaustedError when the disk is full.
   * opts.signal cancels the copy (cp is killed; the temp file removed).
   */
  async clone(src: string, dst: string, opts: { signal?: AbortSignal } = {}): Promise<CloneResult> {
    const tmp = this.cloneTempPath(dst);
    try {
      const st = await fs.stat(src);
      const t0 = performance.now();
      let reflinked = false;
      if (this.reflink !== false) {
        try {
          await this.cp(['--reflink=always', '--', src, tmp], opts.signal);
          reflinked = true;
          this.reflink = true;
        } catch (err) {
          await fs.rm(tmp, { force: true });
          if (err instanceof CommandError && NO_REFLINK_RE.test(err.stderr)) this.reflink = false;
          else if (isNoSpace(err)) throw err;
        }
      }
      if (!reflinked) await this.cp(['--reflink=auto', '--sparse=always', '--', src, tmp], opts.signal);
      const copyMs = performance.now() - t0;
      const t1 = performance.now();
      const fh = await fs.open(tmp, fsc.O_RDWR);
      try {
        await fh.chmod(0o600);
        await fh.sync();
      } finally {
        await fh.close();
      }
      failpoint('ublk.clone.after-copy');
      await fs.rename(tmp, dst);
      await fsyncPath(path.dirname(dst), fsc.O_RDONLY | fsc.O_DIRECTORY);
      return { reflinked, copyMs, syncMs: performance.now() - t1, sourceAllocatedBytes: st.blocks * 512 };
    } catch (err) {
      await fs.rm(tmp, { force: true }).catch(() => undefined);
      throw noSpace(err, `clone ${src} to ${dst}`);
    }
  }

  private async cp(args: string[], signal: AbortSignal | undefined): Promise<void> {
    await this.run('cp', args, { timeoutMs: this.cloneTimeoutMs, signal });
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
