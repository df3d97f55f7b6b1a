/**
 * ExecSessions: commands started by ExecStream. Each runs in its own process group (pipes) or
 * session (pty), takes one of the runner's slots (podd key maxExecs) and outlives its client:
 *
 *   start -> attached <-> detached -> exited -> (delivered | 60 s) -> forgotten
 *
 * While a client is attached its output flows with backpressure (the sources pause above
 * highWaterBytes queued, the command then blocks on write). While none is, the command keeps
 * running and at most keepBytes (1 MiB) of output is kept: older chunks are dropped and counted
 * (`droppedBytes`, told to the next attach). A command detached for detachKeepMs gets SIGKILL.
 * Stdin writes wait for the command's input to drain, so a command that never reads makes the
 * caller wait instead of podd's memory grow.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { accessSync, closeSync, constants as fsConstants, statSync } from 'node:fs';
import path from 'node:path';
import tty from 'node:tty';
import type { Readable, Writable } from 'node:stream';
import { AbortedError, FailedPreconditionError, InvalidArgumentError, NotFoundError, SIGNAL_PROCESS_SIGNALS } from '@sandnode/shared';
import { checkCwd, defaultBaseEnv, ExecAbortError, exitCodeOf, killGroup, spawnError, validateExecSpec, type ExecRunner } from './exec';
import { checkWindowSize, DEFAULT_WINDOW, openPty, setsidPath, setWindowSize, type WindowSize } from './pty';

/** Output kept per command while no client is attached, bytes (older output is dropped). */
export const DEFAULT_KEEP_BYTES = 1024 * 1024;
/** Default detach_keep_ms: a command with no client attached is killed after this, ms (10 min). */
export const DEFAULT_DETACH_KEEP_MS = 600_000;
/** Largest detach_keep_ms, ms (a day). */
export const MAX_DETACH_KEEP_MS = 86_400_000;
/** A finished command stays listed (and attachable for its last output) this long, ms. */
export const FINISHED_KEEP_MS = 60_000;
/** Most finished commands kept; the oldest is forgotten first. */
export const MAX_FINISHED = 64;
/** Most bytes of a command's argv ListProcesses shows (longer ones are cut, marked "..."), so that the list of every command fits a gRPC message. */
export const MAX_LISTED_ARGV_BYTES = 4096;
/** Signals a caller may send by name. */
export const ALLOWED_SIGNALS: readonly NodeJS.Signals[] = SIGNAL_PROCESS_SIGNALS;

/** SessionSpec is one command for ExecStream (domain form of ExecStreamStart). */
export interface SessionSpec {
  argv: string[];
  env?: Record<string, string>;
  cwd?: string;
  /** kill the group after this many ms; 0: no limit */
  timeoutMs?: number;
  pty?: boolean;
  /** pty window; undefined or 0 x 0: 24 x 80 */
  size?: WindowSize;
  /** ms without a client before SIGKILL; 0: DEFAULT_DETACH_KEEP_MS */
  detachKeepMs?: number;
}

/** SessionEvent is one event an attached client receives: started first, exit last. */
export type SessionEvent =
  | { kind: 'started'; pid: number; execId: string; pty: boolean; droppedBytes: number }
  | { kind: 'stdout'; data: Buffer }
  | { kind: 'stderr'; data: Buffer }
  | { kind: 'exit'; exitCode: number; signal: string };

/** ProcessView is what ListProcesses shows of a command. */
export interface ProcessView {
  execId: string;
  pid: number;
  argv: string[];
  startedAtMs: number;
  /** when the command exited (unix ms); 0 while it runs */
  endedAtMs: number;
  running: boolean;
  exitCode: number;
  signal: string;
  pty: boolean;
  attached: boolean;
}

export interface ExecSessionsOptions {
  /** runner whose slots (maxExecs) the sessions share */
  runner: ExecRunner;
  defaultCwd: string;
  /** largest output chunk, bytes */
  maxChunkBytes: number;
  baseEnv?: Record<string, string>;
  /** output queued for an attached client before the sources pause, bytes (default 256 KiB) */
  highWaterBytes?: number;
  /** output kept while detached, bytes (default DEFAULT_KEEP_BYTES) */
  keepBytes?: number;
  /** after exit, how long pipes held by a background process are still read, ms (default 1000) */
  exitDrainMs?: number;
}

/** parseSignal checks a signal name against ALLOWED_SIGNALS; InvalidArgumentError naming field. */
export function parseSignal(field: string, name: string): NodeJS.Signals {
  if (!(ALLOWED_SIGNALS as readonly string[]).includes(name)) throw new InvalidArgumentError(`${field}: ${JSON.stringify(name.slice(0, 40))} is not one of ${ALLOWED_SIGNALS.join(', ')}`);
  return name as NodeJS.Signals;
}

/** Session is one command of ExecSessions. */
export class Session {
  readonly startedAtMs = Date.now();
  exit: { exitCode: number; signal: string } | undefined;
  /** when the command exited (unix ms); 0 while it runs */
  exitedAtMs = 0;
  /** the output sources are closed: nothing more comes */
  ended = false;
  queue: Array<{ kind: 'stdout' | 'stderr'; data: Buffer }> = [];
  queued = 0;
  droppedBytes = 0;
  /** the attached client: abort() kicks it (another client attached) */
  attachment: AbortController | undefined;
  wake: (() => void) | undefined;
  paused = false;
  detachTimer: NodeJS.Timeout | undefined;
  stdinClosed = false;
  finishedAtMs = 0;

  constructor(
    readonly execId: string,
    readonly child: ChildProcess,
    readonly pid: number,
    readonly argv: string[],
    readonly pty: { master: number; stream: tty.ReadStream } | undefined,
    readonly sources: Readable[],
    readonly input: Writable | undefined,
    readonly detachKeepMs: number,
  ) {}

  notify(): void {
    const w = this.wake;
    this.wake = undefined;
    w?.();
  }

  setPaused(p: boolean): void {
    if (p === this.paused) return;
    this.paused = p;
    for (const s of this.sources) {
      if (p) s.pause();
      else s.resume();
    }
  }

  /** write passes stdin on and resolves once the command's input took it (waits while it is full). Errors: FAILED_PRECONDITION (stdin closed). */
  async write(data: Buffer): Promise<void> {
    if (!this.input || this.stdinClosed || this.input.destroyed) throw new FailedPreconditionError(`exec ${this.execId}: stdin is closed`);
    if (data.length === 0) return;
    const input = this.input;
    if (input.write(data)) return;
    await new Promise<void>((resolve) => {
      const done = () => {
        input.off('drain', done);
        input.off('close', done);
        this.child.off('exit', done);
        resolve();
      };
      input.on('drain', done);
      input.on('close', done);
      this.child.once('exit', done);
    });
  }

  /** closeStdin closes standard input (pipes) or sends the terminal's EOF character ^D (pty). */
  closeStdin(): void {
    if (this.pty) {
      if (!this.input?.destroyed) this.input?.write(Buffer.from([4]));
      return;
    }
    this.stdinClosed = true;
    this.input?.end();
  }

  /** signal sends sig to the command's process group. Errors: FAILED_PRECONDITION (exited). */
  signal(sig: NodeJS.Signals): void {
    if (this.exit || !killGroup(this.pid, sig)) throw new FailedPreconditionError(`exec ${this.execId} (pid ${this.pid}) already exited`);
  }

  /** resize sets the pty's window. Errors: INVALID_ARGUMENT (size out of range), FAILED_PRECONDITION (no pty). */
  resize(size: WindowSize): void {
    checkWindowSize('resize', size);
    if (!this.pty) throw new FailedPreconditionError(`exec ${this.execId} has no pty to resize`);
    // the master fd is open while its stream is (the stream closes it)
    if (!this.ended) setWindowSize(this.pty.master, size);
  }

  view(): ProcessView {
    return {
      execId: this.execId,
      pid: this.pid,
      argv: listedArgv(this.argv),
      startedAtMs: this.startedAtMs,
      endedAtMs: this.exitedAtMs,
      running: !this.exit,
      exitCode: this.exit?.exitCode ?? 0,
      signal: this.exit?.signal ?? '',
      pty: !!this.pty,
      attached: !!this.attachment,
    };
  }
}

/** ExecSessions starts, tracks and attaches to ExecStream commands. */
export class ExecSessions {
  private readonly sessions = new Map<string, Session>();
  private readonly highWater: number;
  private readonly keepBytes: number;
  private readonly baseEnv: Record<string, string>;

  constructor(private readonly o: ExecSessionsOptions) {
    this.highWater = o.highWaterBytes ?? 256 * 1024;
    this.keepBytes = o.keepBytes ?? DEFAULT_KEEP_BYTES;
    this.baseEnv = o.baseEnv ?? defaultBaseEnv();
  }

  /**
   * start spawns spec; the command runs detached until attach. Errors: INVALID_ARGUMENT (argv,
   * env, cwd, timeout, size, detach_keep_ms), NOT_FOUND (argv[0]), FAILED_PRECONDITION (not
   * executable; pty without koffi), RESOURCE_EXHAUSTED (maxExecs).
   */
  async start(spec: SessionSpec): Promise<Session> {
    validateExecSpec({ argv: spec.argv, env: spec.env, cwd: spec.cwd, timeoutMs: spec.timeoutMs });
    const keep = spec.detachKeepMs || DEFAULT_DETACH_KEEP_MS;
    if (!Number.isInteger(keep) || keep < 0 || keep > MAX_DETACH_KEEP_MS) throw new InvalidArgumentError(`detach_keep_ms: at most ${MAX_DETACH_KEEP_MS}`);
    const size = spec.size && (spec.size.rows || spec.size.cols) ? spec.size : DEFAULT_WINDOW;
    if (spec.pty) checkWindowSize('size', size);
    const cwd = spec.cwd || this.o.defaultCwd;
    await checkCwd(cwd);
    const env = { ...this.baseEnv, ...(spec.env ?? {}) };
    const argv0 = spec.argv[0] as string;
    const release = this.o.runner.takeSlot();
    let child: ChildProcess;
    let pty: { master: number; slave: number } | undefined;
    try {
      if (spec.pty) {
        // setsid would exec argv[0] itself: find it first so a typo is NOT_FOUND, not exit 127
        lookPath(argv0, env.PATH ?? '');
        const p = openPty(size);
        pty = p;
        child = spawn(setsidPath(), ['-c', argv0, ...spec.argv.slice(1)], { cwd, env, stdio: [p.slave, p.slave, p.slave] });
      } else {
        child = spawn(argv0, spec.argv.slice(1), { cwd, env, detached: true, stdio: ['pipe', 'pipe', 'pipe'] });
      }
      await new Promise<void>((resolve, reject) => {
        child.once('spawn', resolve);
        child.once('error', reject);
      });
    } catch (err) {
      release();
      if (pty) {
        closeQuietly(pty.master);
        closeQuietly(pty.slave);
      }
      throw spawnError(err, argv0);
    }
    let stream: tty.ReadStream | undefined;
    if (pty) {
      closeQuietly(pty.slave);
      stream = new tty.ReadStream(pty.master);
    }
    const sources = stream ? [stream] : [child.stdout as Readable, child.stderr as Readable];
    const input = stream ?? child.stdin ?? undefined;
    input?.on('error', () => undefined);
    const s = new Session(newExecId(), child, child.pid as number, [...spec.argv], stream && pty ? { master: pty.master, stream } : undefined, sources, input, keep);
    this.sessions.set(s.execId, s);
    this.wire(s, spec.timeoutMs ?? 0, release);
    this.detached(s);
    return s;
  }

  private wire(s: Session, timeoutMs: number, release: () => void): void {
    const onData = (kind: 'stdout' | 'stderr') => (chunk: Buffer) => {
      for (let off = 0; off < chunk.length; off += this.o.maxChunkBytes) s.queue.push({ kind, data: chunk.subarray(off, off + this.o.maxChunkBytes) });
      s.queued += chunk.length;
      if (s.attachment) {
        if (s.queued >= this.highWater) s.setPaused(true);
      } else {
        this.trim(s);
      }
      s.notify();
    };
    let open = s.sources.length;
    const sourceDone = () => {
      if (--open > 0) return;
      s.ended = true;
      release();
      s.notify();
      this.finishIfDone(s);
    };
    s.sources.forEach((src, i) => {
      src.on('data', onData(s.pty || i === 0 ? 'stdout' : 'stderr'));
      // a pty master reads EIO once every slave fd closed: that is its end
      src.on('error', () => src.destroy());
      src.once('close', sourceDone);
    });
    const timer = timeoutMs > 0 ? setTimeout(() => killGroup(s.pid, 'SIGKILL'), timeoutMs) : undefined;
    s.child.once('exit', (code, sig) => {
      clearTimeout(timer);
      s.exit = exitCodeOf(code, sig);
      s.exitedAtMs = Date.now();
      clearTimeout(s.detachTimer);
      // pipes (or the pty) still held by a background process are closed after a grace period
      const drain = () =>
        setTimeout(() => {
          if (s.ended) return;
          if (s.paused) return void drain();
          for (const src of s.sources) src.destroy();
        }, this.o.exitDrainMs ?? 1000).unref();
      drain();
      s.notify();
      this.finishIfDone(s);
    });
  }

  /** trim drops the oldest output of a detached session above keepBytes. */
  private trim(s: Session): void {
    while (s.queued > this.keepBytes && s.queue.length > 0) {
      const c = s.queue.shift()!;
      s.queued -= c.data.length;
      s.droppedBytes += c.data.length;
    }
  }

  /** detached: no client; the sources flow (output is trimmed), and the keep timer runs. */
  private detached(s: Session): void {
    s.attachment = undefined;
    s.setPaused(false);
    this.trim(s);
    clearTimeout(s.detachTimer);
    if (!s.exit) s.detachTimer = setTimeout(() => killGroup(s.pid, 'SIGKILL'), s.detachKeepMs).unref();
    this.finishIfDone(s);
  }

  private finishIfDone(s: Session): void {
    if (!s.exit || !s.ended || s.finishedAtMs) return;
    s.finishedAtMs = Date.now();
    setTimeout(() => this.forget(s), FINISHED_KEEP_MS).unref();
    const finished = [...this.sessions.values()].filter((x) => x.finishedAtMs);
    for (const old of finished.slice(0, Math.max(0, finished.length - MAX_FINISHED))) this.forget(old);
  }

  private forget(s: Session): void {
    if (this.sessions.get(s.execId) === s && !s.attachment) this.sessions.delete(s.execId);
  }

  /** get returns the session of execId. Errors: NOT_FOUND. */
  get(execId: string): Session {
    const s = this.sessions.get(execId);
    if (!s) throw new NotFoundError(`exec ${JSON.stringify(execId.slice(0, 40))}: no such command (finished ones are kept ${FINISHED_KEEP_MS / 1000} s)`);
    return s;
  }

  /** find names a session by exec id or pid (exactly one). Errors: INVALID_ARGUMENT (neither or both), NOT_FOUND (any other pid included). */
  find(execId: string, pid: number): Session {
    if (!!execId === !!pid) throw new InvalidArgumentError('exec_id, pid: name the command by exactly one of them');
    if (execId) return this.get(execId);
    for (const s of this.sessions.values()) if (s.pid === pid) return s;
    throw new NotFoundError(`pid ${pid}: not a command exec started (only those can be signalled; \`sandbox ps\` lists them, finished ones for ${FINISHED_KEEP_MS / 1000} s)`);
  }

  /** list shows every session, oldest first. */
  list(): ProcessView[] {
    return [...this.sessions.values()].sort((a, b) => a.startedAtMs - b.startedAtMs).map((s) => s.view());
  }

  /** signalAll sends sig to every running session's group; returns how many. */
  signalAll(sig: NodeJS.Signals): number {
    let n = 0;
    for (const s of this.sessions.values()) if (!s.exit && killGroup(s.pid, sig)) n++;
    return n;
  }

  /**
   * attach streams s to one client: `started` (with the output dropped while detached), the kept
   * output, live output, then `exit`. A later attach takes over: this one then throws
   * AbortedError. signal aborting (the client went away) detaches: the command runs on.
   */
  async *attach(s: Session, signal: AbortSignal): AsyncGenerator<SessionEvent, void, undefined> {
    s.attachment?.abort();
    const me = new AbortController();
    s.attachment = me;
    clearTimeout(s.detachTimer);
    const onAbort = () => s.notify();
    signal.addEventListener('abort', onAbort);
    me.signal.addEventListener('abort', onAbort);
    try {
      const dropped = s.droppedBytes;
      s.droppedBytes = 0;
      yield { kind: 'started', pid: s.pid, execId: s.execId, pty: !!s.pty, droppedBytes: dropped };
      for (;;) {
        if (me.signal.aborted) throw new AbortedError(`exec ${s.execId}: another client attached`);
        if (signal.aborted) throw new ExecAbortError();
        const c = s.queue.shift();
        if (c) {
          s.queued -= c.data.length;
          if (s.paused && s.queued <= this.highWater / 2) s.setPaused(false);
          yield c;
          continue;
        }
        if (s.ended && s.exit) {
          yield { kind: 'exit', ...s.exit };
          return;
        }
        await new Promise<void>((resolve) => (s.wake = resolve));
      }
    } finally {
      signal.removeEventListener('abort', onAbort);
      if (s.attachment === me) this.detached(s);
    }
  }
}

/** listedArgv is argv cut to MAX_LISTED_ARGV_BYTES in all (a cut entry, and the list, end with "..."). */
export function listedArgv(argv: string[]): string[] {
  const out: string[] = [];
  let left = MAX_LISTED_ARGV_BYTES;
  for (const a of argv) {
    const n = Buffer.byteLength(a);
    if (n <= left) {
      out.push(a);
      left -= n;
      continue;
    }
    out.push(
      `${Buffer.from(a)
        .subarray(0, Math.max(0, left))
        .toString()
        .replace(/\uFFFD$/, '')}...`,
    );
    break;
  }
  return out;
}

function newExecId(): string {
  return `ex-${randomBytes(8).toString('hex')}`;
}

function closeQuietly(fd: number): void {
  try {
    closeSync(fd);
  } catch {
    // already closed
  }
}

/** lookPath checks argv0 is an executable file (PATH search when it has no slash). Errors: NOT_FOUND, FAILED_PRECONDITION (not executable). */
function lookPath(argv0: string, pathVar: string): void {
  const candidates = argv0.includes('/')
    ? [argv0]
    : pathVar
        .split(':')
        .filter(Boolean)
        .map((d) => path.join(d, argv0));
  for (const c of candidates) {
    try {
      if (!statSync(c).isFile()) continue;
    } catch {
      continue;
    }
    try {
      accessSync(c, fsConstants.X_OK);
      return;
    } catch {
      throw new FailedPreconditionError(`argv[0]: ${argv0}: not executable (EACCES)`);
    }
  }
  throw new NotFoundError(`argv[0]: ${argv0}: command not found`);
}
