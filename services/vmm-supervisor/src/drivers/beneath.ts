/**
 * File operations of host root inside a tree a sandbox has written (an overlay upper dir, a
 * workspace): never follow a symlink the sandbox planted, never leave the tree.
 *
 * Node has no openat(2), so the walk goes through the `/proc/self/fd/<fd>/<name>` form: the
 * kernel resolves `/proc/self/fd/<fd>` to the directory that fd holds (not to a path that can
 * be swapped), and O_NOFOLLOW | O_DIRECTORY on `<name>` refuses a symlink or a non-directory
 * at each component. This is the walk of openat2(RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH)
 * (Linux 5.6, openat2(2)) and of runc's filepath-securejoin, done one component at a time.
 * mkdir(2), unlink(2) and O_CREAT | O_EXCL never follow a final symlink, so they are safe on
 * `<fd>/<name>` as they are. (libuv opens every fd O_CLOEXEC.)
 */
import { closeSync, constants as fsc, fchmodSync, fchownSync, fsyncSync, mkdirSync, openSync, unlinkSync, writeSync } from 'node:fs';

/** UnsafePathError: a component beneath the root is a symlink or not a directory; nothing was written. */
export class UnsafePathError extends Error {
  constructor(
    readonly component: string,
    why: string,
  ) {
    super(`${component}: ${why}; refusing to follow it`);
    this.name = 'UnsafePathError';
  }
}

const at = (dirFd: number, name: string) => `/proc/self/fd/${dirFd}/${name}`;

function checkName(name: string): void {
  if (!name || name === '.' || name === '..' || name.includes('/') || name.includes('\0')) throw new UnsafePathError(name, 'not a single path component');
}

/**
 * openDirNoFollow opens `<dirFd>/<name>` as a directory without following a symlink (O_NOFOLLOW
 * | O_DIRECTORY); returns the fd (close it). Throws UnsafePathError when it is a symlink or not
 * a directory, and the fs error (ENOENT, ...) otherwise.
 */
export function openDirNoFollow(dirFd: number, name: string): number {
  checkName(name);
  try {
    return openSync(at(dirFd, name), fsc.O_RDONLY | fsc.O_DIRECTORY | fsc.O_NOFOLLOW);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    // O_DIRECTORY | O_NOFOLLOW on a symlink is ENOTDIR on Linux (ELOOP without O_DIRECTORY).
    if (code === 'ELOOP' || code === 'ENOTDIR') throw new UnsafePathError(name, 'is a symlink or not a directory');
    throw err;
  }
}

/** openRootDir opens the tree's root (a path the host owns) as a directory, not following a final symlink. */
export function openRootDir(root: string): number {
  try {
    return openSync(root, fsc.O_RDONLY | fsc.O_DIRECTORY | fsc.O_NOFOLLOW);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ELOOP' || code === 'ENOTDIR') throw new UnsafePathError(root, 'is a symlink or not a directory');
    throw err;
  }
}

/**
 * ensureDirNoFollow opens `<dirFd>/<name>`, creating it (mode) when missing; never follows a
 * symlink. Errors: UnsafePathError (symlink / not a directory), fs errors.
 */
export function ensureDirNoFollow(dirFd: number, name: string, mode: number): number {
  checkName(name);
  try {
    mkdirSync(at(dirFd, name), { mode });
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
  }
  return openDirNoFollow(dirFd, name);
}

/**
 * replaceFileNoFollow replaces `<dirFd>/<name>` by a new regular file with data and mode
 * (fsync'd; owned by owner when given): unlinks what is there (a symlink is unlinked, not followed; a hardlink only loses
 * this name) and creates the file with O_CREAT | O_EXCL | O_NOFOLLOW, so a name planted between
 * the two steps fails the call (EEXIST) instead of being written through.
 * Errors: UnsafePathError (a directory is there), fs errors.
 */
export function replaceFileNoFollow(dirFd: number, name: string, data: string | Uint8Array, mode: number, owner?: { uid: number; gid: number }): void {
  checkName(name);
  try {
    unlinkSync(at(dirFd, name));
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'EISDIR' || code === 'EPERM') throw new UnsafePathError(name, 'is a directory');
    if (code !== 'ENOENT') throw err;
  }
  const fd = openSync(at(dirFd, name), fsc.O_WRONLY | fsc.O_CREAT | fsc.O_EXCL | fsc.O_NOFOLLOW, mode);
  try {
    const buf = typeof data === 'string' ? Buffer.from(data) : data;
    for (let off = 0; off < buf.length;) off += writeSync(fd, buf, off, buf.length - off);
    if (owner) fchownSync(fd, owner.uid, owner.gid);
    fchmodSync(fd, mode); // the umask may have cut mode at create (and chown clears setuid bits)
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}
