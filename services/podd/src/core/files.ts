/**
 * File operations for podd's ReadFile, WriteFile and Stat. Paths are absolute paths inside
 * the sandbox. Errors are domain errors: InvalidArgumentError (names `path`, `length`,
 * `data`, `mode`), NotFoundError (ENOENT), FailedPreconditionError (a directory, not a
 * regular file, permission denied, a path component that is a file).
 */
import { constants as fsConstants, type Stats } from 'node:fs';
import { lstat, mkdir, open, realpath, stat, type FileHandle } from 'node:fs/promises';
import path from 'node:path';
import { FailedPreconditionError, InvalidArgumentError, NotFoundError } from '@sandnode/shared';
import { MAX_FILE_BYTES } from './limits';

/** FileKind is the type of a file system entry. */
export type FileKind = 'regular' | 'directory' | 'symlink' | 'other';

/** FileInfo describes a path (Stat). */
export interface FileInfo {
  kind: FileKind;
  /** Size in bytes. */
  sizeBytes: number;
  /** Permission bits (mode & 0o7777). */
  mode: number;
  /** Modification time, Unix epoch ms (whole ms). */
  mtimeMs: number;
}

/** ReadResult is what ReadFile returns. */
export interface ReadResult {
  data: Buffer;
  /** The file's whole size in bytes. */
  sizeBytes: number;
  /** True when the read reached the end of the file. */
  eof: boolean;
}

export interface WriteOptions {
  /** Permission bits of a new file; 0 or undefined means 0o644. Ignored for an existing file. */
  mode?: number;
  /** Add data at the end instead of replacing the file's content. */
  append?: boolean;
  /** Make missing parent directories (mode 0755). */
  createParents?: boolean;
  /** confine the write below this absolute directory (symlinks resolved); '' = none */
  beneath?: string;
}

/** Default mode of a file WriteFile creates. */
export const DEFAULT_FILE_MODE = 0o644;
/** Mode of parent directories WriteFile creates. */
export const DEFAULT_DIR_MODE = 0o755;

/** checkPath: path must be absolute and free of NUL bytes, else InvalidArgumentError naming path. */
export function checkPath(p: string): void {
  if (!p) throw new InvalidArgumentError('path: must not be empty');
  if (!path.isAbsolute(p)) throw new InvalidArgumentError(`path: must be absolute, got ${JSON.stringify(p)}`);
  if (p.includes('\0')) throw new InvalidArgumentError('path: contains a NUL byte');
}

/** fsError maps an errno error of operation op on p to a domain error (unknown ones pass through). */
export function fsError(err: unknown, p: string, op: string): unknown {
  const code = (err as NodeJS.ErrnoException).code;
  switch (code) {
    case 'ENOENT':
      return new NotFoundError(`path: ${p}: no such file or directory`);
    case 'EISDIR':
      return new FailedPreconditionError(`path: ${p} is a directory`);
    case 'ENOTDIR':
      return new FailedPreconditionError(`path: ${p}: a path component is not a directory`);
    case 'EACCES':
    case 'EPERM':
    case 'EROFS':
      return new FailedPreconditionError(`path: ${op} ${p}: ${code}`);
    case 'ELOOP':
      return new FailedPreconditionError(`path: ${p}: too many levels of symbolic links`);
    case 'ENAMETOOLONG':
      return new InvalidArgumentError(`path: ${p}: name too long`);
    case 'ENOSPC':
    case 'EDQUOT':
      return new FailedPreconditionError(`path: ${op} ${p}: no space left (${code})`);
    default:
      return err;
  }
}

/**
 * readFile reads up to length bytes of p at offset (length 0 means MAX_FILE_BYTES). Throws
 * InvalidArgumentError (relative path, length above 3 MiB, bad offset), NotFoundError,
 * FailedPreconditionError (a directory, a FIFO/socket/device other than a character device).
 */
export async function readFile(p: string, offset: number, length: number, beneath = ''): Promise<ReadResult> {
  checkPath(p);
  if (beneath) await confine(p, beneath, 'read');
  if (!Number.isSafeInteger(offset) || offset < 0) throw new InvalidArgumentError('offset: must be a non-negative integer');
  if (!Number.isSafeInteger(length) || length < 0) throw new InvalidArgumentError('length: must be a non-negative integer');
  if (length > MAX_FILE_BYTES) throw new InvalidArgumentError(`length: ${length} is above the limit of ${MAX_FILE_BYTES} bytes`);
  const want = length === 0 ? MAX_FILE_BYTES : length;
  let st;
  try {
    st = await stat(p);
  } catch (err) {
    throw fsError(err, p, 'read');
  }
  if (st.isDirectory()) throw new FailedPreconditionError(`path: ${p} is a directory`);
  if (!st.isFile() && !st.isCharacterDevice()) throw new FailedPreconditionError(`path: ${p} is not a regular file`);
  let fh;
  try {
    fh = await open(p, fsConstants.O_RDONLY | (beneath ? fsConstants.O_NOFOLLOW : 0));
  } catch (err) {
    throw fsError(err, p, 'open');
  }
  return readOpen(fh, p, offset, want);
}

/**
 * readOpen reads at most want bytes at offset of the open file fh (shown as p in errors) and
 * closes it: the data, the file's size in bytes, and eof (nothing is left after what was read).
 * Errors: fsError's codes for a failed read.
 */
export async function readOpen(fh: FileHandle, p: string, offset: number, want: number): Promise<ReadResult> {
  try {
    const size = (await fh.stat()).size;
    const buf = Buffer.allocUnsafe(want);
    let got = 0;
    while (got < want) {
      const { bytesRead } = await fh.read(buf, got, want - got, offset + got);
      if (bytesRead === 0) break;
      got += bytesRead;
    }
    const eof = got < want || (size > 0 && offset + got >= size);
    return { data: buf.subarray(0, got), sizeBytes: size, eof };
  } catch (err) {
    throw fsError(err, p, 'read');
  } finally {
    await fh.close();
  }
}

/**
 * writeFile writes data to p (replacing its content, or appending), fsyncs the file, and, when
 * it created the file or parent directories, fsyncs the directories that changed. Returns the
 * file's size after the write. Throws InvalidArgumentError (relative path, data above 3 MiB,
 * mode above 0o7777), NotFoundError (parent missing and createParents false),
 * FailedPreconditionError (p is a directory, a parent is a file, permission denied).
 */
export async function writeFile(p: string, data: Uint8Array, opts: WriteOptions = {}): Promise<{ sizeBytes: number }> {
  checkPath(p);
  if (p === '/' || p.endsWith('/')) throw new InvalidArgumentError(`path: ${p} names a directory`);
  if (data.length > MAX_FILE_BYTES) throw new InvalidArgumentError(`data: ${data.length} bytes is above the limit of ${MAX_FILE_BYTES}`);
  const mode = opts.mode || DEFAULT_FILE_MODE;
  if (!Number.isInteger(mode) || mode < 0 || mode > 0o7777) throw new InvalidArgumentError(`mode: ${mode} is not a permission mask (0..0o7777)`);

  const dir = path.dirname(p);
  const dirsToSync = new Set<string>();
  if (opts.createParents) {
    let first: string | undefined;
    try {
      first = await mkdir(dir, { recursive: true, mode: DEFAULT_DIR_MODE });
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === 'EEXIST' || code === 'ENOTDIR') throw new FailedPreconditionError(`path: a parent of ${p} is not a directory`);
      throw fsError(err, dir, 'mkdir');
    }
    // Every directory from the first one created down to dir changed its parent's entries.
    for (let d = dir; first && d.length >= first.length; d = path.dirname(d)) {
      dirsToSync.add(path.dirname(d));
      if (d === first) break;
    }
  }

  if (opts.beneath) await confine(dir, opts.beneath, 'write', true);
  let before: Stats | undefined;
  try {
    before = await lstat(p);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw fsError(err, p, 'write');
  }
  if (before?.isDirectory()) throw new FailedPreconditionError(`path: ${p} is a directory`);
  // A FIFO, socket or device would block or misbehave: only regular files (or a symlink, which
  // open resolves) are written. O_NONBLOCK keeps a FIFO swapped in after the lstat from blocking
  // one of podd's few fs threads (open fails with ENXIO instead).
  if (before && !before.isFile() && !before.isSymbolicLink()) throw new FailedPreconditionError(`path: ${p} is not a regular file`);
  if (before?.isSymbolicLink() && opts.beneath) throw new FailedPreconditionError(`path: ${p} is a symlink; writes below ${opts.beneath} do not follow symlinks`);
  const existed = before !== undefined;

  const flags = fsConstants.O_WRONLY | fsConstants.O_CREAT | fsConstants.O_NONBLOCK | (opts.beneath ? fsConstants.O_NOFOLLOW : 0) | (opts.append ? fsConstants.O_APPEND : fsConstants.O_TRUNC);
  let fh;
  try {
    fh = await open(p, flags, mode);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') throw new NotFoundError(`path: parent directory ${dir} does not exist (set create_parents)`);
    throw fsError(err, p, 'open');
  }
  let size: number;
  try {
    if (!existed) await fh.chmod(mode); // exact bits, whatever the umask
    let done = 0;
    while (done < data.length) {
      const { bytesWritten } = await fh.write(data, done, data.length - done, opts.append ? null : done);
      done += bytesWritten;
    }
    await fh.sync();
    size = (await fh.stat()).size;
  } catch (err) {
    throw fsError(err, p, 'write');
  } finally {
    await fh.close();
  }
  if (!existed) dirsToSync.add(dir);
  for (const d of dirsToSync) await fsyncDir(d);
  return { sizeBytes: size };
}

/**
 * confine checks that p, with every symlink resolved, lies below the directory beneath (also
 * resolved). Throws FailedPreconditionError naming both when it does not, NotFoundError when p
 * does not exist. isDir: p is the parent directory of a write.
 */
async function confine(p: string, beneath: string, op: string, isDir = false): Promise<void> {
  if (!path.isAbsolute(beneath)) throw new InvalidArgumentError(`beneath: ${beneath} must be an absolute path`);
  let root: string;
  let real: string;
  try {
    root = await realpath(beneath);
    real = await realpath(p);
  } catch (err) {
    throw fsError(err, p, op);
  }
  if (real !== root && !real.startsWith(`${root}/`)) {
    throw new FailedPreconditionError(`path: ${isDir ? 'the directory of the file' : p} resolves to ${real}, outside ${beneath}`);
  }
}

/** fsyncDir makes a directory's entries durable. */
export async function fsyncDir(dir: string): Promise<void> {
  const fh = await open(dir, fsConstants.O_RDONLY | fsConstants.O_DIRECTORY);
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

/** statPath describes p without following a final symlink. Throws InvalidArgumentError, NotFoundError. */
export async function statPath(p: string): Promise<FileInfo> {
  checkPath(p);
  let st;
  try {
    st = await lstat(p);
  } catch (err) {
    throw fsError(err, p, 'stat');
  }
  const kind: FileKind = st.isFile() ? 'regular' : st.isDirectory() ? 'directory' : st.isSymbolicLink() ? 'symlink' : 'other';
  return { kind, sizeBytes: st.size, mode: st.mode & 0o7777, mtimeMs: Math.floor(st.mtimeMs) };
}
