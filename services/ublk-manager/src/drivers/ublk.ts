/**
 * UblkDriver: the production driver. Devices are kernel ublk devices (`/dev/ublkb<N>`, kernel
 * Documentation/block/ublk.rst) served by an external ublk server program (config
 * `ublkServer`, e.g. `ublk` from ublksrv or the kernel selftests' `kublk`), with the loop target
 * on the same image files as the loop driver:
 *
 *   attach   `<server> add -t loop -f <file> --recovery 1 [--recovery_reissue 1]`
 *   detach   `<server> del -n <id>`
 *   list     `<server> list`
 *   quiesce  fsync of the image, then `<server> quiesce -n <id>` when the kernel has QUIESCE
 *   release  the device's server process is stopped (SIGKILL to the daemon pid `list` reports):
 *            with USER_RECOVERY the kernel keeps the device and queues I/O (recovery state)
 *   recover  `<server> recover -n <id>` (START_USER_RECOVERY .. END_USER_RECOVERY)
 *
 * Capabilities come from what the kernel supports: `<server> features` output when the
 * program has that command (it prints the UBLK_F_* names the kernel accepts), else the
 * ublk_drv module parameters in `/sys/module/ublk_drv/parameters` (present = module loaded;
 * USER_RECOVERY and REISSUE exist since 6.0, QUIESCE only when `features` says so).
 *
 * Idempotency under REISSUE: after recovery the kernel may reissue I/O the old server had
 * taken but not completed. The loop target's operations are idempotent: a write puts the same
 * bytes at the same offset again, a flush (fsync) and a discard (punch hole) give the same
 * result when repeated, reads have no effect. So a replay never changes the outcome.
 *
 * CloneDevice is driver-independent at the image level: the DeviceManager clones the source's
 * image file with FileImages.clone (cp(1) --reflink / FICLONE, sparse; temp name, fsync,
 * rename) and then attaches the new image with this driver's `attach` like any new device
 * (`<server> add -t loop -f <clone>`). The source device is not touched (it is only read
 * through its image file; the caller keeps it frozen).
 *
 * This host has no `/dev/ublk-control`: the driver is exercised by unit tests with a fake run.
 */
import { constants as fsc, existsSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { FailedPreconditionError, InternalError, run as runCommand, type Logger } from '@sandnode/shared';
import type { AttachOptions, BlockDriver } from '../core/driver';
import type { AttachedDevice, DriverCapability } from '../core/types';
import type { RunFn } from './images';

/** The ublk control device node. */
export const UBLK_CONTROL = '/dev/ublk-control';
/** Default ublk server program (ublksrv's `ublk`). */
export const DEFAULT_UBLK_SERVER = 'ublk';
/** Time one ublk server command may take, in ms. */
export const DEFAULT_UBLK_COMMAND_TIMEOUT_MS = 30_000;

const DEV_RE = /^\/dev\/ublkb(\d+)$/;

/** Options of a UblkDriver. */
export interface UblkDriverOptions {
  /** The ublk server program (path or name on PATH). */
  server?: string;
  /** The control node (default /dev/ublk-control). */
  controlPath?: string;
  /** sysfs mount point (default /sys). */
  sysfsRoot?: string;
  /** Runs host commands (default shared `run`). */
  run?: RunFn;
  /** Sends a signal to a pid (default process.kill). */
  kill?: (pid: number, signal: NodeJS.Signals) => void;
  log?: Logger;
}

/** One device as `<server> list` reports it. */
export interface UblkListEntry {
  id: number;
  /** Daemon (server) pid, 0 when unknown. */
  pid: number;
  /** Backing file of the loop target, '' when unknown. */
  backingFile: string;
  /** Kernel state, e.g. LIVE, QUIESCED, FAIL_IO. */
  state: string;
}

/**
 * parseUblkList reads `ublk list` output (ublksrv and kublk print one block per device
 * starting with `dev id N:`, with `pid N` / `daemon pid N`, `state X` and the target JSON or
 * a `backing_file`/`file` entry).
 */
export function parseUblkList(out: string): UblkListEntry[] {
  const entries: UblkListEntry[] = [];
  let cur: UblkListEntry | undefined;
  for (const line of out.split('\n')) {
    const id = /dev id (\d+)/.exec(line);
    if (id) {
      cur = { id: Number(id[1]), pid: 0, backingFile: '', state: '' };
      entries.push(cur);
    }
    if (!cur) continue;
    const pid = /\bpid:? (\d+)/.exec(line);
    if (pid) cur.pid = Number(pid[1]);
    const st = /\bstate:? ([A-Z_]+)/.exec(line);
    if (st) cur.state = st[1] ?? '';
    const bf = /"?(?:backing_file|file)"?\s*[:=]\s*"?([^",\s}]+)/.exec(line);
    if (bf) cur.backingFile = bf[1] ?? '';
  }
  return entries;
}

/** parseUblkFeatures maps `ublk features` output (UBLK_F_* names) to capabilities. */
export function parseUblkFeatures(out: string): DriverCapability[] {
  const names = new Set(out.split(/[^A-Z0-9_]+/).map((t) => t.replace(/^UBLK_F_/, '')));
  const caps: DriverCapability[] = [];
  if (names.has('QUIESCE')) caps.push('quiesce');
  if (names.has('USER_RECOVERY')) caps.push('user-recovery');
  if (names.has('USER_RECOVERY_REISSUE')) caps.push('reissue');
  return caps;
}

/** UblkDriver implements BlockDriver with kernel ublk devices and an external server. */
export class UblkDriver implements BlockDriver {
  readonly name = 'ublk' as const;
  private readonly server: string;
  private readonly controlPath: string;
  private readonly sys: string;
  private readonly run: RunFn;
  private readonly kill: (pid: number, signal: NodeJS.Signals) => void;
  private caps: DriverCapability[] = [];

  constructor(opts: UblkDriverOptions = {}) {
    this.server = opts.server ?? DEFAULT_UBLK_SERVER;
    this.controlPath = opts.controlPath ?? UBLK_CONTROL;
    this.sys = opts.sysfsRoot ?? '/sys';
    this.run = opts.run ?? runCommand;
    this.kill = opts.kill ?? ((pid, sig) => process.kill(pid, sig));
  }

  /** capabilities as detected by checkAvailable (empty before). */
  capabilities(): DriverCapability[] {
    return [...this.caps];
  }

  /**
   * checkAvailable needs the control node and the ublk server program; then detects the
   * capabilities. FailedPreconditionError naming `/dev/ublk-control` or the program.
   */
  async checkAvailable(): Promise<void> {
    if (!existsSync(this.controlPath)) {
      throw new FailedPreconditionError(`driver "ublk": ${this.controlPath} is missing (the kernel has no ublk: load it with "modprobe ublk_drv", kernel >= 6.0); use driver "loop" on this host`);
    }
    try {
      await this.cmd(['list']);
    } catch (err) {
      throw new FailedPreconditionError(`driver "ublk": the ublk server program "${this.server}" (config ublkServer) cannot run: ${(err as Error).message}`);
    }
    this.caps = await this.detectCapabilities();
  }

  /** detectCapabilities asks `<server> features`, else reads the ublk_drv module in sysfs. */
  async detectCapabilities(): Promise<DriverCapability[]> {
    try {
      return parseUblkFeatures((await this.cmd(['features'])).stdout);
    } catch {
      // No features command: USER_RECOVERY (+REISSUE) exist in every kernel with ublk (6.0+);
      // QUIESCE cannot be known without the features ioctl, so it is not claimed.
      return existsSync(path.join(this.sys, 'module', 'ublk_drv')) ? ['user-recovery', 'reissue'] : [];
    }
  }

  /** attach runs `<server> add -t loop -f <file> --recovery 1 [--recovery_reissue 1]`. */
  async attach(backingFile: string, opts: AttachOptions): Promise<AttachedDevice> {
    const args = ['add', '-t', 'loop', '-f', backingFile, '--recovery', '1'];
    if (this.caps.includes('reissue')) args.push('--recovery_reissue', '1');
    const out = (await this.cmd(args)).stdout;
    const id = /dev id (\d+)/.exec(out)?.[1];
    if (id === undefined) throw new InternalError(`${this.server} ${args.join(' ')}: no "dev id" in its output ${JSON.stringify(out.slice(0, 200))}`);
    return { path: `/dev/ublkb${id}`, backingFile, readOnly: opts.readOnly, flags: this.flags() };
  }

  /** detach runs `<server> del -n <id>`. */
  async detach(devPath: string): Promise<void> {
    await this.cmd(['del', '-n', String(this.idOf(devPath))]);
  }

  /**
   * listAttached parses `<server> list` and keeps devices backed directly in dir; readOnly is
   * the kernel's `/sys/block/ublkb<N>/ro` (false when unreadable), so that CloneDevice's
   * "source attached read-write" check sees what the kernel enforces.
   */
  async listAttached(dir: string): Promise<AttachedDevice[]> {
    const entries = parseUblkList((await this.cmd(['list'])).stdout);
    const kept = entries.filter((e) => e.backingFile !== '' && path.dirname(e.backingFile) === dir).sort((a, b) => a.id - b.id);
    const out: AttachedDevice[] = [];
    for (const e of kept) out.push({ path: `/dev/ublkb${e.id}`, backingFile: e.backingFile, readOnly: await this.sysReadOnly(e.id), flags: this.flags() });
    return out;
  }

  private async sysReadOnly(id: number): Promise<boolean> {
    try {
      return (await fs.readFile(path.join(this.sys, 'block', `ublkb${id}`, 'ro'), 'utf8')).trim() === '1';
    } catch {
      return false;
    }
  }

  /** busyReason: sysfs holders of the device. */
  async busyReason(devPath: string): Promise<string | undefined> {
    try {
      const holders = await fs.readdir(path.join(this.sys, 'block', path.basename(devPath), 'holders'));
      return holders.length > 0 ? `held by ${holders.join(', ')}` : undefined;
    } catch {
      return undefined;
    }
  }

  /** quiesce fsyncs the image, then `<server> quiesce -n <id>` when the kernel has QUIESCE. */
  async quiesce(dev: AttachedDevice): Promise<void> {
    const fh = await fs.open(dev.backingFile, fsc.O_RDONLY);
    try {
      await fh.sync();
    } finally {
      await fh.close();
    }
    if (this.caps.includes('quiesce')) await this.cmd(['quiesce', '-n', String(this.idOf(dev.path))]);
  }

  /** resume: a quiesced ublk device is resumed by recovering it with the same server. */
  async resume(dev: AttachedDevice): Promise<void> {
    if (this.caps.includes('quiesce')) await this.cmd(['recover', '-n', String(this.idOf(dev.path))]);
  }

  /**
   * release stops the device's server process (SIGKILL to the pid `list` reports); with
   * USER_RECOVERY the kernel keeps the device and holds its I/O until recover.
   * FailedPreconditionError without USER_RECOVERY (the caller falls back to pausing sandboxes).
   */
  async release(dev: AttachedDevice): Promise<void> {
    if (!this.caps.includes('user-recovery')) throw new FailedPreconditionError('driver "ublk": the kernel lacks USER_RECOVERY; pause the sandbox instead');
    const id = this.idOf(dev.path);
    const entry = parseUblkList((await this.cmd(['list', '-n', String(id)])).stdout).find((e) => e.id === id);
    if (!entry || entry.pid <= 0) throw new InternalError(`${this.server} list -n ${id}: no server pid for ${dev.path}`);
    this.kill(entry.pid, 'SIGKILL');
  }

  /** recover runs `<server> recover -n <id>` (user recovery: a new server takes the device). */
  async recover(dev: AttachedDevice): Promise<AttachedDevice> {
    if (!this.caps.includes('user-recovery')) throw new FailedPreconditionError('driver "ublk": the kernel lacks USER_RECOVERY');
    await this.cmd(['recover', '-n', String(this.idOf(dev.path))]);
    return { ...dev, flags: this.flags() };
  }

  private flags(): string[] {
    return this.caps.map((c) => c.toUpperCase().replace('-', '_'));
  }

  private idOf(devPath: string): number {
    const m = DEV_RE.exec(devPath);
    if (!m) throw new InternalError(`${devPath} is not a ublk block device (/dev/ublkbN)`);
    return Number(m[1]);
  }

  private cmd(args: string[]) {
    return this.run(this.server, args, { timeoutMs: DEFAULT_UBLK_COMMAND_TIMEOUT_MS });
  }
}
