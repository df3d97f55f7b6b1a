/**
 * The unary ReadFile / WriteFile of podd confined below `beneath` (feature
 * "podd.files.beneath.v1"), walked like the streamed calls (walk.ts): one component at a time
 * from the root's fd, no symlink followed, the file opened O_NOFOLLOW through its directory's
 * fd and checked with fstat. The earlier form checked realpath(p) and then opened p by path,
 * so a component swapped for a symlink between the check and the open (or a symlink met by
 * `mkdir -p` of create_parents, which ran before the check) made podd, which may be root,
 * create directories or write a file outside /workspace. Errors as files.ts readFile /
 * writeFile, and FAILED_PRECONDITION for a symlink below beneath.
 */
import { constants as fsc } from 'node:fs';
import { open, type FileHandle } from 'node:fs/promises';
import { FailedPreconditionError, InvalidArgumentError, NotFoundError } from '@sandnode/shared';
import { DEFAULT_FILE_MODE, fsError, readOpen, type ReadResult, type WriteOptions } from './files';
import { MAX_FILE_BYTES } from './limits';
import { at, checkStreamPath, walkParent } from './walk';

/** openBeneath opens name in dirFd with O_NOFOLLOW | O_NONBLOCK and checks (fstat) it is a regular file. */
async function openBeneath(dirFd: number, name: string, p: string, flags: number, mode?: number): Promise<FileHandle> {
  let fh: FileHandle;
  try {
    fh = await open(at(dirFd, name), flags | fsc.O_NOFOLLOW | fsc.O_NONBLOCK, mode);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'EEXIST') throw err; // the caller's O_EXCL probe
    if (code === 'ELOOP') throw new FailedPreconditionError(`path: ${p} is a symlink; not followed (it could lead outside /workspace)`);
    if (code === 'ENXIO') throw new FailedPreconditionError(`path: ${p} is not a regular file`);
    if (code === 'EISDIR') throw new FailedPreconditionError(`path: ${p} is a directory`);
    if (code === 'ENOENT' && flags & fsc.O_CREAT) throw new NotFoundError(`path: the parent directory of ${p} does not exist (set create_parents)`);
    throw fsError(err, p, 'open');
  }
  const st = await fh.stat();
  if (!st.isFile()) {
    await fh.close();
    throw new FailedPreconditionError(st.isDirectory() ? `path: ${p} is a directory` : `path: ${p} is not a regular file`);
  }
  return fh;
}

/** readFileBeneath is files.ts readFile confined below beneath (see the file comment). */
export async function readFileBeneath(p: string, offset: number, length: number, beneath: string): Promise<ReadResult> {
  checkStreamPath(p);
  if (!Number.isSafeInteger(offset) || offset < 0) throw new InvalidArgumentError('offset: must be a non-negative integer');
  if (!Number.isSafeInteger(length) || length < 0) throw new InvalidArgumentError('length: must be a non-negative integer');
  if (length > MAX_FILE_BYTES) throw new InvalidArgumentError(`length: ${length} is above the limit of ${MAX_FILE_BYTES} bytes`);
  const want = length === 0 ? MAX_FILE_BYTES : length;
  const w = await walkParent(p, beneath);
  let fh: FileHandle;
  try {
    if (!w.name) throw new FailedPreconditionError(`path: ${p} is a directory`);
    fh = await openBeneath(w.dir.fd, w.name, p, fsc.O_RDONLY);
  } finally {
    await w.release();
  }
  return readOpen(fh, p, offset, want);
}

/** writeFileBeneath is files.ts writeFile confined below beneath (see the file comment); parents are made (0755) by the same walk. */
export async function writeFileBeneath(p: string, data: Uint8Array, opts: WriteOptions & { beneath: string }): Promise<{ sizeBytes: number }> {
  checkStreamPath(p);
  if (p === '/' || p.endsWith('/')) throw new InvalidArgumentError(`path: ${p} names a directory`);
  if (data.length > MAX_FILE_BYTES) throw new InvalidArgumentError(`data: ${data.length} bytes is above the limit of ${MAX_FILE_BYTES}`);
  const mode = opts.mode || DEFAULT_FILE_MODE;
  if (!Number.isInteger(mode) || mode < 0 || mode > 0o7777) throw new InvalidArgumentError(`mode: ${mode} is not a permission mask (0..0o7777)`);
  const w = await walkParent(p, opts.beneath, opts.createParents === true);
  try {
    if (!w.name) throw new InvalidArgumentError(`path: ${p} names a directory`);
    // O_EXCL first: whether this call made the file decides its mode (an existing file keeps its own)
    let fh: FileHandle;
    let created = true;
    try {
      fh = await openBeneath(w.dir.fd, w.name, p, fsc.O_WRONLY | fsc.O_CREAT | fsc.O_EXCL, mode);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      created = false;
      fh = await openBeneath(w.dir.fd, w.name, p, fsc.O_WRONLY | (opts.append ? fsc.O_APPEND : 0));
    }
    let size: number;
    try {
      if (created)
        await fh.chmod(mode); // exact bits, whatever the umask
      else if (!opts.append) await fh.truncate(0);
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
    if (created) await w.dir.sync();
    return { sizeBytes: size };
  } finally {
    await w.release();
  }
}
