/**
 * The supervisor's state-dir lock: an exclusive flock(2) on `<stateDir>/vmm-supervisor/lock`,
 * held for the life of the process and released by the kernel when it dies (kill -9 included).
 * A second supervisor on the same state dir fails to take it and exits with a message naming
 * the holder, instead of unlinking and re-binding the first one's socket.
 */
import { closeSync, ftruncateSync, mkdirSync, openSync, readFileSync, writeSync } from 'node:fs';
import path from 'node:path';
import { flockSync } from 'fs-ext';

/** File name of the lock inside `<stateDir>/vmm-supervisor/`. */
export const LOCK_FILE = 'lock';

/** StateLockHeldError: another process holds the lock. */
export class StateLockHeldError extends Error {
  constructor(
    readonly file: string,
    readonly holder: string,
  ) {
    super(`another vmm-supervisor already runs on this state dir: ${file} is locked${holder ? ` by pid ${holder}` : ''}; stop it first`);
    this.name = 'StateLockHeldError';
  }
}

/** StateLock is a held lock; {@link StateLock.release} is for tests (a daemon holds it until exit). */
export interface StateLock {
  readonly file: string;
  release(): void;
}

/**
 * acquireStateLock takes the exclusive lock of `<supervisorDir>/lock` without waiting and writes
 * this pid into it. Throws StateLockHeldError when another process holds it.
 */
export function acquireStateLock(supervisorDir: string): StateLock {
  mkdirSync(supervisorDir, { recursive: true, mode: 0o700 });
  const file = path.join(supervisorDir, LOCK_FILE);
  const fd = openSync(file, 'a+', 0o600);
  try {
    flockSync(fd, 'exnb');
  } catch (err) {
    closeSync(fd);
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'EAGAIN' || code === 'EWOULDBLOCK') {
      let holder = '';
      try {
        holder = readFileSync(file, 'utf8').trim();
      } catch {
        /* unreadable: name no pid */
      }
      throw new StateLockHeldError(file, holder);
    }
    throw err;
  }
  ftruncateSync(fd, 0);
  writeSync(fd, `${process.pid}\n`, 0);
  return {
    file,
    release() {
      closeSync(fd);
    },
  };
}
