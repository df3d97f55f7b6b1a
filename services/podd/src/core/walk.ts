/**
 * The path walk of podd's streamed file calls (file-stream.ts, file-list.ts): resolve a path
 * below a root directory one component at a time, never following a symlink, so a sandbox
 * process that swaps a component for a symlink between two steps (or during a transfer)
 * makes the call fail instead of reaching outside the root.
 *
 * Node has no openat(2), so each step opens `/proc/self/fd/<dirfd>/<name>`: the kernel
 * resolves `/proc/self/fd/<dirfd>` to the directory that fd holds (not to a path that can be
 * swapped), and O_NOFOLLOW | O_DIRECTORY on `<name>` refuses a symlink or a non-directory.
 * This is the walk of openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS) and of runc's
 * filepath-securejoin, done one component at a time (vmm-supervisor drivers/beneath.ts does
 * the same on the host side). Without a root ("" beneath) the parent is opened as it is
 * (symlinks followed): the podd contract without confinement.
 */
import { constants as fsc } from 'node:fs';
import { mkdir, open, type FileHandle } from 'node:fs/promises';
import path from 'node:path';
import { FailedPreconditionError, InvalidArgumentError } from '@sandnode/shared';
import { checkPath, DEFAULT_DIR_MODE, fsError } from './files';
import { MAX_NAME_BYTES, MAX_PATH_BYTES } from './limits';

/** at is the path of name inside the directory that fd holds. */
export const at = (fd: number, name: string): string => `/proc/self/fd/${fd}/${name}`;

/** A walked path: the open directory that holds the last component, and that component's name. */
export interface Walked {
  /** the directory holding name (close it with release) */
  dir: FileHandle;
  /** the last component ("" when the path is the root itself) */
  name: string;
  /** true when the walk was confined below a root (open the last component with O_NOFOLLOW) */
  confined: boolean;
  /** release closes dir */
  release(): Promise<void>;
}

/**
 * checkStreamPath checks what every streamed call needs of a path: absolute, no NUL, no ".."
 * component, at most MAX_PATH_BYTES bytes, no component above MAX_NAME_BYTES. Throws
 * InvalidArgumentError naming `path`.
 */
export function checkStreamPath(p: string): void {
  checkPath(p);
  const n = Buffer.byteLength(p);
  if (n > MAX_PATH_BYTES) throw new InvalidArgumentError(`path: ${n} bytes, at most ${MAX_PATH_BYTES} (PATH_MAX)`);
  const parts = p.split('/');
  if (parts.includes('..')) throw new InvalidArgumentError('path: contains ".."');
  const long = parts.find((c) => Buffer.byteLength(c) > MAX_NAME_BYTES);
  if (long !== undefined) throw new InvalidArgumentError(`path: a component of ${Buffer.byteLength(long)} bytes, at most ${MAX_NAME_BYTES} (NAME_MAX)`);
}

/** components of p below beneath (both absolute, normalized); throws FailedPreconditionError when p is not below beneath. */
function componentsBelow(p: string, beneath: string): string[] {
  if (!path.isAbsolute(beneath)) throw new InvalidArgumentError(`beneath: ${beneath} must be an absolute path`);
  const root = path.normalize(beneath);
  const abs = path.normalize(p);
  const rel = path.relative(root, abs);
  if (rel.startsWith('..') || path.isAbsolute(rel)) throw new FailedPreconditionError(`path: ${p} is outside ${beneath}`);
  return rel.split('/').filter((c) => c !== '' && c !== '.');
}

/** openDir opens a directory; nofollow refuses a symlink. Maps ELOOP/ENOTDIR of a confined step to FAILED_PRECONDITION. */
async function openDir(where: string, shown: string, nofollow: boolean, beneath: string): Promise<FileHandle> {
  try {
    return await open(where, fsc.O_RDONLY | fsc.O_DIRECTORY | (nofollow ? fsc.O_NOFOLLOW : 0));
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    // O_DIRECTORY | O_NOFOLLOW on a symlink is ENOTDIR on Linux (ELOOP without O_DIRECTORY)
    if (nofollow && (code === 'ELOOP' || code === 'ENOTDIR'))
      throw new FailedPreconditionError(`path: ${shown} is a symlink or not a directory; not followed below ${beneath} (it could lead outside ${beneath})`);
    throw fsError(err, shown, 'open');
  }
}

/**
 * walkParent opens the directory that holds p's last component: below beneath without
 * following any symlink (creating missing directories, mode 0755, when createParents), or,
 * with beneath "", p's parent as it is. p must have passed checkStreamPath. Errors:
 * FailedPreconditionError (outside beneath, a symlink or file on the way), NotFoundError
 * (a missing directory and no createParents).
 */
export async function walkParent(p: string, beneath: string, createParents = false): Promise<Walked> {
  if (!beneath) {
    const dirPath = path.dirname(path.normalize(p));
    if (createParents) await mkdirPlain(dirPath);
    const dir = await openDir(dirPath, dirPath, false, '');
    return { dir, name: path.basename(path.normalize(p)), confined: false, release: () => dir.close() };
  }
  const parts = componentsBelow(p, beneath);
  let dir = await openDir(path.normalize(beneath), beneath, true, beneath);
  let shown = path.normalize(beneath);
  try {
    for (const c of parts.slice(0, -1)) {
      shown = path.join(shown, c);
      if (createParents) {
        try {
          await mkdir(at(dir.fd, c), { mode: DEFAULT_DIR_MODE });
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw fsError(err, shown, 'mkdir');
        }
      }
      const next = await openDir(at(dir.fd, c), shown, true, beneath);
      await dir.close();
      dir = next;
    }
  } catch (err) {
    await dir.close();
    throw err;
  }
  const held = dir;
  return { dir: held, name: parts.at(-1) ?? '', confined: true, release: () => held.close() };
}

/** walkDir opens p itself as a directory (below beneath without following symlinks). Errors as walkParent, and FAILED_PRECONDITION (not a directory). */
export async function walkDir(p: string, beneath: string): Promise<FileHandle> {
  const w = await walkParent(p, beneath);
  if (!w.name) return w.dir;
  try {
    return await openDir(at(w.dir.fd, w.name), p, w.confined, beneath);
  } finally {
    await w.release();
  }
}

async function mkdirPlain(dir: string): Promise<void> {
  try {
    await mkdir(dir, { recursive: true, mode: DEFAULT_DIR_MODE });
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'EEXIST' || code === 'ENOTDIR') throw new FailedPreconditionError(`path: a parent of ${dir} is not a directory`);
    throw fsError(err, dir, 'mkdir');
  }
}
