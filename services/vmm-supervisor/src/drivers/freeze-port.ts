/**
 * The freeze port of one runc VM: bounded FIFREEZE/FITHAW of the VM's writable filesystems on
 * the host (Linux Documentation/filesystems/vfs.rst, freeze_fs), in-process (fs-ioctl.ts: no
 * host process per call), with a watchdog that does not live in the supervisor.
 *
 * Host layout under `<vmDir>/`:
 *
 *   freeze-port/                    bind-mounted read-only at /run/sandnode-freeze in the VM
 *   freeze-port/freeze.sock         the VM's FreezePortService socket (served by the supervisor)
 *   freeze-state.json               the current or latest freeze (FreezeRecord), atomic writes
 *   freeze-watchdog-<token>.end     written by the watchdog once it has thawed (Unix epoch ms)
 *
 * The watchdog is the node's one long-lived watchdog process (freeze-watchdog.ts), started at
 * the first freeze that finds none alive and reused by every later one: BEFORE the first
 * FIFREEZE the freeze's deadline is handed to it (`<runDir>/freeze-watchdog/<vmId>.deadline`);
 * it survives a SIGKILL of podd, of the caller and of the supervisor itself. A caller's Thaw
 * thaws first, then takes the deadline back. Records of older releases name a
 * `/bin/sh -c 'sleep ...'` watchdog of their own: its process group is killed as before. Every
 * file written here is on the run dir, never on a frozen filesystem (a blocked write would
 * stall one of Node's 4 libuv threads, then all of them).
 */
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import path from 'node:path';
import { FailedPreconditionError, InternalError, isSameProcess, writeFileAtomic } from '@sandnode/shared';
import type { Logger } from '@sandnode/shared';
import { checkThawToken, clampFreezeMs, FREEZE_RECORD_SCHEMA, newFreezeToken, statusOf, windowMs, type FreezeEnd, type FreezeRecord, type FreezeStatus, type FrozenMount } from '../core/freeze';
import { isMountPoint, mountOptions } from './mounts';
import { EINVAL, FIFREEZE, FITHAW, fsIoctl, fsSyncfs, IoctlTimeoutError, type IoctlResult } from './fs-ioctl';
import { clearDeadline, ensureWatchdog, watchdogDirOf, watchdogRunning, writeDeadline } from './freeze-watchdog';
import { observeFreezeWindow } from '../metrics';

/** Dir under the VM dir that the VM sees read-only at {@link FREEZE_PORT_MOUNT}. */
export const FREEZE_PORT_DIR = 'freeze-port';
/** Longest unix socket path (sun_path is 108 bytes with the NUL). */
export const MAX_SOCKET_PATH_BYTES = 107;
/** Socket file name in the freeze-port dir. */
export const FREEZE_SOCKET_NAME = 'freeze.sock';
/** Where the freeze-port dir appears inside the VM. */
export const FREEZE_PORT_MOUNT = '/run/sandnode-freeze';
/** The record file under the VM dir. */
export const FREEZE_STATE_FILE = 'freeze-state.json';
/** Longest one FIFREEZE / FITHAW may take before the call fails INTERNAL, in ms (FIFREEZE syncs dirty data first). */
export const DEFAULT_FSFREEZE_TIMEOUT_MS = 30_000;
/** Longest a call waits for a watchdog past its deadline to finish thawing and record it, in ms. */
export const DEFAULT_WATCHDOG_FINISH_WAIT_MS = 2000;
/** Poll interval while waiting for the watchdog to finish, in ms. */
export const WATCHDOG_POLL_MS = 10;

/** FreezeResult is what a freeze answers. */
export interface FreezeResult {
  token: string;
  maxFreezeMs: number;
  /** Unix epoch ms when the watchdog thaws. */
  deadlineMs: number;
  /** Guest paths frozen, in freeze order. */
  filesystems: string[];
  /** Time the FIFREEZE calls took, ms. */
  freezeMs: number;
}

/** ThawResult says how a freeze ended. */
export interface ThawResult {
  endedBy: FreezeEnd;
  /** First FIFREEZE start to the end of the last FITHAW, ms. */
  frozenMs: number;
}

/** Freezer is what the FreezePortService handlers call (one VM). */
export interface Freezer {
  freeze(requestedMs: number): Promise<FreezeResult>;
  thaw(token: string): Promise<ThawResult>;
  status(): Promise<FreezeStatus>;
}

/** VmFreezerOptions wire a VmFreezer. */
export interface VmFreezerOptions {
  vmId: string;
  /** `<runDir>/vms/<id>`. */
  vmDir: string;
  log: Logger;
  /** Whether the VM runs (a freeze of a VM that does not run is FAILED_PRECONDITION). */
  isRunning: () => Promise<boolean>;
  /** The node's watchdog dir; default `<runDir>/freeze-watchdog` (two levels above vmDir). */
  watchdogDir?: string;
  /** Longest one FIFREEZE / FITHAW may take, ms (default {@link DEFAULT_FSFREEZE_TIMEOUT_MS}). */
  ioctlTimeoutMs?: number;
}

/**
 * VmFreezer freezes and thaws one VM's writable filesystems: `<vmDir>/upper-dev` (guest "/")
 * then `<vmDir>/workspace` when it is mounted read-write (guest "/workspace"). Calls are
 * serialized; one freeze at a time.
 */
export class VmFreezer implements Freezer {
  readonly vmId: string;
  readonly vmDir: string;
  private readonly log: Logger;
  private readonly isRunning: () => Promise<boolean>;
  private readonly watchdogDir: string;
  private readonly ioctlTimeoutMs: number;
  private tail: Promise<unknown> = Promise.resolve();
  /** Set when the VM is being stopped or destroyed: new freezes are refused. */
  private closing = false;
  /** FIFREEZE / FITHAW calls that timed out and still hold their thread: no new freeze until they return. */
  private stuck = 0;

  constructor(opts: VmFreezerOptions) {
    this.vmId = opts.vmId;
    this.vmDir = opts.vmDir;
    this.log = opts.log;
    this.isRunning = opts.isRunning;
    this.watchdogDir = opts.watchdogDir ?? watchdogDirOf(opts.vmDir);
    this.ioctlTimeoutMs = opts.ioctlTimeoutMs ?? DEFAULT_FSFREEZE_TIMEOUT_MS;
  }

  /** The host dir bind-mounted read-only into the VM. */
  get portDir(): string {
    return path.join(this.vmDir, FREEZE_PORT_DIR);
  }

  /** The host path of the VM's FreezePortService socket. */
  get socketPath(): string {
    return path.join(this.portDir, FREEZE_SOCKET_NAME);
  }

  /**
   * freeze freezes the VM's writable filesystems for at most requestedMs (0 = 1500, clamped to
   * [100, 5000]). Each mount is syncfs'd first (outside the window: nothing is frozen yet),
   * then the watchdog is started and the record persisted, all before the first FIFREEZE. FailedPreconditionError when a freeze holds or the VM does not run
   * (nothing changed); InternalError when a FIFREEZE fails (whatever was frozen is thawed and
   * the watchdog killed first).
   */
  freeze(requestedMs: number): Promise<FreezeResult> {
    return this.serial(async () => {
      if (this.closing) throw new FailedPreconditionError(`vm ${this.vmId} is being stopped`);
      if (this.stuck > 0) throw new FailedPreconditionError(`vm ${this.vmId}: an earlier FIFREEZE/FITHAW has not returned from the kernel yet; nothing frozen`);
      const prev = await this.refresh(this.load());
      if (prev && prev.endedBy === undefined) throw new FailedPreconditionError(`vm ${this.vmId}: a freeze holds already (${statusOf(prev, Date.now()).remainingMs} ms left)`);
      if (!(await this.isRunning())) throw new FailedPreconditionError(`vm ${this.vmId} is not running`);
      const mounts = this.writableMounts();
      if (mounts.length === 0) throw new FailedPreconditionError(`vm ${this.vmId}: no writable filesystem is mounted`);
      const maxFreezeMs = clampFreezeMs(requestedMs);
      const token = newFreezeToken();
      // Write back and commit each filesystem BEFORE the window: the FIFREEZE then has little
      // left to flush, and the sandbox was not held while this ran (podd synced from inside
      // already; this is the host's view of the same mounts, and all a firecracker guest lacks).
      const tSync = performance.now();
      await this.presync(mounts);
      const presyncMs = Math.round(performance.now() - tSync);
      this.removeEndFiles();
      const endFile = path.join(this.vmDir, `freeze-watchdog-${token}.end`);
      const startedAtMs = Date.now();
      const deadlineMs = startedAtMs + maxFreezeMs;
      const wd = await this.armWatchdog(token, deadlineMs, endFile, [...mounts].reverse());
      // The record is persisted BEFORE the first FIFREEZE (a crash in the window leaves a record
      // that recover() and the watchdog thaw by), and no file is written inside the window.
      const frozenAtMs = Date.now();
      const rec: FreezeRecord = {
        schema: FREEZE_RECORD_SCHEMA,
        token,
        mounts,
        maxFreezeMs,
        startedAtMs,
        deadlineMs,
        watchdogPid: wd.pid,
        watchdogStartTicks: wd.startTicks,
        watchdogEndFile: endFile,
        watchdog: 'node',
        freezeMs: 0,
        frozenAtMs,
      };
      try {
        this.save(rec);
      } catch (err) {
        clearDeadline(this.watchdogDir, this.vmId, token);
        this.log.error({ vm_id: this.vmId, err }, 'could not record the freeze; nothing frozen');
        throw new InternalError(`vm ${this.vmId}: could not record the freeze (nothing frozen; see the vmm-supervisor log)`);
      }
      const t0 = performance.now();
      // The filesystems are independent: freeze them at once, so the first is not held while
      // the second's FIFREEZE runs.
      const results = await Promise.allSettled(mounts.map((m) => this.ioctl(m, FIFREEZE)));
      const failed = results.flatMap((r, i) => (r.status === 'rejected' ? [mounts[i]?.guest ?? '?'] : []));
      results.forEach((r, i) => {
        if (r.status === 'rejected') this.log.error({ vm_id: this.vmId, mount: mounts[i]?.host, err: r.reason as unknown }, 'FIFREEZE failed');
      });
      if (failed.length) {
        // thaw first; the watchdog stays until that worked (a thaw that fails is its job then)
        await this.thawMounts(
          mounts.filter((_, i) => results[i]?.status === 'fulfilled'),
          true,
        )
          .then(() => {
            clearDeadline(this.watchdogDir, this.vmId, token);
            this.save({ ...rec, endedBy: 'caller', frozenMs: windowMs(rec, Date.now()) });
          })
          .catch((err: unknown) => this.log.error({ vm_id: this.vmId, err }, 'thaw after a failed FIFREEZE failed; the watchdog thaws at the deadline'));
        throw new InternalError(`vm ${this.vmId}: FIFREEZE of ${failed.join(', ')} failed on the host (thawed; see the vmm-supervisor log)`);
      }
      const freezeMs = Math.round(performance.now() - t0);
      rec.freezeMs = freezeMs;
      this.log.info({ vm_id: this.vmId, max_freeze_ms: maxFreezeMs, presync_ms: presyncMs, freeze_ms: freezeMs, watchdog_pid: wd.pid, mounts: mounts.map((m) => m.guest) }, 'filesystems frozen');
      return { token, maxFreezeMs, deadlineMs, filesystems: mounts.map((m) => m.guest), freezeMs };
    });
  }

  /**
   * thaw ends the freeze named by token: the latest freeze, if it still holds, is thawed now
   * (watchdog process group killed, then FITHAW of every mount at once) and ends by `caller`; one that
   * already ended answers how it ended. InvalidArgumentError (empty token),
   * FailedPreconditionError (not the latest freeze), InternalError (a FITHAW failed).
   */
  thaw(token: string): Promise<ThawResult> {
    return this.serial(async () => {
      const rec = checkThawToken(token, await this.refresh(this.load()));
      if (rec.endedBy !== undefined) return { endedBy: rec.endedBy, frozenMs: rec.frozenMs ?? 0 };
      return this.endNow(rec, 'caller');
    });
  }

  /** status describes the current or latest freeze. */
  status(): Promise<FreezeStatus> {
    return this.serial(async () => statusOf(await this.refresh(this.load()), Date.now()));
  }

  /**
   * ensureThawed ends a freeze that still holds (before the VM is stopped or destroyed: tasks
   * blocked on a frozen filesystem do not die until it is thawed). Recorded as ended by `caller`.
   * Later freezes through this freezer are refused (FAILED_PRECONDITION): the VM is going away.
   */
  ensureThawed(why: string): Promise<void> {
    // From now on the VM cannot freeze itself again between this thaw and its kill.
    this.closing = true;
    return this.serial(async () => {
      const rec = await this.refresh(this.load());
      if (!rec || rec.endedBy !== undefined) return;
      this.log.info({ vm_id: this.vmId, why }, 'thawing the VM filesystems');
      await this.endNow(rec, 'caller');
    });
  }

  /**
   * recover runs at supervisor start: a record whose watchdog finished or died is closed, and
   * every mount of a freeze past its deadline is made sure thawed (FITHAW; "not frozen" is
   * ignored). A freeze whose watchdog still sleeps is left to it.
   */
  recover(): Promise<void> {
    return this.serial(async () => {
      const rec = await this.refresh(this.load());
      if (rec && Date.now() >= rec.deadlineMs) await this.thawMounts(rec.mounts);
    });
  }

  /** load reads the record; undefined when there is none (or it is unreadable: logged). */
  load(): FreezeRecord | undefined {
    const file = path.join(this.vmDir, FREEZE_STATE_FILE);
    if (!existsSync(file)) return undefined;
    try {
      return JSON.parse(readFileSync(file, 'utf8')) as FreezeRecord;
    } catch (err) {
      this.log.warn({ vm_id: this.vmId, err }, 'unreadable freeze record; ignored');
      return undefined;
    }
  }

  private serial<T>(fn: () => Promise<T>): Promise<T> {
    const p = this.tail.then(fn, fn);
    this.tail = p.catch(() => undefined);
    return p;
  }

  /**
   * refresh notices a freeze that ended without us: the watchdog wrote its end file (ended by
   * `watchdog`), or it is gone without one (killed by someone: the mounts are thawed now and it
   * counts as `watchdog`). Persists the change.
   */
  private async refresh(rec: FreezeRecord | undefined): Promise<FreezeRecord | undefined> {
    if (!rec || rec.endedBy !== undefined) return rec;
    // Past the deadline the watchdog is thawing right now: wait for it to finish and record.
    for (const until = Date.now() + DEFAULT_WATCHDOG_FINISH_WAIT_MS; Date.now() >= rec.deadlineMs && Date.now() < until;) {
      if (readEndFile(rec.watchdogEndFile) !== undefined || !watchdogAlive(rec)) break;
      await new Promise((r) => setTimeout(r, WATCHDOG_POLL_MS));
    }
    const end = readEndFile(rec.watchdogEndFile);
    if (end !== undefined) {
      const done: FreezeRecord = { ...rec, endedBy: 'watchdog', frozenMs: windowMs(rec, end) };
      this.save(done);
      observeFreezeWindow(done);
      this.log.info({ vm_id: this.vmId, frozen_ms: done.frozenMs }, 'the freeze watchdog thawed the filesystems');
      return done;
    }
    if (!watchdogAlive(rec)) {
      // Killed without finishing: thaw now (FITHAW of a thawed fs is a no-op).
      this.log.warn({ vm_id: this.vmId, watchdog_pid: rec.watchdogPid }, 'freeze watchdog gone without thawing; thawing now');
      await this.thawMounts(rec.mounts);
      const done: FreezeRecord = { ...rec, endedBy: 'watchdog', frozenMs: windowMs(rec, Math.min(Date.now(), rec.deadlineMs)) };
      this.save(done);
      observeFreezeWindow(done);
      return done;
    }
    return rec;
  }

  private async endNow(rec: FreezeRecord, by: FreezeEnd): Promise<ThawResult> {
    // thaw first, then stop the watchdog: if the thaw fails, the watchdog still ends the freeze
    await this.thawMounts(rec.mounts, true);
    const endMs = Date.now();
    this.releaseWatchdog(rec);
    // the watchdog ended it only if it had thawed before this thaw finished
    const wdEnd = readEndFile(rec.watchdogEndFile);
    const done: FreezeRecord = wdEnd !== undefined && wdEnd <= endMs ? { ...rec, endedBy: 'watchdog', frozenMs: windowMs(rec, wdEnd) } : { ...rec, endedBy: by, frozenMs: windowMs(rec, endMs) };
    this.save(done);
    observeFreezeWindow(done);
    this.log.info({ vm_id: this.vmId, ended_by: done.endedBy, frozen_ms: done.frozenMs }, 'filesystems thawed');
    return { endedBy: done.endedBy!, frozenMs: done.frozenMs! };
  }

  /**
   * presync runs syncfs(2) on every mount at once, each for at most the FIFREEZE timeout; a
   * failure or timeout is logged and the freeze goes on (its FIFREEZE syncs what is left).
   */
  private async presync(mounts: FrozenMount[]): Promise<void> {
    await Promise.all(
      mounts.map(async (m) => {
        const r = await fsSyncfs(m.host, this.ioctlTimeoutMs).catch(() => ({ ok: false as const, errno: -1 }));
        if (!r.ok) this.log.warn({ vm_id: this.vmId, mount: m.host, errno: r.errno }, 'syncfs before the freeze failed or timed out; freezing anyway');
      }),
    );
  }

  /** thawMounts runs FITHAW on every mount at once; "not frozen" (EINVAL) is fine. strict: throw on other errors (after trying all). */
  private async thawMounts(mounts: FrozenMount[], strict = false): Promise<void> {
    const errors: string[] = [];
    // independent filesystems: thawed at once (the watchdog thaws them in reverse order)
    await Promise.all(
      mounts
        .filter((m) => isMountPoint(m.host))
        .map(async (m) => {
          try {
            await this.ioctl(m, FITHAW);
          } catch (err) {
            if (err instanceof IoctlError && err.errno === EINVAL) return;
            errors.push(m.guest);
            this.log.error({ vm_id: this.vmId, mount: m.host, err }, 'FITHAW failed');
          }
        }),
    );
    if (strict && errors.length) throw new InternalError(`vm ${this.vmId}: FITHAW of ${errors.join(', ')} failed on the host (see the vmm-supervisor log)`);
  }

  /** writableMounts: the rootfs upper drive, then the workspace when mounted read-write. */
  private writableMounts(): FrozenMount[] {
    const out: FrozenMount[] = [];
    const upper = path.join(this.vmDir, 'upper-dev');
    if (isMountPoint(upper)) out.push({ host: upper, guest: '/' });
    const ws = path.join(this.vmDir, 'workspace');
    if (isMountPoint(ws) && mountOptions(ws).includes('rw')) out.push({ host: ws, guest: '/workspace' });
    return out;
  }

  /**
   * armWatchdog hands the freeze to the node's watchdog before the first FIFREEZE: the deadline
   * file first, then the watchdog is made sure to run (started when none is alive: the only
   * process start, once per node, not per freeze).
   */
  private async armWatchdog(token: string, deadlineMs: number, endFile: string, thawOrder: FrozenMount[]): Promise<{ pid: number; startTicks: number }> {
    mkdirSync(this.watchdogDir, { recursive: true, mode: 0o700 });
    writeDeadline(this.watchdogDir, this.vmId, { token, deadlineMs, mounts: thawOrder.map((m) => m.host), endFile });
    try {
      return await ensureWatchdog(this.watchdogDir);
    } catch (err) {
      clearDeadline(this.watchdogDir, this.vmId, token);
      throw new InternalError(`vm ${this.vmId}: no freeze watchdog: ${(err as Error).message}; nothing frozen`);
    }
  }

  /** releaseWatchdog stops rec's watchdog from thawing later: the node watchdog's deadline is taken back; an older release's own watchdog is killed. */
  private releaseWatchdog(rec: FreezeRecord): void {
    if (rec.watchdog === 'node') clearDeadline(this.watchdogDir, this.vmId, rec.token);
    else killGroup(rec.watchdogPid, rec.watchdogStartTicks);
  }

  /**
   * ioctl runs FIFREEZE or FITHAW on m on a worker thread, at most ioctlTimeoutMs; IoctlError
   * with the errno when the kernel refuses. A call that times out keeps the freezer from new
   * freezes until it returns; a FIFREEZE that succeeds that late is thawed at once.
   */
  private async ioctl(m: FrozenMount, req: number): Promise<void> {
    let r: IoctlResult;
    try {
      r = await fsIoctl(m.host, req, this.ioctlTimeoutMs, (late) => {
        this.stuck--;
        this.log.warn({ vm_id: this.vmId, mount: m.host, ok: late.ok }, 'a timed-out FIFREEZE/FITHAW returned');
        if (req === FIFREEZE && late.ok) void fsIoctl(m.host, FITHAW, this.ioctlTimeoutMs).catch(() => undefined);
      });
    } catch (err) {
      if (err instanceof IoctlTimeoutError) this.stuck++;
      throw err;
    }
    if (!r.ok) throw new IoctlError(req === FIFREEZE ? 'FIFREEZE' : 'FITHAW', m.host, r.errno);
  }

  private save(rec: FreezeRecord): void {
    writeFileAtomic(path.join(this.vmDir, FREEZE_STATE_FILE), `${JSON.stringify(rec)}\n`);
  }

  private removeEndFiles(): void {
    try {
      for (const n of readdirSync(this.vmDir)) if (n.startsWith('freeze-watchdog-')) rmSync(path.join(this.vmDir, n), { force: true });
    } catch {
      /* no vm dir */
    }
  }
}

/** IoctlError: the kernel refused a FIFREEZE / FITHAW (errno). */
export class IoctlError extends Error {
  constructor(
    what: string,
    mount: string,
    readonly errno: number,
  ) {
    super(`${what} of ${mount} failed: errno ${errno}`);
  }
}

/** readEndFile returns the thaw time the watchdog recorded (Unix epoch ms), or undefined. */
function readEndFile(file: string): number | undefined {
  try {
    const v = Number(readFileSync(file, 'utf8').trim());
    return Number.isFinite(v) && v > 0 ? v : undefined;
  } catch {
    return undefined;
  }
}

/** watchdogAlive: the record's watchdog runs, or /proc could not say (then the freeze is not ended here; see watchdogRunning). */
function watchdogAlive(rec: FreezeRecord): boolean {
  return watchdogRunning(rec.watchdogPid, rec.watchdogStartTicks);
}

/** killGroup SIGKILLs the process group led by pid when pid is still the process started at ticks. */
function killGroup(pid: number, ticks: number): void {
  if (!isSameProcess(pid, ticks)) return;
  try {
    process.kill(-pid, 'SIGKILL');
  } catch {
    /* already gone */
  }
}

/**
 * vmCgroupRunning says from the files of the VM's cgroup (cgroupPath, e.g. `/sandnode/<id>`;
 * read, no process start) whether it runs: it has tasks and is not frozen (cgroup v2
 * `cgroup.events`; v1 the freezer's `freezer.state` and `cgroup.procs`). undefined when
 * neither exists (the caller asks runc).
 */
export function vmCgroupRunning(cgroupPath: string, root = '/sys/fs/cgroup'): boolean | undefined {
  try {
    const ev = readFileSync(path.join(root, cgroupPath, 'cgroup.events'), 'utf8');
    return /^populated 1$/m.test(ev) && !/^frozen 1$/m.test(ev);
  } catch {
    /* not cgroup v2 */
  }
  try {
    const dir = path.join(root, 'freezer', cgroupPath);
    return readFileSync(path.join(dir, 'freezer.state'), 'utf8').trim() === 'THAWED' && readFileSync(path.join(dir, 'cgroup.procs'), 'utf8').trim() !== '';
  } catch {
    return undefined;
  }
}

/** makeFreezePortDir creates `<vmDir>/freeze-port` (0700) and removes a stale socket in it. */
export function makeFreezePortDir(vmDir: string): string {
  const dir = path.join(vmDir, FREEZE_PORT_DIR);
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  rmSync(path.join(dir, FREEZE_SOCKET_NAME), { force: true });
  return dir;
}
