/**
 * Process helpers: identify a process across pid reuse, and run host commands with their
 * output captured and errors that say what failed.
 */
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import os from 'node:os';
import { InternalError } from './errors';

/**
 * processStartTicks returns field 22 (starttime, clock ticks after boot) of /proc/<pid>/stat,
 * or undefined when no such process exists. pid + start ticks identify a process: a reused pid
 * has a later start time (proc(5)).
 */
export function processStartTicks(pid: number): number | undefined {
  if (!Number.isInteger(pid) || pid <= 0) return undefined;
  let stat: string;
  try {
    stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return undefined;
  }
  // comm (field 2) may contain spaces and parens: split after the last ")".
  const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // rest[0] is field 3 (state); field 22 is rest[19].
  const v = Number(rest[19]);
  return Number.isFinite(v) ? v : undefined;
}

/** isSameProcess says whether pid is alive and started at startTicks. */
export function isSameProcess(pid: number, startTicks: number): boolean {
  const t = processStartTicks(pid);
  return t !== undefined && t === startTicks;
}

/**
 * What /proc says of a process that started at given start ticks: `alive` (it runs, not a
 * zombie), `gone` (no such process, a zombie, or the pid was reused), or `unknown` when
 * /proc/<pid>/stat could not be read for another reason (EMFILE/ENFILE when the caller is out
 * of file descriptors, EACCES, ENOMEM ...): nothing may be decided on `unknown`.
 */
export type Liveness = 'alive' | 'gone' | 'unknown';

/** The errors of reading /proc/<pid>/stat that mean the process does not exist (any more). */
const GONE_ERRNOS = new Set(['ENOENT', 'ESRCH']);

/**
 * processLiveness reads /proc/<pid>/stat once and says whether pid still runs as the process
 * that started at startTicks (see {@link Liveness}). Unlike isSameProcess, a read that failed
 * for a reason other than "no such process" answers `unknown`, never `gone`: a caller short of
 * file descriptors (a sandbox flooding the egress proxy to the server's RLIMIT_NOFILE) must not
 * take a live VM for a dead one (attacker finding: the reaper marked every sandbox ERROR).
 */
export function processLiveness(pid: number, startTicks: number): Liveness {
  if (!Number.isInteger(pid) || pid <= 0) return 'gone';
  let stat: string;
  try {
    stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch (err) {
    return GONE_ERRNOS.has((err as NodeJS.ErrnoException).code ?? '') ? 'gone' : 'unknown';
  }
  const close = stat.lastIndexOf(')');
  if (close < 0) return 'unknown';
  const rest = stat.slice(close + 2).split(' ');
  const ticks = Number(rest[19]);
  if (!Number.isFinite(ticks)) return 'unknown';
  if (ticks !== startTicks || rest[0] === 'Z' || rest[0] === 'X') return 'gone';
  return 'alive';
}

/** How long openFilesLimit keeps what it read of /proc/self/limits, ms. */
const LIMITS_CACHE_MS = 1000;
let limitsCache: { at: number; soft: number | undefined } | undefined;

/**
 * openFilesLimit returns this process's soft RLIMIT_NOFILE (the "Max open files" line of
 * /proc/self/limits; read at most every second, since the limit can be changed from outside
 * with prlimit(1)), or undefined when it cannot be read or is unlimited.
 */
export function openFilesLimit(now = Date.now()): number | undefined {
  if (limitsCache && now - limitsCache.at < LIMITS_CACHE_MS) return limitsCache.soft;
  let soft: number | undefined;
  try {
    const line = readFileSync('/proc/self/limits', 'utf8')
      .split('\n')
      .find((l) => l.startsWith('Max open files'));
    const v = Number(line?.slice('Max open files'.length).trim().split(/\s+/)[0]);
    soft = Number.isSafeInteger(v) && v > 0 ? v : undefined;
  } catch {
    soft = limitsCache?.soft; // out of descriptors, say: keep the last known value
  }
  limitsCache = { at: now, soft };
  return soft;
}

/** processState returns the state letter of /proc/<pid>/stat (R, S, D, Z, T ...), or undefined. */
export function processState(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
  } catch {
    return undefined;
  }
}

export interface RunResult {
  stdout: string;
  stderr: string;
}

/** Default time a host command may take, in ms. */
export const DEFAULT_COMMAND_TIMEOUT_MS = 60_000;

/**
 * run executes a host command (no shell) and resolves with its output; it rejects with an
 * InternalError that names the command, its exit code and stderr when it fails.
 */
export function run(cmd: string, args: string[], opts: { timeoutMs?: number; input?: string; signal?: AbortSignal } = {}): Promise<RunResult> {
  return new Promise((resolve, reject) => {
    const child = execFile(cmd, args, { timeout: opts.timeoutMs ?? DEFAULT_COMMAND_TIMEOUT_MS, maxBuffer: 64 * 1024 * 1024, signal: opts.signal }, (err, stdout, stderr) => {
      if (err) {
        const e = err as NodeJS.ErrnoException & { code?: unknown };
        const how = typeof e.code === 'number' ? `exit ${e.code}` : String(e.code ?? e.message);
        reject(new CommandError(`${cmd} ${args.join(' ')}: ${how}: ${String(stderr).trim() || e.message}`, String(stderr), typeof e.code === 'number' ? e.code : -1));
        return;
      }
      resolve({ stdout: String(stdout), stderr: String(stderr) });
    });
    if (opts.input !== undefined) child.stdin?.end(opts.input);
  });
}

/** A host command that failed; stderr and exitCode say how. */
export class CommandError extends InternalError {
  constructor(
    message: string,
    readonly stderr: string,
    readonly exitCode: number,
  ) {
    super(message);
  }
}

/**
 * Niceness of a new daemon while it boots beside the one it replaces (`upgrade server`,
 * `upgrade ublk-manager`): on a small node the new process's start-up (module loading, JIT)
 * would take CPU from the daemon still serving, which shows as a gap in its answers. The new
 * daemon returns to 0 (restoreNormalPriority) the moment it starts the handover itself.
 */
export const STANDBY_BOOT_NICE = 10;

/** niceWhileBooting lowers pid's priority to STANDBY_BOOT_NICE; false when the OS refused (then nothing changed). */
export function niceWhileBooting(pid: number): boolean {
  try {
    os.setPriority(pid, STANDBY_BOOT_NICE);
    return true;
  } catch {
    return false;
  }
}

/**
 * restoreNormalPriority sets this process's niceness back to 0 when it is above (raising a
 * priority needs root / CAP_SYS_NICE); returns the niceness it had, or undefined when the OS
 * refused (the handover then runs niced, slower but correct).
 */
export function restoreNormalPriority(): number | undefined {
  const was = os.getPriority();
  if (was <= 0) return was;
  try {
    os.setPriority(0);
    return was;
  } catch {
    return undefined;
  }
}
