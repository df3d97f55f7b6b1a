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
import { closeSync, constants as fsc, fstatSync, fsyncSync, mkdirSync, openSync, realpathSync, statSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { CommandError, InvalidArgumentError, NotFoundError, ResourceExhaustedError, run, type Logger, type RunResult } from '@sandnode/shared';
import type { CloneResult, ImageOps, SourceImageInfo } from '../core/driver';
import { failpoint } from '../core/failpoints';
import { ficlone } from './ficlone';
import type { ImagePool } from './image-pool';
import { EmptyExt4Images } from './empty-images';

/** Time mkfs.ext4 may take, in ms (config mkfsTimeoutMs). */
export const DEFAULT_MKFS_TIMEOUT_MS = 120_000;
/** Time a clone (cp) may take, in ms (config cloneTimeoutMs). */
export const DEFAULT_CLONE_TIMEOUT_MS = 600_000;

/** A function with the shape of shared `run` (tests pass a fake). */
export type RunFn = (cmd: string, args: string[], opts?: { timeoutMs?: number; signal?: AbortSignal }) => Promise<RunResult>;

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
   * Why the images dir's file system cannot share extents (FICLONE failed as "not supported",
   * or the pool said so at start); undefined while FICLONE is worth trying.
   */
  private noReflink: string | undefined;
  /** The image pool (drivers/image-pool.ts), when one was set up: grown before images are made. */
  private readonly pool: Pick<ImagePool, 'ensureFree'> | undefined;
  /** The empty ext4 templates (undefined: config emptyImageTemplates off). */
  readonly templates: EmptyExt4Images | undefined;

  private readonly mkfsTimeoutMs: number;
  private readonly cloneTimeoutMs: number;

  /**
   * The directory is created if missing. mkfsTimeoutMs / cloneTimeoutMs bound one mkfs.ext4 /
   * cp, in ms (config mkfsTimeoutMs / cloneTimeoutMs; default DEFAULT_MKFS_TIMEOUT_MS /
   * DEFAULT_CLONE_TIMEOUT_MS).
   */
  constructor(dir: string, opts: { run?: RunFn; mkfsTimeoutMs?: number; cloneTimeoutMs?: number; pool?: Pick<ImagePool, 'ensureFree'>; noReflink?: string; templates?: boolean; log?: Logger } = {}) {
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    this.dir = realpathSync(dir);
    this.run = opts.run ?? run;
    this.mkfsTimeoutMs = opts.mkfsTimeoutMs ?? DEFAULT_MKFS_TIMEOUT_MS;
    this.cloneTimeoutMs = opts.cloneTimeoutMs ?? DEFAULT_CLONE_TIMEOUT_MS;
    this.pool = opts.pool;
    this.noReflink = opts.noReflink;
    this.templates = opts.templates && opts.log ? new EmptyExt4Images(this, this.run, opts.log) : undefined;
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
      await this.pool?.ensureFree(0);
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

  /**
   * createExt4 makes file an empty ext4 image of sizeBytes (see ImageOps.createExt4): a FICLONE
   * of the empty template of that size (EmptyExt4Images) while the images file system has
   * reflink and templates are on, else createEmpty + formatExt4. A template that cannot be
   * made or cloned falls back to mkfs (logged); out of space is ResourceExhaustedError.
   */
  async createExt4(file: string, sizeBytes: number): Promise<{ method: 'template' | 'mkfs'; reason: string }> {
    let reason = this.noReflink ?? (this.templates ? '' : 'empty ext4 templates are off (config emptyImageTemplates)');
    if (this.templates && this.noReflink === undefined) {
      try {
        const r = await this.templates.cloneInto(file, sizeBytes);
        if (r.reflinked) return { method: 'template', reason: '' };
        reason = r.copyReason;
        await this.remove(file);
      } catch (err) {
        if (isNoSpace(err) || err instanceof ResourceExhaustedError) throw err;
        reason = `the empty ext4 template failed: ${(err as Error).message}`;
        await fs.rm(file, { force: true });
      }
    }
    await this.createEmpty(file, sizeBytes);
    await this.formatExt4(file);
    return { method: 'mkfs', reason };
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
   * clone makes dst a copy of src: the copy is written to `cloneTempPath(dst)` (made with
   * O_EXCL, never through a symlink), fsynced, renamed to dst, and the directory fsynced; src
   * is only read, through one fd opened at the start (opts.confined: O_NOFOLLOW, and it must
   * be a regular file on the images dir's file system, else InvalidArgumentError, nothing
   * made). How extents are copied:
   * - while the images dir is not known to lack reflink, the FICLONE ioctl
   *   (ioctl_ficlone(2), {@link ficlone}; XFS with reflink, btrfs, bcachefs): every extent is
   *   shared, O(1) in the data size. When it fails as "not supported" (EOPNOTSUPP, EXDEV,
   *   EINVAL, ENOTTY: ext4, tmpfs, another file system) the dir is remembered as lacking
   *   reflink (a cross-file-system source only for that call);
   * - else `cp --reflink=auto --sparse=always` of the opened fd (`/proc/<pid>/fd/<n>`, so cp
   *   reads the very file that was checked): the allocated ranges are copied, holes stay
   *   holes (SEEK_DATA/SEEK_HOLE).
   * Returns reflinked (FICLONE shared the extents), copyReason (why it copied), the times
   * (ms) and the source's allocated bytes (st_blocks * 512, before the copy). On failure the
   * temp file is removed and dst is never created; ResourceExhaustedError when the disk (or
   * the image pool at its largest) is full. opts.signal cancels the copy (cp is killed).
   */
  async clone(src: string, dst: string, opts: { signal?: AbortSignal; confined?: boolean } = {}): Promise<CloneResult> {
    const tmp = this.cloneTempPath(dst);
    let srcFd: number;
    try {
      srcFd = openSync(src, fsc.O_RDONLY | (opts.confined ? fsc.O_NOFOLLOW : 0));
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === 'ELOOP') throw new InvalidArgumentError(`clone source ${src} is a symbolic link; an image is never followed through a link (nothing made)`);
      if (code === 'ENOENT') throw new NotFoundError(`clone source ${src} does not exist`);
      throw err;
    }
    let dstFd: number | undefined;
    try {
      const st = fstatSync(srcFd);
      if (!st.isFile()) throw new InvalidArgumentError(`clone source ${src} is not a regular file (nothing made)`);
      if (opts.confined && st.dev !== this.dirDev()) throw new InvalidArgumentError(`clone source ${src} is not on the images file system of ${this.dir} (nothing made)`);
      await this.pool?.ensureFree(0);
      const t0 = performance.now();
      dstFd = openSync(tmp, fsc.O_CREAT | fsc.O_EXCL | fsc.O_RDWR | fsc.O_NOFOLLOW, 0o600);
      let reflinked = false;
      let copyReason = this.noReflink ?? '';
      if (this.noReflink === undefined) {
        const r = await ficlone(dstFd, srcFd);
        if (r.ok) reflinked = true;
        else if (r.unsupported) {
          if (r.name === 'EXDEV') copyReason = 'the source is on another file system than the images (FICLONE: EXDEV)';
          else copyReason = this.noReflink = `the images file system has no reflink (FICLONE: ${r.name})`;
        } else if (r.name === 'ENOSPC' || r.name === 'EDQUOT') {
          throw Object.assign(new Error(`FICLONE: ${r.name}`), { code: r.name });
        } else copyReason = `FICLONE failed (${r.name})`;
      }
      if (!reflinked) await this.cp(['--reflink=auto', '--sparse=always', '--', `/proc/${process.pid}/fd/${srcFd}`, tmp], opts.signal);
      const copyMs = performance.now() - t0;
      const t1 = performance.now();
      // cp replaced the inode only if it unlinked it, which it does not for a regular target: sync through our fd
      fsyncSync(dstFd);
      failpoint('ublk.clone.after-copy');
      await fs.rename(tmp, dst);
      await fsyncPath(path.dirname(dst), fsc.O_RDONLY | fsc.O_DIRECTORY);
      return { reflinked, copyReason: reflinked ? '' : copyReason, copyMs, syncMs: performance.now() - t1, sourceAllocatedBytes: st.blocks * 512 };
    } catch (err) {
      await fs.rm(tmp, { force: true }).catch(() => undefined);
      throw noSpace(err, `clone ${src} to ${dst}`);
    } finally {
      closeSync(srcFd);
      if (dstFd !== undefined) closeSync(dstFd);
    }
  }

  /** dirDev is st_dev of the images dir (read once per call: a pool mounted later changes it). */
  private dirDev(): number {
    return statSync(this.dir).dev;
  }

  /** reflinkReason: '' while reflink is not known to be missing, else why clones copy. */
  get copyReason(): string {
    return this.noReflink ?? '';
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
