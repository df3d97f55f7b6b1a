/**
 * ExecRunner runs commands for podd's Exec: argv (no shell) in its own process group, stdin
 * written then closed, stdout/stderr as bounded chunks in read order, then one exit event.
 *
 * Memory stays bounded: when more than `highWaterBytes` of output wait for a slow consumer,
 * both pipes are paused (the child then blocks on write) until the consumer catches up.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { constants as osConstants } from 'node:os';
import { stat } from 'node:fs/promises';
import path from 'node:path';
import type { Readable } from 'node:stream';
import { DeadlineExceededError, FailedPreconditionError, InvalidArgumentError, NotFoundError, ResourceExhaustedError } from '@sandnode/shared';
import { DEFAULT_MAX_EXECS, execCap, openFileLimit, MAX_EXEC_ARGS_BYTES, MAX_EXEC_STRING_BYTES, MAX_NAME_BYTES, MAX_PATH_BYTES, MAX_QUOTED_CHARS, MAX_STDIN_BYTES } from './limits';

/** ExecSpec is one command to run (domain form of ExecRequest). */
export interface ExecSpec {
  /** argv is the command and its arguments; argv[0] is looked up in PATH. */
  argv: string[];
  /** env is merged over podd's environment. */
  env?: Record<string, string>;
  /** cwd is absolute; empty means the runner's default cwd. */
  cwd?: string;
  /** stdin is written to the command, which then sees EOF. At most 3 MiB. */
  stdin?: Uint8Array;
  /** timeoutMs kills the process group after this many ms; 0 means no limit. */
  timeoutMs?: number;
}

/** ExecEvent is one event of a run: started first, exit last, output chunks between. */
export type ExecEvent = { kind: 'started'; pid: number } | { kind: 'stdout'; data: Buffer } | { kind: 'stderr'; data: Buffer } | { kind: 'exit'; exitCode: number; signal: string };

export interface ExecRunnerOptions {
  /** Working directory when a spec leaves cwd empty (absolute). */
  defaultCwd: string;
  /** Largest output chunk in bytes (at most 64 KiB). */
  maxChunkBytes: number;
  /** Output bytes queued for the consumer before the pipes are paused (default 256 KiB). */
  highWaterBytes?: number;
  /** Environment commands start from (default: {@link defaultBaseEnv}). */
  baseEnv?: Record<string, string>;
  /**
   * After the command exits, how long to keep reading pipes that a surviving background
   * process still holds open, in ms (default 1000). Then they are closed and exit is sent.
   */
  exitDrainMs?: number;
  /**
   * onBackpressure is told each time a run pauses (true) or resumes (false) its pipes, with the
   * output bytes queued for the consumer at that moment (for metrics and tests).
   */
  onBackpressure?: (paused: boolean, queuedBytes: number) => void;
  /**
   * maxRunning: commands run at once (default DEFAULT_MAX_EXECS, podd key `maxExecs`); fewer
   * when podd's open-file limit, read at each run, leaves room for fewer (execCap). One more is
   * RESOURCE_EXHAUSTED before anything is spawned.
   */
  maxRunning?: number;
  /** openFiles reads podd's soft RLIMIT_NOFILE (default openFileLimit: /proc/self/limits). */
  openFiles?: () => number | undefined;
}

/** Default PATH when podd's own environment has none. */
export const DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';
/** Default output queued before the pipes are paused, in bytes. */
export const DEFAULT_HIGH_WATER_BYTES = 256 * 1024;
/** Default time pipes may stay open after the command exited, in ms. */
export const DEFAULT_EXIT_DRAIN_MS = 1000;

/** An abort error that nice-grpc's middleware (abort-controller-x `isAbortError`) maps to CANCELLED. */
export class ExecAbortError extends Error {
  override name = 'AbortError';
  constructor() {
    super('exec cancelled by the caller');
  }
}

/** podd's own environment for commands: process.env (minus SANDNODE_PODD_*) with PATH, HOME=/root and TERM=xterm filled in when missing. */
export function defaultBaseEnv(): Record<string, string> {
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) if (v !== undefined && !k.startsWith('SANDNODE_PODD_')) env[k] = v;
  env.PATH ??= DEFAULT_PATH;
  env.HOME ??= '/root';
  env.TERM ??= 'xterm';
  return env;
}

/** quote is JSON of s cut to MAX_QUOTED_CHARS characters, for an error message that names a bad value. */
export function quote(s: string): string {
  return s.length > MAX_QUOTED_CHARS ? `${JSON.stringify(s.slice(0, MAX_QUOTED_CHARS))}... (${Buffer.byteLength(s)} bytes)` : JSON.stringify(s);
}

/**
 * pathTooLong says why the kernel would refuse p with ENAMETOOLONG (longer than MAX_PATH_BYTES,
 * or a component longer than MAX_NAME_BYTES), or undefined when it would not.
 */
export function pathTooLong(p: string): string | undefined {
  const n = Buffer.byteLength(p);
  if (n > MAX_PATH_BYTES) return `${n} bytes, at most ${MAX_PATH_BYTES} (PATH_MAX)`;
  const long = p.split('/').find((part) => Buffer.byteLength(part) > MAX_NAME_BYTES);
  if (long !== undefined) return `has a ${Buffer.byteLength(long)}-byte name, at most ${MAX_NAME_BYTES} per name (NAME_MAX)`;
  return undefined;
}

/**
 * validateExecSpec checks a spec without touching the system; throws InvalidArgumentError
 * naming the bad field (`argv`, `env`, `cwd`, `stdin`, `timeout_ms`) and, for sizes, the limit
 * (MAX_EXEC_STRING_BYTES per entry, MAX_EXEC_ARGS_BYTES for argv + env together, argv[0] and
 * cwd at most MAX_PATH_BYTES with names of at most MAX_NAME_BYTES). Messages quote at most
 * MAX_QUOTED_CHARS characters of a bad value.
 */
export function validateExecSpec(spec: ExecSpec): void {
  if (spec.argv.length === 0) throw new InvalidArgumentError('argv: must not be empty');
  if (!spec.argv[0]) throw new InvalidArgumentError('argv: argv[0] must not be empty');
  const argv0Long = pathTooLong(spec.argv[0]);
  if (argv0Long) throw new InvalidArgumentError(`argv: argv[0] ${quote(spec.argv[0])} ${argv0Long}`);
  let total = 0;
  spec.argv.forEach((a, i) => {
    if (a.includes('\0')) throw new InvalidArgumentError(`argv: argv[${i}] contains a NUL byte`);
    const n = Buffer.byteLength(a);
    if (n > MAX_EXEC_STRING_BYTES) throw new InvalidArgumentError(`argv: argv[${i}] is ${n} bytes, at most ${MAX_EXEC_STRING_BYTES} per argument`);
    total += n + 1;
  });
  for (const [k, v] of Object.entries(spec.env ?? {})) {
    if (!k || k.includes('=') || k.includes('\0')) throw new InvalidArgumentError(`env: bad variable name ${JSON.stringify(k)}`);
    if (v.includes('\0')) throw new InvalidArgumentError(`env: value of ${k} contains a NUL byte`);
    const n = Buffer.byteLength(k) + 1 + Buffer.byteLength(v);
    if (n > MAX_EXEC_STRING_BYTES) throw new InvalidArgumentError(`env: ${k} is ${n} bytes as KEY=VALUE, at most ${MAX_EXEC_STRING_BYTES} per variable`);
    total += n + 1;
  }
  if (total > MAX_EXEC_ARGS_BYTES) throw new InvalidArgumentError(`argv + env: ${total} bytes, at most ${MAX_EXEC_ARGS_BYTES} together`);
  if (spec.cwd && (!path.isAbsolute(spec.cwd) || spec.cwd.includes('\0'))) {
    throw new InvalidArgumentError(`cwd: must be an absolute path, got ${quote(spec.cwd)}`);
  }
  const cwdLong = spec.cwd ? pathTooLong(spec.cwd) : undefined;
  if (cwdLong) throw new InvalidArgumentError(`cwd: ${quote(spec.cwd!)} ${cwdLong}`);
  if ((spec.stdin?.length ?? 0) > MAX_STDIN_BYTES) {
    throw new InvalidArgumentError(`stdin: ${spec.stdin?.length} bytes is above the limit of ${MAX_STDIN_BYTES}`);
  }
  const t = spec.timeoutMs ?? 0;
  if (!Number.isInteger(t) || t < 0) throw new InvalidArgumentError(`timeout_ms: must be a non-negative integer`);
}

/** exitCodeOf turns a child's (code, signal) into the contract's exit code (128 + signo). */
export function exitCodeOf(code: number | null, signal: NodeJS.Signals | null): { exitCode: number; signal: string } {
  if (signal) return { exitCode: 128 + (osConstants.signals[signal] ?? 0), signal };
  return { exitCode: code ?? 0, signal: '' };
}

/** killGroup sends sig to the process group led by pid; false when the group is gone. */
export function killGroup(pid: number, sig: NodeJS.Signals): boolean {
  try {
    process.kill(-pid, sig);
    return true;
  } catch {
    return false;
  }
}

/** Slot: one of the maxRunning places a run holds from its check until its child's pipes closed. */
interface Slot {
  spawned: boolean;
  release: () => void;
}

/** ExecRunner starts commands and tracks the running ones (for shutdown). */
export class ExecRunner {
  private readonly children = new Set<ChildProcess>();
  private readonly highWater: number;
  private readonly baseEnv: Record<string, string>;
  private readonly exitDrainMs: number;
  /** runs holding a slot: from the check until the child's pipes closed (or the spawn failed) */
  private slots = 0;

  constructor(private readonly opts: ExecRunnerOptions) {
    this.highWater = opts.highWaterBytes ?? DEFAULT_HIGH_WATER_BYTES;
    this.baseEnv = opts.baseEnv ?? defaultBaseEnv();
    this.exitDrainMs = opts.exitDrainMs ?? DEFAULT_EXIT_DRAIN_MS;
  }

  /** running is the number of commands still running. */
  get running(): number {
    return this.children.size;
  }

  /** signalAll sends sig to the process group of every running command; returns how many. */
  signalAll(sig: NodeJS.Signals): number {
    let n = 0;
    for (const c of this.children) if (c.pid !== undefined && killGroup(c.pid, sig)) n++;
    return n;
  }

  /**
   * run starts spec and yields its events: `started`, output chunks (each at most
   * maxChunkBytes, in read order), then exactly one `exit`. Throws InvalidArgumentError
   * (argv, env, cwd, stdin, timeout_ms), NotFoundError (argv[0] not found),
   * FailedPreconditionError (argv[0] not executable), DeadlineExceededError (timeoutMs passed:
   * the group got SIGKILL and the command was reaped), ResourceExhaustedError (maxRunning
   * commands run, see execCap: nothing was spawned) and an AbortError when signal aborts (the
   * group got SIGKILL). Returning early from the iterator also kills the group.
   */
  async *run(spec: ExecSpec, signal?: AbortSignal): AsyncGenerator<ExecEvent, void, undefined> {
    validateExecSpec(spec);
    const slot: Slot = { spawned: false, release: this.takeSlot() };
    try {
      yield* this.spawnAndStream(spec, slot, signal);
    } finally {
      // a run that ends before its child was spawned gives its slot back here; a spawned one
      // when the child's pipes close
      if (!slot.spawned) slot.release();
    }
  }

  /**
   * takeSlot takes one of the places for a running command (shared by Exec and ExecStream);
   * call the returned release exactly once (more calls do nothing). Errors: RESOURCE_EXHAUSTED
   * (maxRunning commands run, see execCap).
   */
  takeSlot(): () => void {
    const cap = execCap(this.opts.maxRunning ?? DEFAULT_MAX_EXECS, (this.opts.openFiles ?? openFileLimit)());
    if (this.slots >= cap) {
      throw new ResourceExhaustedError(`podd runs ${this.slots} commands, the most it may at once (podd key maxExecs, bounded by its open-file limit); wait for one to end`);
    }
    this.slots++;
    let held = true;
    return () => {
      if (held) this.slots--;
      held = false;
    };
  }

  /** spawnAndStream is run after its slot was taken. */
  private async *spawnAndStream(spec: ExecSpec, slot: Slot, signal?: AbortSignal): AsyncGenerator<ExecEvent, void, undefined> {
    const cwd = spec.cwd || this.opts.defaultCwd;
    await checkCwd(cwd);
    if (signal?.aborted) throw new ExecAbortError();

    const argv0 = spec.argv[0] as string;
    let child: ChildProcess;
    try {
      // spawn throws (not emits) errors such as E2BIG
      child = spawn(argv0, spec.argv.slice(1), {
        cwd,
        env: { ...this.baseEnv, ...(spec.env ?? {}) },
        detached: true, // setsid(): own session and process group, pgid == pid
        stdio: ['pipe', 'pipe', 'pipe'],
      });
    } catch (err) {
      throw spawnError(err, argv0);
    }
    try {
      await new Promise<void>((resolve, reject) => {
        child.once('spawn', resolve);
        child.once('error', reject);
      });
    } catch (err) {
      throw spawnError(err, argv0);
    }
    const pid = child.pid as number;
    this.children.add(child);
    slot.spawned = true;
    child.once('close', slot.release);

    const queue: ExecEvent[] = [];
    let queued = 0;
    let paused = false;
    let closed = false;
    let exited = false;
    let timedOut = false;
    let exit: { exitCode: number; signal: string } = { exitCode: 0, signal: '' };
    let wake: (() => void) | undefined;
    const notify = () => {
      const w = wake;
      wake = undefined;
      w?.();
    };
    const out = child.stdout as Readable;
    const err = child.stderr as Readable;
    const setPaused = (p: boolean) => {
      if (p === paused) return;
      paused = p;
      for (const s of [out, err]) {
        if (p) s.pause();
        else s.resume();
      }
      this.opts.onBackpressure?.(p, queued);
    };
    const onData = (kind: 'stdout' | 'stderr') => (chunk: Buffer) => {
      for (let off = 0; off < chunk.length; off += this.opts.maxChunkBytes) {
        queue.push({ kind, data: chunk.subarray(off, off + this.opts.maxChunkBytes) });
      }
      queued += chunk.length;
      if (queued >= this.highWater) setPaused(true);
      notify();
    };
    out.on('data', onData('stdout'));
    err.on('data', onData('stderr'));

    // stdin: write it all, then close; a command that never reads gets EPIPE, which is fine.
    const stdin = child.stdin;
    stdin?.on('error', () => undefined);
    stdin?.end(spec.stdin && spec.stdin.length > 0 ? Buffer.from(spec.stdin) : undefined);

    // After exit, pipes held open by a surviving background process are closed after a grace
    // period (counted only while the consumer keeps up).
    let drainTimer: NodeJS.Timeout | undefined;
    const armDrain = () => {
      drainTimer = setTimeout(() => {
        if (closed) return;
        if (paused) return armDrain();
        out.destroy();
        err.destroy();
      }, this.exitDrainMs);
    };
    child.once('exit', (code, sig) => {
      exited = true;
      exit = exitCodeOf(code, sig);
      armDrain();
    });
    child.once('close', () => {
      closed = true;
      this.children.delete(child);
      notify();
    });

    let timeoutTimer: NodeJS.Timeout | undefined;
    if (spec.timeoutMs && spec.timeoutMs > 0) {
      timeoutTimer = setTimeout(() => {
        timedOut = true;
        killGroup(pid, 'SIGKILL');
      }, spec.timeoutMs);
    }
    const onAbort = () => {
      killGroup(pid, 'SIGKILL');
      notify();
    };
    signal?.addEventListener('abort', onAbort);

    try {
      yield { kind: 'started', pid };
      for (;;) {
        const ev = queue.shift();
        if (ev) {
          if (ev.kind === 'stdout' || ev.kind === 'stderr') {
            queued -= ev.data.length;
            if (paused && queued <= this.highWater / 2) setPaused(false);
          }
          yield ev;
          continue;
        }
        if (closed) break;
        if (signal?.aborted) throw new ExecAbortError();
        await new Promise<void>((resolve) => (wake = resolve));
      }
      if (timedOut) throw new DeadlineExceededError(`exec timed out after timeout_ms=${spec.timeoutMs}; process group ${pid} was killed`);
      if (!exited) exit = exitCodeOf(child.exitCode, child.signalCode);
      yield { kind: 'exit', ...exit };
    } finally {
      clearTimeout(timeoutTimer);
      clearTimeout(drainTimer);
      signal?.removeEventListener('abort', onAbort);
      if (!closed) {
        // The consumer went away (cancel, error, early return): the command must not outlive it.
        killGroup(pid, 'SIGKILL');
        out.destroy();
        err.destroy();
      }
    }
  }
}

/** checkCwd: cwd must be an existing directory, else InvalidArgumentError naming cwd. */
export async function checkCwd(cwd: string): Promise<void> {
  let st;
  try {
    st = await stat(cwd);
  } catch (e) {
    throw new InvalidArgumentError(`cwd: ${quote(cwd)}: ${(e as NodeJS.ErrnoException).code ?? 'cannot stat'}`);
  }
  if (!st.isDirectory()) throw new InvalidArgumentError(`cwd: ${quote(cwd)} is not a directory`);
}

/** spawnError maps a spawn failure (errno code) to a domain error: NOT_FOUND (ENOENT), INVALID_ARGUMENT (E2BIG, ENAMETOOLONG), FAILED_PRECONDITION (EACCES, ENOEXEC, EISDIR); others pass. */
export function spawnError(err: unknown, argv0: string): unknown {
  const code = (err as NodeJS.ErrnoException).code;
  if (code === 'ENOENT') return new NotFoundError(`argv[0]: ${argv0}: command not found`);
  // argv[0] passed validateExecSpec, but a PATH directory + argv[0], or a symlink, may still be too long
  if (code === 'ENAMETOOLONG') return new InvalidArgumentError(`argv[0]: ${quote(argv0)}: a path on the way to it is too long for the kernel (ENAMETOOLONG)`);
  if (code === 'E2BIG') {
    return new InvalidArgumentError(
      `argv + env: too long for the kernel (E2BIG) together with podd's environment; each entry at most ${MAX_EXEC_STRING_BYTES} bytes, all at most ${MAX_EXEC_ARGS_BYTES}`,
    );
  }
  if (code === 'EACCES' || code === 'ENOEXEC' || code === 'EISDIR') {
    return new FailedPreconditionError(`argv[0]: ${argv0}: not executable (${code})`);
  }
  return err;
}
