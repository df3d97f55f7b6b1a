/**
 * LoopDriver: the embedded driver. Image files are attached as loop devices (loop(4)) with
 * `losetup --find --show [--read-only] [--direct-io=on]`; live state is read from sysfs
 * (`/sys/block/loopN/loop/backing_file`, `ro`, `loop/dio`). The loop driver has no user-space
 * data path, so it has no device-handover capabilities.
 *
 * Safety: only devices whose backing file lies directly in the images directory are ever
 * reported by {@link LoopDriver.listAttached}, so the manager never touches anyone else's.
 *
 * Handover: the kernel serves loop I/O, so a handover between manager slots moves ownership
 * and control only ("ownership-only"). quiesce = fsync of an fd on the device node (writes
 * back the device's buffers, flushes the backing file) + fdatasync of the backing image, no
 * process spawned; it does not hold I/O. release does nothing; recover verifies the device is
 * still attached to the same backing file (one sysfs read, {@link LoopDriver.lookup}).
 *
 * CloneDevice: the DeviceManager clones the source's image with FileImages.clone (cp(1)
 * `--reflink=always` = FICLONE where the file system has it, else `--reflink=auto
 * --sparse=always`) and attaches the copy here like a new device. The source loop device is
 * only read through its backing file (the `ro` sysfs attribute tells whether it is attached
 * read-write); it is not flushed: the caller's freeze (FIFREEZE syncs the filesystem down to
 * the loop device, which writes the backing file) or a paused VM keeps it consistent.
 */
import { spawnSync } from 'node:child_process';
import { closeSync, constants as fsc, fdatasync, fsync, openSync, readFileSync, statSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { CommandError, FailedPreconditionError, InternalError, ResourceExhaustedError, run, type Logger } from '@sandnode/shared';
import { EXCLUSIVE_USE, type AttachOptions, type BlockDriver } from '../core/driver';
import type { AttachedDevice, DriverCapability } from '../core/types';
import type { RunFn } from './images';

/** Time a losetup call may take, in ms. */
export const DEFAULT_LOSETUP_TIMEOUT_MS = 30_000;
/** Time the synchronous `losetup -O BACK-INO` of the foreign-mount-namespace check may take, in ms. */
export const DEFAULT_BACKING_INODE_TIMEOUT_MS = 5000;

/** Logical sector size of every loop device attached here, bytes (`losetup --sector-size`). */
export const LOOP_SECTOR_BYTES = 512;

/** Flag reported when a loop device does direct I/O on its backing file. */
export const FLAG_DIRECT_IO = 'direct-io';

const LOOP_PATH_RE = /^\/dev\/loop(\d+)$/;
const NO_FREE_RE = /could not find any free loop device|no free loop device|failed to get free loop device/i;

/** Options of a LoopDriver. */
export interface LoopDriverOptions {
  /** Ask for direct I/O (`--direct-io=on`); falls back to buffered I/O when losetup refuses. */
  directIo: boolean;
  log: Logger;
  /** Runs host commands (default shared `run`). */
  run?: RunFn;
  /** sysfs mount point (default "/sys"). */
  sysfsRoot?: string;
  /** procfs mount point (default "/proc"). */
  procRoot?: string;
  /** where device nodes are (default "/dev"); tests point it away from the host's devices. */
  devRoot?: string;
  /**
   * The images directory (absolute, symlinks resolved). The kernel renders a loop device's
   * backing_file relative to the *reader's* mount namespace: a device attached by a slot in
   * another container shows as e.g. `/images/<id>.img`. Such a path is mapped to the file of
   * the same name here when the loop device's backing inode and device (LOOP_GET_STATUS64, via
   * `losetup -O BACK-INO,BACK-MAJ:MIN`) are that file's.
   */
  imagesDir?: string;
  /** Backing inode of a loop device (default: losetup); tests inject a fake. */
  backingInode?: (devPath: string) => { ino: number; major: number; minor: number } | undefined;
  /** The loop control node (default "/dev/loop-control"). */
  loopControl?: string;
}

async function readTrim(file: string): Promise<string | undefined> {
  try {
    return (await fs.readFile(file, 'utf8')).trim();
  } catch (err) {
    return absent(err);
  }
}

/**
 * readSysfs reads a small sysfs attribute synchronously: sysfs reads do no disk I/O and take
 * microseconds, while an async read costs a round trip through the libuv thread pool (tens to
 * hundreds of microseconds on a busy host, times the number of loop devices in a scan).
 */
function readSysfs(file: string): string | undefined {
  try {
    return readFileSync(file, 'utf8').trim();
  } catch (err) {
    return absent(err);
  }
}

/** absent maps the errors of a file that is not (or no longer) there to undefined; rethrows others. */
function absent(err: unknown): undefined {
  const code = (err as NodeJS.ErrnoException).code;
  // ENODEV: the loop device was detached (or removed) between listing /sys/block and this
  // read, e.g. by a concurrent DeleteDevice: it has no backing file any more.
  if (code === 'ENOENT' || code === 'ENOTDIR' || code === 'ENXIO' || code === 'ENODEV') return undefined;
  throw err;
}

async function readDirOr(dir: string): Promise<string[]> {
  try {
    return await fs.readdir(dir);
  } catch {
    return [];
  }
}

/** syncFd opens file, fsyncs (or fdatasyncs) it in the thread pool and closes it. */
async function syncFd(file: string, flags: number, dataOnly: boolean): Promise<void> {
  const fd = openSync(file, flags);
  try {
    await new Promise<void>((resolve, reject) => (dataOnly ? fdatasync : fsync)(fd, (err) => (err ? reject(err) : resolve())));
  } finally {
    closeSync(fd);
  }
}

/** unescapeMountinfo decodes the octal escapes (\040 for space) of a mountinfo path field. */
export function unescapeMountinfo(s: string): string {
  return s.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));
}

/**
 * findMount returns the mount point of the first line of a mountinfo text (proc(5)) whose
 * major:minor (field 3) is in devs, or undefined.
 */
export function findMount(mountinfo: string, devs: ReadonlySet<string>): string | undefined {
  for (const line of mountinfo.split('\n')) {
    const f = line.split(' ');
    if (f.length > 4 && devs.has(f[2] ?? '')) return unescapeMountinfo(f[4] ?? '');
  }
  return undefined;
}

/** LoopDriver implements BlockDriver with loop devices. */
export class LoopDriver implements BlockDriver {
  readonly name = 'loop' as const;
  private readonly directIo: boolean;
  private readonly log: Logger;
  private readonly run: RunFn;
  private readonly sys: string;
  private readonly proc: string;
  private readonly devRoot: string;
  private readonly imagesDir: string | undefined;
  private readonly backingInode: (devPath: string) => { ino: number; major: number; minor: number } | undefined;
  private readonly loopControl: string;

  constructor(opts: LoopDriverOptions) {
    this.directIo = opts.directIo;
    this.log = opts.log;
    this.run = opts.run ?? run;
    this.sys = opts.sysfsRoot ?? '/sys';
    this.proc = opts.procRoot ?? '/proc';
    this.devRoot = opts.devRoot ?? '/dev';
    this.imagesDir = opts.imagesDir;
    this.backingInode = opts.backingInode ?? losetupBackingInode;
    this.loopControl = opts.loopControl ?? '/dev/loop-control';
  }

  /** capabilities: none. The loop driver has no user-space data path to hand over. */
  capabilities(): DriverCapability[] {
    return [];
  }

  /** checkAvailable needs a usable /dev/loop-control and the losetup command. */
  async checkAvailable(): Promise<void> {
    try {
      await fs.access(this.loopControl, fsc.R_OK | fsc.W_OK);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      throw new FailedPreconditionError(
        code === 'ENOENT'
          ? `driver "loop": ${this.loopControl} is missing (load the loop kernel module: modprobe loop)`
          : `driver "loop": ${this.loopControl} is not usable (${code ?? String(err)}; the manager must run as root)`,
      );
    }
    try {
      await this.run('losetup', ['--version'], { timeoutMs: DEFAULT_LOSETUP_TIMEOUT_MS });
    } catch (err) {
      throw new FailedPreconditionError(`driver "loop": losetup (util-linux) cannot run: ${(err as Error).message}`);
    }
  }

  /**
   * attach runs losetup; with directIo it first asks for direct I/O and, if losetup refuses,
   * attaches without it (logged; Device.flags then lacks "direct-io").
   * Errors: ResourceExhaustedError when no loop device is free; CommandError (INTERNAL) else.
   */
  async attach(backingFile: string, opts: AttachOptions): Promise<AttachedDevice> {
    // 512-byte logical sectors always: with direct I/O the kernel would otherwise take the
    // backing file's block size (4096 on XFS, the image pool), which an ext4 of 1 KiB blocks
    // (mkfs.ext4 picks them below 512 MiB) cannot be mounted from
    const args = ['--find', '--show', `--sector-size=${LOOP_SECTOR_BYTES}`, ...(opts.readOnly ? ['--read-only'] : [])];
    if (this.directIo) {
      try {
        return await this.losetup([...args, '--direct-io=on', backingFile]);
      } catch (err) {
        if (err instanceof ResourceExhaustedError) throw err;
        // Some losetup versions set the device up and then fail to switch on direct I/O.
        for (const a of (await this.listAttached(path.dirname(backingFile))).filter((d) => d.backingFile === backingFile)) await this.detach(a.path);
        this.log.warn({ err, backing_file: backingFile }, 'losetup refused --direct-io=on; attaching with buffered I/O');
      }
    }
    return this.losetup([...args, backingFile]);
  }

  private async losetup(args: string[]): Promise<AttachedDevice> {
    let out: string;
    try {
      out = (await this.run('losetup', args, { timeoutMs: DEFAULT_LOSETUP_TIMEOUT_MS })).stdout.trim();
    } catch (err) {
      if (err instanceof CommandError && NO_FREE_RE.test(`${err.stderr} ${err.message}`)) {
        // Short message for the caller; losetup's stderr stays in `cause` (logged).
        throw Object.assign(new ResourceExhaustedError('no free loop device (losetup --find found none)'), { cause: err });
      }
      throw err;
    }
    if (!LOOP_PATH_RE.test(out)) throw new InternalError(`losetup ${args.join(' ')}: unexpected output ${JSON.stringify(out)}`);
    const dev = this.readDevice(path.basename(out));
    if (!dev) throw new InternalError(`losetup attached ${out} but sysfs shows no backing file`);
    return dev;
  }

  /** detach runs `losetup -d`; a device that is no longer bound is not an error. */
  async detach(devPath: string): Promise<void> {
    if (!LOOP_PATH_RE.test(devPath)) throw new InternalError(`detach: ${devPath} is not a loop device`);
    try {
      await this.run('losetup', ['-d', devPath], { timeoutMs: DEFAULT_LOSETUP_TIMEOUT_MS });
    } catch (err) {
      if (this.readDevice(path.basename(devPath)) === undefined) return;
      throw err;
    }
  }

  /** listAttached scans /sys/block/loop* and keeps devices backed by files directly in dir. */
  async listAttached(dir: string): Promise<AttachedDevice[]> {
    const names = (await readDirOr(path.join(this.sys, 'block'))).filter((n) => /^loop\d+$/.test(n));
    names.sort((a, b) => Number(a.slice(4)) - Number(b.slice(4)));
    const out: AttachedDevice[] = [];
    for (const name of names) {
      const dev = this.readDevice(name);
      if (dev && path.dirname(dev.backingFile) === dir) out.push(dev);
    }
    return out;
  }

  /**
   * lookup reads the sysfs view of one loop device (`/sys/block/loopN/loop/backing_file`, `ro`,
   * `loop/dio`) without scanning the others; undefined when devPath is not /dev/loopN or
   * the device has no backing file.
   */
  async lookup(devPath: string): Promise<AttachedDevice | undefined> {
    return LOOP_PATH_RE.test(devPath) ? this.readDevice(path.basename(devPath)) : undefined;
  }

  /** readDevice reads the sysfs view of loopN; undefined when it has no backing file. */
  private readDevice(name: string): AttachedDevice | undefined {
    const blk = path.join(this.sys, 'block', name);
    const raw = readSysfs(path.join(blk, 'loop', 'backing_file'));
    if (!raw) return undefined;
    let backingFile = raw.endsWith(' (deleted)') ? raw.slice(0, -' (deleted)'.length) : raw;
    if (this.imagesDir && !backingFile.startsWith(`${this.imagesDir}/`)) backingFile = this.localPath(`/dev/${name}`, backingFile) ?? backingFile;
    const ro = readSysfs(path.join(blk, 'ro')) === '1';
    const dio = readSysfs(path.join(blk, 'loop', 'dio')) === '1';
    return { path: `/dev/${name}`, backingFile, readOnly: ro, flags: dio ? [FLAG_DIRECT_IO] : [] };
  }

  /**
   * localPath maps a backing path seen through another mount namespace to the file of the same
   * name in imagesDir, when that file is the device's backing inode; else undefined.
   */
  private localPath(devPath: string, foreign: string): string | undefined {
    if (!this.imagesDir) return undefined;
    const local = path.join(this.imagesDir, path.basename(foreign));
    let st;
    try {
      st = statSync(local);
    } catch {
      return undefined;
    }
    const b = this.backingInode(devPath);
    if (!b) return undefined;
    const major = Math.floor(st.dev / 256) & 0xfff;
    const minor = (st.dev & 0xff) | (Math.floor(st.dev / 4096) & 0xfff00);
    return b.ino === st.ino && b.major === major && b.minor === minor ? local : undefined;
  }

  /**
   * quiesce makes what was written to the device durable, without spawning a process:
   * 1. fsync(2) of an fd opened (read-only, like `blockdev --flushbufs` does) on the device
   *    node: writes back the device's own page cache (buffered writes to /dev/loopN, a mounted
   *    filesystem's metadata buffers) and sends a flush, which the loop driver turns into an
   *    fsync of the backing file;
   * 2. fdatasync(2) of the backing image (its data and the metadata needed to read it back),
   *    after 1 so that what 1 wrote into the image is covered too.
   * Unlike `blockdev --flushbufs` (BLKFLSBUF) it does not sync a filesystem mounted on the
   * device (that filesystem's un-fsynced page cache); its users' own fsync makes their data
   * durable, as with a ublk QUIESCE. Sandbox I/O keeps flowing (the kernel serves it); there
   * is no user-space queue to hold.
   * Errors: the fs error when an open or sync fails.
   */
  async quiesce(dev: AttachedDevice): Promise<void> {
    if (!LOOP_PATH_RE.test(dev.path)) throw new InternalError(`quiesce: ${dev.path} is not a loop device`);
    // open/close are cheap syscalls done inline; only the syncs wait in the thread pool (each
    // async step is a thread-pool round trip, which a busy host makes cost milliseconds).
    await syncFd(dev.path, fsc.O_RDONLY, false);
    await syncFd(dev.backingFile, dev.readOnly ? fsc.O_RDONLY : fsc.O_RDWR, true);
  }

  /** resume: nothing to do (quiesce holds no I/O). */
  async resume(): Promise<void> {}

  /** release: nothing to do; the loop device stays attached and keeps serving. */
  async release(): Promise<void> {}

  /**
   * recover verifies that dev.path is still attached to dev.backingFile; when it is not, it
   * looks for another loop device on that backing file (the kernel is the truth).
   * FailedPreconditionError when the backing file is not attached at all.
   */
  async recover(dev: AttachedDevice): Promise<AttachedDevice> {
    const name = path.basename(dev.path);
    const at = LOOP_PATH_RE.test(dev.path) ? this.readDevice(name) : undefined;
    if (at && at.backingFile === dev.backingFile) return at;
    const other = (await this.listAttached(path.dirname(dev.backingFile))).find((d) => d.backingFile === dev.backingFile);
    if (other) {
      this.log.warn({ requested: dev.path, found: other.path, backing_file: dev.backingFile }, 'recover: the backing file is attached at another loop device; taking that one');
      return other;
    }
    throw new FailedPreconditionError(`${dev.backingFile} is not attached to any loop device (${dev.path} ${at ? `serves ${at.backingFile}` : 'is not bound'})`);
  }

  /**
   * busyReason checks, in order: holders in sysfs (device mapper, md), mounts of the device
   * or its partitions in every mount namespace on the host (/proc/<pid>/mountinfo, by
   * major:minor), and an exclusive open (O_EXCL fails with EBUSY while anyone claims it).
   */
  async busyReason(devPath: string): Promise<string | undefined> {
    const name = path.basename(devPath);
    const blk = path.join(this.sys, 'block', name);
    const parts = [name, ...(await readDirOr(blk)).filter((n) => n.startsWith(`${name}p`))];
    const devs = new Set<string>();
    for (const p of parts) {
      const dir = p === name ? blk : path.join(blk, p);
      const dev = await readTrim(path.join(dir, 'dev'));
      if (dev) devs.add(dev);
      const holders = await readDirOr(path.join(dir, 'holders'));
      if (holders.length > 0) return `held by ${holders.join(', ')}`;
    }
    if (devs.size > 0) {
      const where = await this.findMountAnywhere(devs);
      if (where) return where;
    }
    try {
      const fh = await fs.open(path.join(this.devRoot, name), fsc.O_RDONLY | fsc.O_EXCL | fsc.O_NONBLOCK);
      await fh.close();
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'EBUSY') return `${EXCLUSIVE_USE} (open with O_EXCL failed: EBUSY)`;
    }
    return undefined;
  }

  /** findMountAnywhere reads one mountinfo per mount namespace, starting with our own. */
  private async findMountAnywhere(devs: ReadonlySet<string>): Promise<string | undefined> {
    const own = await readTrim(path.join(this.proc, 'self', 'mountinfo'));
    const mp = own ? findMount(own, devs) : undefined;
    if (mp) return `mounted at ${mp}`;
    const seen = new Set<string>();
    try {
      seen.add(await fs.readlink(path.join(this.proc, 'self', 'ns', 'mnt')));
    } catch {
      /* no namespaces in this proc */
    }
    for (const pid of (await readDirOr(this.proc)).filter((n) => /^\d+$/.test(n))) {
      let ns: string;
      try {
        ns = await fs.readlink(path.join(this.proc, pid, 'ns', 'mnt'));
      } catch {
        continue;
      }
      if (seen.has(ns)) continue;
      seen.add(ns);
      const info = await readTrim(path.join(this.proc, pid, 'mountinfo')).catch(() => undefined);
      const m = info ? findMount(info, devs) : undefined;
      if (m) return `mounted at ${m} (in the mount namespace of pid ${pid})`;
    }
    return undefined;
  }
}

/** losetupBackingInode asks the kernel (LOOP_GET_STATUS64 through losetup) for a device's backing inode. */
function losetupBackingInode(devPath: string): { ino: number; major: number; minor: number } | undefined {
  const r = spawnSync('losetup', ['--raw', '-n', '-O', 'BACK-INO,BACK-MAJ:MIN', devPath], { encoding: 'utf8', timeout: DEFAULT_BACKING_INODE_TIMEOUT_MS });
  // --raw escapes the column padding as \x20
  const m = /^\s*(\d+)\s+(\d+):(\d+)\s*$/.exec((r.stdout ?? '').replace(/\\x20/g, ' '));
  return r.status === 0 && m ? { ino: Number(m[1]), major: Number(m[2]), minor: Number(m[3]) } : undefined;
}
