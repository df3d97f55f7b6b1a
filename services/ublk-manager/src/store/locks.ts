/**
 * File locks (flock(2), through fs-ext): released by the kernel when the process dies, so a
 * kill -9 never leaves a lock behind.
 */
import { closeSync, existsSync, ftruncateSync, mkdirSync, openSync, readFileSync, writeSync } from 'node:fs';
import path from 'node:path';
import { flock, flockSync } from 'fs-ext';
import { FailedPreconditionError } from '@sandnode/shared';

/** A held lock; release() closes the file (which drops the lock). */
export interface HeldLock {
  readonly file: string;
  release(): void;
}

function isWouldBlock(err: unknown): boolean {
  const code = (err as NodeJS.ErrnoException).code;
  return code === 'EAGAIN' || code === 'EWOULDBLOCK';
}

/** tryFlock takes an exclusive flock on fd without blocking; false when another holds it. */
function tryFlock(fd: number): boolean {
  try {
    flockSync(fd, 'exnb');
    return true;
  } catch (err) {
    if (isWouldBlock(err)) return false;
    throw err;
  }
}

/**
 * lockSlot takes an exclusive, non-blocking flock on file and writes our pid into it. When
 * another process holds it (for longer than waitMs), throws FailedPreconditionError naming the
 * file, `what` and the pid written by the holder.
 */
export function lockSlot(file: string, what: string, waitMs = 0): HeldLock {
  mkdirSync(path.dirname(file), { recursive: true });
  const fd = openSync(file, 'a+', 0o600);
  const until = Date.now() + waitMs;
  for (;;) {
    try {
      flockSync(fd, 'exnb');
      break;
    } catch (err) {
      // Another slot may hold this lock for a moment while it checks that this slot is not
      // running (takeover of a stopped slot's devices): wait up to waitMs for it.
      if (isWouldBlock(err) && Date.now() < until) {
        sleepSync(20);
        continue;
      }
      closeSync(fd);
      throw lockError(err, file, what);
    }
  }
  ftruncateSync(fd, 0);
  writeSync(fd, `${process.pid}\n`, 0);
  return held(file, fd);
}

function sleepSync(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

function held(file: string, fd: number): HeldLock {
  return {
    file,
    release: () => {
      try {
        closeSync(fd);
      } catch {
        /* already closed */
      }
    },
  };
}

/**
 * tryLockPeer takes another slot's lock file without blocking and without writing into it:
 * a HeldLock when no process holds it (that slot is not running, and cannot start while the
 * lock is held), undefined when a process holds it. A lock file that does not exist (the slot
 * never ran) is created empty.
 */
export function tryLockPeer(file: string): HeldLock | undefined {
  if (!existsSync(path.dirname(file))) mkdirSync(path.dirname(file), { recursive: true });
  const fd = openSync(file, 'a+', 0o600);
  if (tryFlock(fd)) return held(file, fd);
  closeSync(fd);
  return undefined;
}

function lockError(err: unknown, file: string, what: string): unknown {
  if (!isWouldBlock(err)) return err;
  let holder = '';
  try {
    holder = readFileSync(file, 'utf8').trim();
  } catch {
    /* unreadable: say nothing about the holder */
  }
  return new FailedPreconditionError(`${what} is already running: ${file} is locked${holder ? ` by pid ${holder}` : ''}; stop it first or use the other slot`);
}

/**
 * FileMutex serialises short critical sections across processes with an exclusive flock on
 * one file (waiting in the libuv thread pool, so the event loop keeps running), and within
 * this process with a promise chain (flock is per open file, so two waiters of one process
 * would not exclude each other).
 */
export class FileMutex {
  private tail: Promise<unknown> = Promise.resolve();

  constructor(private readonly file: string) {
    mkdirSync(path.dirname(file), { recursive: true });
  }

  /** run calls fn with the lock held and releases it when fn settles. */
  run<T>(fn: () => Promise<T> | T): Promise<T> {
    const next = this.tail.then(() => this.locked(fn));
    this.tail = next.catch(() => undefined);
    return next;
  }

  /** runSync calls fn with the lock held, blocking the thread while another process holds it. */
  runSync<T>(fn: () => T): T {
    const fd = openSync(this.file, 'a+', 0o600);
    try {
      flockSync(fd, 'ex');
      return fn();
    } finally {
      closeSync(fd);
    }
  }

  private async locked<T>(fn: () => Promise<T> | T): Promise<T> {
    const fd = openSync(this.file, 'a+', 0o600);
    try {
      // Uncontended (the common case): take it at once, without a thread-pool round trip.
      if (!tryFlock(fd)) await new Promise<void>((resolve, reject) => flock(fd, 'ex', (err) => (err ? reject(err) : resolve())));
      return await fn();
    } finally {
      closeSync(fd);
    }
  }
}
