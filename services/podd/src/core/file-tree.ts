/**
 * The tree calls of podd (CreateDirectory, CreateSymlink; feature "podd.files.tree.v1"): what a
 * recursive copy needs besides file data. Both walk below `beneath` one component at a time
 * without following a symlink (walk.ts), and act on the last component through the fd of its
 * directory, so a sandbox process that swaps a component for a symlink cannot move the
 * directory or link podd makes (podd may be root) to another place. A directory's mode is set
 * through an fd opened O_NOFOLLOW | O_DIRECTORY (fchmod), never by path; a symlink is made
 * under a temp name and renamed into place (rename replaces a link, never follows it).
 * Errors are domain errors (files.ts fsError): InvalidArgumentError, NotFoundError,
 * FailedPreconditionError.
 */
import { randomBytes } from 'node:crypto';
import { constants as fsc, type Stats } from 'node:fs';
import { lstat, mkdir, open, rename, symlink, unlink } from 'node:fs/promises';
import { FailedPreconditionError, InvalidArgumentError } from '@sandnode/shared';
import { DEFAULT_DIR_MODE, fsError } from './files';
import { MAX_PATH_BYTES } from './limits';
import { at, checkStreamPath, walkParent } from './walk';

/** The temp name of a symlink being made beside its target: `.sandnode-link-<12 hex>`. */
export const LINK_TEMP_MARK = '.sandnode-link-';

function checkMode(mode: number): void {
  if (!Number.isInteger(mode) || mode < 0 || mode > 0o777) throw new InvalidArgumentError(`mode: ${mode} is not a permission mode (0..0o777)`);
}

async function lstatAt(dirFd: number, name: string, p: string): Promise<Stats | undefined> {
  try {
    return await lstat(at(dirFd, name));
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw fsError(err, p, 'stat');
  }
}

/**
 * createDirectory makes directory p with exactly mode (0: 0755; no umask), or sets the mode of
 * the directory that is there; parents made (0755) when createParents. Returns whether it made
 * it. Errors: INVALID_ARGUMENT (path, mode, p is the root itself), NOT_FOUND (a parent missing),
 * FAILED_PRECONDITION (p or a component is a symlink or not a directory).
 */
export async function createDirectory(p: string, mode: number, createParents: boolean, beneath: string): Promise<{ created: boolean }> {
  checkStreamPath(p);
  checkMode(mode);
  const bits = mode || DEFAULT_DIR_MODE;
  const w = await walkParent(p, beneath, createParents);
  try {
    if (!w.name) throw new InvalidArgumentError(`path: ${p} is the root of the copy; it is not made`);
    let created = true;
    try {
      await mkdir(at(w.dir.fd, w.name), { mode: 0o700 });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw fsError(err, p, 'mkdir');
      created = false;
    }
    let fh;
    try {
      fh = await open(at(w.dir.fd, w.name), fsc.O_RDONLY | fsc.O_DIRECTORY | (w.confined ? fsc.O_NOFOLLOW : 0));
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === 'ENOTDIR' || code === 'ELOOP') throw new FailedPreconditionError(`path: ${p} is a symlink or not a directory; not followed (it could lead outside /workspace)`);
      throw fsError(err, p, 'open');
    }
    try {
      await fh.chmod(bits);
      if (created) await w.dir.sync();
    } finally {
      await fh.close();
    }
    return { created };
  } finally {
    await w.release();
  }
}

/**
 * createSymlink makes p a symlink holding target (stored as is: it may name anything; no call
 * below beneath follows it). With replace an existing symlink or regular file at p is swapped
 * for it atomically (a temp link renamed over it); without, an existing p is
 * FAILED_PRECONDITION. Errors: INVALID_ARGUMENT (path; target empty, above 4095 bytes or with
 * NUL), NOT_FOUND (a parent missing), FAILED_PRECONDITION (exists, is a directory or other, a
 * symlink on the way).
 */
export async function createSymlink(p: string, target: string, replace: boolean, createParents: boolean, beneath: string): Promise<void> {
  checkStreamPath(p);
  if (!target || target.includes('\0') || Buffer.byteLength(target) > MAX_PATH_BYTES) throw new InvalidArgumentError(`target: must be 1..${MAX_PATH_BYTES} bytes without NUL`);
  const w = await walkParent(p, beneath, createParents);
  try {
    if (!w.name) throw new InvalidArgumentError(`path: ${p} is the root of the copy`);
    if (!replace) {
      // symlink(2) never replaces: an entry made since any check is EEXIST, not overwritten
      try {
        await symlink(target, at(w.dir.fd, w.name));
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === 'EEXIST') throw new FailedPreconditionError(`path: ${p} exists (set replace to swap it)`);
        throw fsError(err, p, 'symlink');
      }
      await w.dir.sync();
      return;
    }
    const before = await lstatAt(w.dir.fd, w.name, p);
    if (before && !before.isFile() && !before.isSymbolicLink())
      throw new FailedPreconditionError(`path: ${p} is ${before.isDirectory() ? 'a directory' : 'not a regular file or symlink'}; not replaced`);
    const tmp = `${LINK_TEMP_MARK}${randomBytes(6).toString('hex')}`;
    try {
      await symlink(target, at(w.dir.fd, tmp));
    } catch (err) {
      throw fsError(err, p, 'symlink');
    }
    let done = false;
    try {
      // rename(2) replaces a file or link at the name; onto a directory (swapped in since the
      // lstat) it fails (EISDIR / ENOTDIR), never writes into it
      await rename(at(w.dir.fd, tmp), at(w.dir.fd, w.name));
      done = true;
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === 'EISDIR' || code === 'ENOTDIR' || code === 'ENOTEMPTY' || code === 'EEXIST') throw new FailedPreconditionError(`path: ${p} became a directory; not replaced`);
      throw fsError(err, p, 'rename');
    } finally {
      if (!done) await unlink(at(w.dir.fd, tmp)).catch(() => undefined);
    }
    await w.dir.sync();
  } finally {
    await w.release();
  }
}
