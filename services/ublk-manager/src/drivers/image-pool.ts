/**
 * ImagePool: a file system with reflink for the images dir when the host's has none.
 *
 * When a FICLONE probe in the images dir fails (ext4, tmpfs), the pool is an XFS file system
 * (`mkfs.xfs -m reflink=1`) in a sparse file `<stateDir>/ublk-manager/pool/images.xfs`,
 * attached as a loop device and mounted ON the images dir: every image path stays
 * `<imagesDir>/<id>.img`, so the rows, the loop-device safety rules (a row names only
 * `<imagesDir>/<id>.img`; only devices backed directly in the images dir are ever listed) and
 * adoption are unchanged, and the pool's own loop device (backed in the state dir) is never
 * one of the manager's devices.
 *
 * Start ({@link ImagePool.setup}, under the pool lock, which both A/B slots take):
 *   images dir mounted from the pool's loop device -> reused;
 *   pool file attached to a loop device but not mounted -> that loop device is mounted;
 *   pool file present, not attached -> attached and mounted (XFS replays its log);
 *   no pool file -> made (temp name, mkfs.xfs, fsync, rename), attached, mounted; only when
 *   the images dir is empty: images made before the pool are not hidden under a mount (the
 *   manager then clones by copy and says why).
 * The mount and the loop device outlive the manager (as the devices do): a kill -9 and a
 * restart find them and reuse them, nothing is attached twice.
 *
 * Growth ({@link ImagePool.ensureFree}, before every image made, and every checkMs): when the
 * pool has less than minFreeBytes (+ what the caller needs) free, its file is made larger
 * (sparse: ftruncate; at least doubled, at most maxBytes), `losetup -c` tells the loop device,
 * `xfs_growfs` the file system.
 *
 * The host's file system under the pool file: the file is sparse, so the pool can promise more
 * than the host has; a full host fails the loop device's writes, and XFS inside shuts down under
 * every sandbox at once. So the pool never grows past what the host can back (its allocated
 * bytes + the host's free bytes - hostMinFreeBytes), and no image is made or cloned while the
 * host has less than hostMinFreeBytes free (RESOURCE_EXHAUSTED naming the file system).
 */
import { randomBytes } from 'node:crypto';
import { closeSync, constants as fsc, fsyncSync, mkdirSync, openSync, readdirSync, readFileSync, realpathSync, renameSync, rmSync, statSync, chmodSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { InternalError, ResourceExhaustedError, run, type Logger } from '@sandnode/shared';
import { lockSlot } from '../store/locks';
import { probeReflink } from './ficlone';
import type { RunFn } from './images';
import { unescapeMountinfo } from './loop';

/** Size of a new pool file, bytes (config imagePoolInitialBytes; sparse: ~65 MiB allocated after mkfs per GiB... see README). */
export const DEFAULT_POOL_INITIAL_BYTES = 16 * 2 ** 30;
/** Largest the pool grows to, bytes (config imagePoolMaxBytes). */
export const DEFAULT_POOL_MAX_BYTES = 512 * 2 ** 30;
/** The pool grows when less than this is free, bytes (config imagePoolMinFreeBytes). */
export const DEFAULT_POOL_MIN_FREE_BYTES = 4 * 2 ** 30;
/** The least free space the host file system under the pool file keeps, bytes (config imagePoolHostMinFreeBytes). */
export const DEFAULT_POOL_HOST_MIN_FREE_BYTES = 2 ** 30;
/** How often the free space of the pool is checked, ms (config imagePoolCheckMs; 0: only before images are made). */
export const DEFAULT_POOL_CHECK_MS = 10_000;
/** Smallest pool mkfs.xfs makes (xfsprogs >= 5.19 refuses below 300 MB), bytes. */
export const MIN_POOL_BYTES = 512 * 2 ** 20;
/** Time mkfs.xfs / mount / xfs_growfs / losetup may take, ms. */
const POOL_CMD_TIMEOUT_MS = 120_000;
/** How long the start waits for the other slot's pool setup (the pool lock), ms. */
const POOL_LOCK_WAIT_MS = 120_000;
const MIB = 2 ** 20;
const mib = (b: number) => Math.floor(b / MIB);

/** Where the images live: "native" (the images dir's own file system has reflink), "pool" (the XFS pool), "none" (no reflink: copy). */
export type PoolMode = 'native' | 'pool' | 'none';

/** What {@link ImagePool.setup} found or did. */
export interface PoolStatus {
  mode: PoolMode;
  /** Why there is no reflink (mode "none"), or how the pool was brought up ("made", "reused", "mounted", "attached"). */
  reason: string;
  /** The pool's loop device (mode "pool"). */
  loopDevice?: string;
}

/** Options of an ImagePool. */
export interface ImagePoolOptions {
  /** The images dir (made if missing). */
  imagesDir: string;
  /** The pool's own dir (`<stateDir>/ublk-manager/pool`): the pool file and its lock. */
  poolDir: string;
  /** Make a pool when the images dir has no reflink (config imagePool). */
  enabled: boolean;
  initialBytes?: number;
  maxBytes?: number;
  minFreeBytes?: number;
  /** See {@link DEFAULT_POOL_HOST_MIN_FREE_BYTES}. */
  hostMinFreeBytes?: number;
  /** Free bytes for an unprivileged writer (bavail x bsize) of the file system holding path; injectable for tests. */
  freeBytes?: (path: string) => Promise<number>;
  log: Logger;
  run?: RunFn;
  sysfsRoot?: string;
  procRoot?: string;
}

/** mountAt returns the major:minor and fs type of the mount whose mount point is dir (last one wins), from a mountinfo text. */
export function mountAt(mountinfo: string, dir: string): { majmin: string; fstype: string } | undefined {
  let found: { majmin: string; fstype: string } | undefined;
  for (const line of mountinfo.split('\n')) {
    const f = line.split(' ');
    const sep = f.indexOf('-');
    if (f.length > 4 && sep > 0 && unescapeMountinfo(f[4] ?? '') === dir) found = { majmin: f[2] ?? '', fstype: f[sep + 1] ?? '' };
  }
  return found;
}

/** ImagePool brings up and grows the reflink pool of the images dir. */
export class ImagePool {
  /** The pool file: `<poolDir>/images.xfs` (poolDir with symlinks resolved after setup, as sysfs names it). */
  file: string;
  private dir = '';
  private readonly run: RunFn;
  private readonly sys: string;
  private readonly proc: string;
  private readonly initialBytes: number;
  private readonly maxBytes: number;
  private readonly minFreeBytes: number;
  private readonly hostMinFreeBytes: number;
  private readonly freeBytes: (path: string) => Promise<number>;
  /** The last growth/space error the watch logged (logged again only when it changes). */
  private lastWatchError = '';
  private status: PoolStatus = { mode: 'none', reason: 'not set up' };
  private growing: Promise<void> | undefined;
  private timer: NodeJS.Timeout | undefined;

  constructor(private readonly opts: ImagePoolOptions) {
    this.file = path.join(opts.poolDir, 'images.xfs');
    this.run = opts.run ?? run;
    this.sys = opts.sysfsRoot ?? '/sys';
    this.proc = opts.procRoot ?? '/proc';
    this.initialBytes = opts.initialBytes ?? DEFAULT_POOL_INITIAL_BYTES;
    this.maxBytes = Math.max(opts.maxBytes ?? DEFAULT_POOL_MAX_BYTES, this.initialBytes);
    this.minFreeBytes = opts.minFreeBytes ?? DEFAULT_POOL_MIN_FREE_BYTES;
    this.hostMinFreeBytes = opts.hostMinFreeBytes ?? DEFAULT_POOL_HOST_MIN_FREE_BYTES;
    this.freeBytes =
      opts.freeBytes ??
      (async (p) => {
        const st = await fs.statfs(p);
        return st.bavail * st.bsize;
      });
  }

  /** mode is where images live now (after setup). */
  get mode(): PoolMode {
    return this.status.mode;
  }

  /** reason says why there is no reflink (mode "none") or how the pool came up. */
  get reason(): string {
    return this.status.reason;
  }

  /**
   * setup finds, adopts or makes the pool (see the file header) and returns what it did.
   * Resolves with mode "none" (and the reason) when there is no reflink and no pool may be
   * made. Errors: InternalError when a host command (losetup, mkfs.xfs, mount) fails or the
   * mounted pool has no reflink after all; the images dir is then left unmounted.
   */
  async setup(): Promise<PoolStatus> {
    mkdirSync(this.opts.imagesDir, { recursive: true, mode: 0o700 });
    mkdirSync(this.opts.poolDir, { recursive: true, mode: 0o700 });
    this.dir = realpathSync(this.opts.imagesDir);
    this.file = path.join(realpathSync(this.opts.poolDir), 'images.xfs');
    const lock = lockSlot(path.join(this.opts.poolDir, 'pool.lock'), `image pool of ${this.dir}`, POOL_LOCK_WAIT_MS);
    try {
      this.status = await this.setupLocked();
    } finally {
      lock.release();
    }
    this.opts.log.info({ images_dir: this.dir, pool_file: this.file, ...this.status }, `images: ${this.status.mode} (${this.status.reason})`);
    return this.status;
  }

  private async setupLocked(): Promise<PoolStatus> {
    for (const n of readdirSync(this.opts.poolDir)) if (n.startsWith('images.xfs.tmp-')) rmSync(path.join(this.opts.poolDir, n), { force: true });
    const mounted = mountAt(readFileSync(path.join(this.proc, 'self', 'mountinfo'), 'utf8'), this.dir);
    const loops = this.loopsOfPool();
    const ours = mounted && loops.find((l) => l.majmin === mounted.majmin);
    if (ours) return { mode: 'pool', reason: `reused the mounted pool (${ours.path})`, loopDevice: ours.path };
    const probe = await probeReflink(this.dir);
    if (probe.ok) return { mode: 'native', reason: `the images dir's file system${mounted ? ` (${mounted.fstype})` : ''} has reflink` };
    const why = `the images dir's file system has no reflink (FICLONE: ${probe.name})`;
    if (!this.opts.enabled) return { mode: 'none', reason: `${why} and imagePool is off` };
    if (mounted) return { mode: 'none', reason: `${why}: ${this.dir} is a mount (${mounted.fstype}) that is not the pool` };
    let how = 'attached and mounted the pool file';
    // a mount over images made without the pool would hide them from their devices' rows
    const others = readdirSync(this.dir).filter((n) => !n.startsWith('.reflink-probe-'));
    if (others.length > 0) return { mode: 'none', reason: `${why}; the pool is not mounted: the images dir holds ${others.length} file(s) made without it` };
    if (!existsFile(this.file)) {
      try {
        await this.make();
      } catch (err) {
        // nothing is in the pool yet: clone by copy rather than not start
        this.opts.log.error({ err, pool_file: this.file }, 'image pool: making the pool failed; clones copy');
        return { mode: 'none', reason: `${why}; making the image pool failed: ${(err as Error).message}` };
      }
      how = 'made the pool';
    }
    let loop = loops[0]?.path;
    if (loop) how = `mounted the attached pool (${loop})`;
    else loop = await this.attach();
    try {
      await this.run('mount', ['-t', 'xfs', '-o', 'noatime', loop, this.dir], { timeoutMs: POOL_CMD_TIMEOUT_MS });
    } catch (err) {
      throw Object.assign(new InternalError(`image pool: mount ${loop} on ${this.dir} failed: ${(err as Error).message}`), { cause: err });
    }
    chmodSync(this.dir, 0o700);
    const after = await probeReflink(this.dir);
    if (!after.ok) {
      await this.run('umount', [this.dir], { timeoutMs: POOL_CMD_TIMEOUT_MS }).catch(() => undefined);
      throw new InternalError(`image pool: the mounted pool ${this.file} has no reflink (FICLONE: ${after.name}); unmounted`);
    }
    return { mode: 'pool', reason: how, loopDevice: loop };
  }

  /** make writes a new pool file: sparse temp file, mkfs.xfs -m reflink=1, fsync, rename. */
  private async make(): Promise<void> {
    const tmp = `${this.file}.tmp-${randomBytes(4).toString('hex')}`;
    const fd = openSync(tmp, fsc.O_CREAT | fsc.O_EXCL | fsc.O_RDWR | fsc.O_NOFOLLOW, 0o600);
    try {
      await fs.truncate(tmp, this.initialBytes);
      await this.run('mkfs.xfs', ['-q', '-m', 'reflink=1', tmp], { timeoutMs: POOL_CMD_TIMEOUT_MS });
      fsyncSync(fd);
    } catch (err) {
      rmSync(tmp, { force: true });
      throw Object.assign(new InternalError(`image pool: making ${this.file} failed: ${(err as Error).message}`), { cause: err });
    } finally {
      closeSync(fd);
    }
    renameSync(tmp, this.file);
    const dfd = openSync(this.opts.poolDir, fsc.O_RDONLY | fsc.O_DIRECTORY);
    fsyncSync(dfd);
    closeSync(dfd);
  }

  /** attach runs losetup on the pool file (direct I/O when losetup can) and returns the device. */
  private async attach(): Promise<string> {
    for (const extra of [['--direct-io=on'], []]) {
      try {
        const out = (await this.run('losetup', ['--find', '--show', ...extra, this.file], { timeoutMs: POOL_CMD_TIMEOUT_MS })).stdout.trim();
        if (/^\/dev\/loop\d+$/.test(out)) return out;
      } catch (err) {
        if (extra.length === 0) throw Object.assign(new InternalError(`image pool: losetup ${this.file} failed: ${(err as Error).message}`), { cause: err });
        // a device set up before the direct-I/O switch failed is found and reused below
        const left = this.loopsOfPool()[0];
        if (left) return left.path;
      }
    }
    throw new InternalError(`image pool: losetup ${this.file} printed no loop device`);
  }

  /** loopsOfPool lists the loop devices whose backing file is the pool file (sysfs), with major:minor. */
  loopsOfPool(): { path: string; majmin: string }[] {
    const out: { path: string; majmin: string }[] = [];
    let names: string[];
    try {
      names = readdirSync(path.join(this.sys, 'block')).filter((n) => /^loop\d+$/.test(n));
    } catch {
      return out;
    }
    names.sort((a, b) => Number(a.slice(4)) - Number(b.slice(4)));
    for (const n of names) {
      try {
        const back = readFileSync(path.join(this.sys, 'block', n, 'loop', 'backing_file'), 'utf8').trim();
        if (back !== this.file) continue;
        out.push({ path: `/dev/${n}`, majmin: readFileSync(path.join(this.sys, 'block', n, 'dev'), 'utf8').trim() });
      } catch {
        /* not bound or gone meanwhile */
      }
    }
    return out;
  }

  /**
   * ensureFree makes sure an image of needBytes (bytes) can be written: it refuses while the
   * host file system under the pool file has less than hostMinFreeBytes + needBytes free, and
   * grows the pool when less than minFreeBytes + needBytes is free in it. Nothing to do unless
   * mode is "pool". Concurrent calls share one growth. Errors: ResourceExhaustedError when the
   * host is short (the message names its dir and both figures in MiB), or the pool is at
   * maxBytes (or at what the host can back) and still short; InternalError when losetup -c or
   * xfs_growfs fails.
   */
  async ensureFree(needBytes = 0): Promise<void> {
    if (this.status.mode !== 'pool') return;
    const hostDir = path.dirname(this.file);
    const hostFree = await this.freeBytes(hostDir);
    if (hostFree < this.hostMinFreeBytes + needBytes) {
      throw new ResourceExhaustedError(
        `the host file system under the image pool (${hostDir}) has ${mib(hostFree)} MiB free, below imagePoolHostMinFreeBytes (${mib(this.hostMinFreeBytes)} MiB)${needBytes ? ` + ${mib(needBytes)} MiB asked` : ''}: no image is made (the pool file is sparse: a full host would fail the writes of every sandbox); free space there`,
      );
    }
    if (this.growing) return this.growing;
    const poolFree = await this.freeBytes(this.dir);
    if (poolFree >= this.minFreeBytes + needBytes) return;
    this.growing = this.grow(needBytes, hostFree, poolFree).finally(() => (this.growing = undefined));
    return this.growing;
  }

  private async grow(needBytes: number, hostFree: number, poolFree: number): Promise<void> {
    const st = statSync(this.file);
    const size = st.size;
    // what the host can back: the bytes the file already holds plus the host's free space above its reserve
    const backed = st.blocks * 512 + Math.max(0, hostFree - this.hostMinFreeBytes);
    const want = Math.max(size * 2, size + needBytes + this.minFreeBytes);
    const target = Math.floor(Math.min(this.maxBytes, Math.ceil(want / MIB) * MIB, backed) / MIB) * MIB;
    if (target <= size) {
      if (poolFree >= needBytes) return;
      throw new ResourceExhaustedError(
        target < Math.min(this.maxBytes, want)
          ? `image pool ${this.file} is full and the host file system under it (${path.dirname(this.file)}) cannot back a larger one (${mib(hostFree)} MiB free, imagePoolHostMinFreeBytes ${mib(this.hostMinFreeBytes)} MiB)`
          : `image pool ${this.file} is at its largest size (imagePoolMaxBytes ${this.maxBytes} bytes) and full`,
      );
    }
    const loop = this.loopsOfPool()[0]?.path;
    if (!loop) throw new InternalError(`image pool: ${this.file} is not attached to a loop device; cannot grow`);
    const t0 = performance.now();
    await fs.truncate(this.file, target);
    try {
      await this.run('losetup', ['-c', loop], { timeoutMs: POOL_CMD_TIMEOUT_MS });
      await this.run('xfs_growfs', ['-d', this.dir], { timeoutMs: POOL_CMD_TIMEOUT_MS });
    } catch (err) {
      throw Object.assign(new InternalError(`image pool: growing ${this.file} to ${target} bytes failed: ${(err as Error).message}`), { cause: err });
    }
    this.opts.log.info({ pool_file: this.file, from_bytes: size, to_bytes: target, grow_ms: performance.now() - t0 }, 'image pool grown');
  }

  /** watch checks the free space every intervalMs (0: never) and grows the pool; errors are logged. */
  watch(intervalMs: number): void {
    if (intervalMs <= 0 || this.status.mode !== 'pool') return;
    this.timer = setInterval(() => {
      this.ensureFree().then(
        () => (this.lastWatchError = ''),
        (err: unknown) => {
          // once per distinct error, not every check: a full host stays full for a while
          const msg = (err as Error).message;
          if (msg !== this.lastWatchError) this.opts.log.error({ err, pool_file: this.file }, 'image pool: growing failed');
          this.lastWatchError = msg;
        },
      );
    }, intervalMs);
    this.timer.unref();
  }

  /** stop ends the watch; the pool stays mounted (its images are in use). */
  stop(): void {
    if (this.timer) clearInterval(this.timer);
  }
}

function existsFile(p: string): boolean {
  try {
    statSync(p);
    return true;
  } catch {
    return false;
  }
}
