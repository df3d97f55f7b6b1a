/**
 * One way to run a daemon in the background and to stop it: spawn it detached with its output
 * appended to a log file, wait until it says it is ready (or exits, or runs out of time), and
 * stop a process by signal, waiting until it is really gone. `up` (stack.ts), `upgrade server`
 * (upgrade.ts) and `upgrade ublk-manager` (upgrade-ublk.ts) all start and stop daemons this way.
 */
import { spawn } from 'node:child_process';
import { closeSync, constants, fchmodSync, fstatSync, mkdirSync, openSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { processLiveness, processStartTicks } from '@sandnode/shared';

/** Poll interval of {@link waitForDaemon}, ms. */
export const DAEMON_POLL_MS = 50;
/** Poll interval of {@link stopProcess} while it waits for an exit, ms. */
export const EXIT_POLL_MS = 20;
/** Lines of a daemon's log that {@link tail} returns by default. */
export const DEFAULT_TAIL_LINES = 15;

/** A daemon started by {@link spawnDaemon}. */
export interface SpawnedDaemon {
  /** its host pid */
  pid: number;
  /** the log file its stdout and stderr are appended to (absolute) */
  logPath: string;
  /** the log file's length in bytes before the daemon wrote to it (where its own output starts) */
  logStart: number;
  /** how it ended: its exit code, or "null (signal SIGKILL)"; undefined while it runs */
  exited(): number | string | undefined;
}

/** What {@link spawnDaemon} starts. */
export interface DaemonSpec {
  /** the daemon's entry point */
  script: string;
  /** the Node binary that runs it (default: this process's, `process.execPath`; another build's: nodeFor) */
  node?: string;
  /** its whole environment */
  env: NodeJS.ProcessEnv;
  /** the log file (created with its dir when missing; appended to) */
  logPath: string;
  /** its working dir (default: this process's) */
  cwd?: string;
}

/**
 * spawnDaemon starts spec.script detached (its own session, stdin ignored, stdout and stderr
 * appended to spec.logPath) so that it outlives this process. Throws Error when no process
 * could be started.
 */
export function spawnDaemon(spec: DaemonSpec): SpawnedDaemon {
  // the dirs above the log dir (the run dir and its parents, when missing) get the default mode:
  // a 0700 parent made here would keep the sandboxes' user namespace root from the run dir
  mkdirSync(path.dirname(path.dirname(spec.logPath)), { recursive: true });
  mkdirSync(path.dirname(spec.logPath), { recursive: true, mode: 0o700 });
  // Daemon logs name sandboxes, paths and request metadata: root only (issue 10 §2). A log an
  // older release made world-readable is tightened too.
  // never through a symlink (the fchmod below would change its target)
  const out = openSync(spec.logPath, constants.O_WRONLY | constants.O_APPEND | constants.O_CREAT | constants.O_NOFOLLOW, 0o600);
  fchmodSync(out, 0o600);
  let logStart: number;
  let child;
  try {
    logStart = fstatSync(out).size;
    child = spawn(spec.node ?? process.execPath, [spec.script], { detached: true, stdio: ['ignore', out, out], env: spec.env, cwd: spec.cwd ?? process.cwd() });
  } finally {
    closeSync(out);
  }
  child.unref();
  if (!child.pid) throw new Error(`could not start ${spec.script}`);
  let exited: number | string | undefined;
  child.once('exit', (code, sig) => (exited = code ?? `null (signal ${sig})`));
  return { pid: child.pid, logPath: spec.logPath, logStart, exited: () => exited };
}

/** How {@link waitForDaemon} waits and what it throws. */
export interface WaitForDaemonOptions {
  /** longest wait, ms */
  timeoutMs: number;
  /** poll interval, ms (default {@link DAEMON_POLL_MS}) */
  pollMs?: number;
  /** the error to throw when the daemon exits first; gets its exit as {@link SpawnedDaemon.exited} says it */
  onExit(exit: number | string): Error;
  /** the error to throw after timeoutMs */
  onTimeout(): Error;
  /** stop the daemon (SIGKILL) before throwing the timeout error, so that a hung one does not linger */
  killOnTimeout?: boolean;
}

/**
 * waitForDaemon polls ready() until it returns a value (not undefined) and returns that value
 * (a daemon that said it is ready, e.g. by a log line, and then exited still counts as ready).
 * Throws opts.onExit(...) when the daemon exited without being ready and opts.onTimeout()
 * after opts.timeoutMs (killing the daemon first when opts.killOnTimeout). An error thrown by
 * ready() propagates.
 */
export async function waitForDaemon<T>(d: SpawnedDaemon, ready: () => Promise<T | undefined> | T | undefined, opts: WaitForDaemonOptions): Promise<T> {
  const deadline = Date.now() + opts.timeoutMs;
  for (;;) {
    const exit = d.exited();
    const v = await ready();
    if (v !== undefined) return v;
    // ready() ran after the exit was seen: what the daemon said before it exited counts
    if (exit !== undefined) throw opts.onExit(exit);
    if (Date.now() > deadline) {
      if (opts.killOnTimeout) await stopProcess(d.pid, { signal: 'SIGKILL' });
      throw opts.onTimeout();
    }
    await sleep(opts.pollMs ?? DAEMON_POLL_MS);
  }
}

/** How {@link stopProcess} stops a process. */
export interface StopProcessOptions {
  /** the first signal (default SIGTERM) */
  signal?: NodeJS.Signals;
  /** how long to wait for the exit after it, ms (default: no bound) */
  timeoutMs?: number;
  /** send SIGKILL when it is still alive after timeoutMs, then wait for the exit (default false: give up) */
  killAfterTimeout?: boolean;
}

/**
 * stopProcess sends pid a signal and waits until that process (the one with its current start
 * time: a reused pid is not waited for) has exited or is a zombie. Returns false when no such
 * process ran, else whether it is gone (false only when it outlived opts.timeoutMs and
 * opts.killAfterTimeout is off).
 */
export async function stopProcess(pid: number, opts: StopProcessOptions = {}): Promise<boolean> {
  const ticks = processStartTicks(pid);
  if (!pid || ticks === undefined) return false;
  // a /proc read that fails for another reason than "no such process" (EMFILE ...) is no exit:
  // a daemon still running must not be reported stopped (its successor would start beside it)
  const alive = () => processLiveness(pid, ticks) !== 'gone';
  const waitGone = async (ms: number) => {
    const deadline = Date.now() + ms;
    while (alive() && Date.now() < deadline) await sleep(EXIT_POLL_MS);
    return !alive();
  };
  signal(pid, opts.signal ?? 'SIGTERM');
  if (await waitGone(opts.timeoutMs ?? Infinity)) return true;
  if (!opts.killAfterTimeout) return false;
  signal(pid, 'SIGKILL');
  return waitGone(Infinity);
}

/** signal sends sig to pid; a process that is already gone is not an error. */
function signal(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ESRCH') throw err;
  }
}

/** tail returns the last lines of a (log) file; "" when it cannot be read. */
export function tail(file: string, lines = DEFAULT_TAIL_LINES): string {
  try {
    return readFileSync(file, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
  } catch {
    return '';
  }
}

/** sleep resolves after ms milliseconds. */
export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
