/**
 * One operator command at a time on a node: `sandnode up` and `down` hold an exclusive flock(2)
 * on `<runDir>/up.lock` while they start or stop daemons, so two of them at once serialize (the
 * second one then finds the daemons the first started, and never stops them). The kernel
 * releases the lock when the holder dies; the file holds the holder's pid, for messages only.
 */
import { closeSync, constants, ftruncateSync, mkdirSync, openSync, readFileSync, writeSync } from 'node:fs';
import path from 'node:path';
import { checkTrustedDir } from '@sandnode/shared';
import { sleep } from './daemon-process';

const fsExt = require('fs-ext') as { flockSync(fd: number, flags: 'exnb' | 'un'): void };

/** How often a command waiting for the node lock tries again, ms. */
export const NODE_LOCK_POLL_MS = 100;

/** nodeLockFile is `<runDir>/up.lock`. */
export function nodeLockFile(runDir: string): string {
  return path.join(path.resolve(runDir), 'up.lock');
}

/** tryLock: the fd holding an exclusive flock on file, or undefined when another process holds it. */
function tryLock(file: string): number | undefined {
  // (again each time: a `down --purge` that held the lock may have removed the run dir)
  mkdirSync(path.dirname(file), { recursive: true });
  // the dir is checked after it exists (a check of a missing dir below a sticky /tmp passes, and a
  // user may make it before our mkdir), and the lock file is never a symlink (attacker: up.lock
  // linked to a root file had root truncate it)
  checkTrustedDir('runDir', path.dirname(file));
  const fd = openSync(file, constants.O_RDWR | constants.O_APPEND | constants.O_CREAT | constants.O_NOFOLLOW, 0o600);
  try {
    fsExt.flockSync(fd, 'exnb');
    return fd;
  } catch (err) {
    closeSync(fd);
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'EAGAIN' || code === 'EWOULDBLOCK') return undefined;
    throw err;
  }
}

function holderOf(file: string): string {
  try {
    const pid = Number(readFileSync(file, 'utf8').trim());
    return Number.isInteger(pid) && pid > 0 ? ` (pid ${pid})` : '';
  } catch {
    return '';
  }
}

/**
 * withNodeLock runs fn while this process holds the node lock of runDir (created with the dir
 * when missing), waiting up to waitMs (ms) for another `up` / `down` to finish. Throws Error
 * naming the lock file and its holder's pid when it is still held after waitMs; ConfigError
 * when runDir (made now if missing) or a dir above it is not root's alone (checkTrustedDir);
 * ELOOP when up.lock is a symlink; fn's errors pass through. The lock is released when fn settles.
 */
export async function withNodeLock<T>(runDir: string, waitMs: number, fn: () => Promise<T>): Promise<T> {
  const file = nodeLockFile(runDir);
  const deadline = Date.now() + waitMs;
  let fd = tryLock(file);
  while (fd === undefined) {
    if (Date.now() >= deadline) throw new Error(`another \`sandnode up\` or \`down\`${holderOf(file)} holds ${file} for more than ${waitMs} ms: wait for it to finish, or kill it`);
    await sleep(NODE_LOCK_POLL_MS);
    fd = tryLock(file);
  }
  try {
    ftruncateSync(fd, 0);
    writeSync(fd, `${process.pid}\n`, 0);
    return await fn();
  } finally {
    fsExt.flockSync(fd, 'un');
    closeSync(fd);
  }
}
