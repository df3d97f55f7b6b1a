/**
 * Streamed file transfer of podd (DownloadFile, UploadFile; feature "podd.files.stream.v1"):
 * any size, from an offset, one chunk in memory at a time. The caller's pace is the pace:
 * a download reads the next chunk only when the consumer asks for it, an upload takes the next
 * chunk only after the last one is written. Paths are walked by walk.ts (below `beneath`
 * without following symlinks). Errors are domain errors (files.ts fsError):
 * InvalidArgumentError, NotFoundError, FailedPreconditionError.
 */
import { createHash, randomBytes } from 'node:crypto';
import { constants as fsc, type Stats } from 'node:fs';
import { lstat, open, rename, unlink, type FileHandle } from 'node:fs/promises';
import { FailedPreconditionError, InvalidArgumentError, WritebackPacer } from '@sandnode/shared';
import { DEFAULT_FILE_MODE, fsError } from './files';
import { MAX_FILE_BYTES, MAX_NAME_BYTES } from './limits';
import { at, checkStreamPath, walkParent } from './walk';

/** Bytes per DownloadFile message (1 MiB: well under gRPC's 4 MiB message limit, large enough for fast copies). */
export const STREAM_CHUNK_BYTES = 1024 * 1024;
/** Largest data of one UploadFile message, bytes (3 MiB, the podd message limit of the unary calls). */
export const MAX_UPLOAD_CHUNK_BYTES = MAX_FILE_BYTES;
/** The temp file name of an upload beside its target: `.<name>.sandnode-upload-<12 hex>`. */
export const UPLOAD_TEMP_MARK = '.sandnode-upload-';

/** One message of a download: data at offset; the first one carries the file's size. */
export interface DownloadChunk {
  data: Buffer;
  /** where data starts, bytes */
  offset: number;
  /** the file's size when opened, bytes (first chunk only, else 0) */
  sizeBytes: number;
}

/** Where an upload goes (the first message of the stream). */
export interface UploadHeader {
  path: string;
  /** bytes; above 0 resumes in place (the file is cut to offset first) */
  offset: number;
  /** permission bits of a new file; 0 = 0644 */
  mode: number;
  createParents: boolean;
  /** write into path itself also at offset 0 (a cut upload keeps what was written) */
  inPlace: boolean;
  /** confine below this absolute directory; '' = none */
  beneath: string;
}

/** One message of an upload stream: the header, data, then the end (sha256 of all data, '' = unchecked). */
export type UploadPart = { header: UploadHeader } | { data: Uint8Array } | { end: { sha256: string } };

/** What an upload wrote. */
export interface UploadResult {
  /** the file's size after the upload, bytes */
  sizeBytes: number;
  /** bytes this call wrote */
  bytesWritten: number;
  /** SHA-256 of the bytes written, lowercase hex */
  sha256: string;
}

/** The bytes of an upload temp name that are not the target's name: the dot, UPLOAD_TEMP_MARK and 12 hex digits. */
const TEMP_OVERHEAD_BYTES = 1 + UPLOAD_TEMP_MARK.length + 12;

/**
 * uploadTempName is a new temp name for an upload to name: `.<name>.sandnode-upload-<12 hex>`,
 * name cut at a character boundary so the whole stays within MAX_NAME_BYTES bytes (a cut by
 * characters, not bytes, made a long non-ASCII name ENAMETOOLONG).
 */
export function uploadTempName(name: string): string {
  let kept = '';
  let bytes = 0;
  for (const ch of name) {
    const n = Buffer.byteLength(ch);
    if (bytes + n > MAX_NAME_BYTES - TEMP_OVERHEAD_BYTES) break;
    kept += ch;
    bytes += n;
  }
  return `.${kept}${UPLOAD_TEMP_MARK}${randomBytes(6).toString('hex')}`;
}

function checkOffset(offset: number): void {
  if (!Number.isSafeInteger(offset) || offset < 0) throw new InvalidArgumentError('offset: must be a non-negative integer');
}

/** openRegular opens name in w's directory (O_NOFOLLOW when confined, O_NONBLOCK so a FIFO never blocks) and checks it is a regular file. */
async function openRegular(dirFd: number, name: string, p: string, confined: boolean, flags: number, mode?: number): Promise<{ fh: FileHandle; st: Stats }> {
  let fh: FileHandle;
  try {
    fh = await open(at(dirFd, name), flags | fsc.O_NONBLOCK | (confined ? fsc.O_NOFOLLOW : 0), mode);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (confined && code === 'ELOOP') throw new FailedPreconditionError(`path: ${p} is a symlink; not followed (it could lead outside /workspace)`);
    if (code === 'ENXIO') throw new FailedPreconditionError(`path: ${p} is not a regular file`);
    throw fsError(err, p, 'open');
  }
  const st = await fh.stat();
  if (!st.isFile()) {
    await fh.close();
    throw new FailedPreconditionError(st.isDirectory() ? `path: ${p} is a directory` : `path: ${p} is not a regular file`);
  }
  return { fh, st };
}

/**
 * openDownload opens the regular file p below beneath for reading (walk.ts: no symlink
 * followed), as downloadFile and the bulk channel do. Errors: as downloadFile.
 */
export async function openDownload(p: string, offset: number, beneath: string): Promise<{ fh: FileHandle; st: Stats }> {
  checkStreamPath(p);
  checkOffset(offset);
  const w = await walkParent(p, beneath);
  try {
    if (!w.name) throw new FailedPreconditionError(`path: ${p} is a directory`);
    return await openRegular(w.dir.fd, w.name, p, w.confined, fsc.O_RDONLY);
  } finally {
    await w.release();
  }
}

/**
 * downloadFile streams the regular file p from offset: a first chunk with its size and no
 * data, then chunks of at most STREAM_CHUNK_BYTES up to that size (bytes appended while it
 * streams are not sent; a file cut short ends the stream early). The file is
 * open (and its directory walk done) before the first chunk; a symlink swapped in later changes
 * nothing. Stops reading when signal aborts. Errors: INVALID_ARGUMENT (path, offset),
 * NOT_FOUND, FAILED_PRECONDITION (not a regular file, a symlink on the way below beneath).
 */
export async function* downloadFile(p: string, offset: number, beneath: string, signal?: AbortSignal): AsyncGenerator<DownloadChunk> {
  const { fh, st } = await openDownload(p, offset, beneath);
  // the file as it was opened: a writer that appends while it streams cannot make it endless
  const end = st.size;
  const readAt = async (pos: number): Promise<Buffer> => {
    if (pos >= end) return Buffer.alloc(0);
    const buf = Buffer.allocUnsafe(Math.min(STREAM_CHUNK_BYTES, end - pos));
    try {
      const { bytesRead } = await fh.read(buf, 0, buf.length, pos);
      return buf.subarray(0, bytesRead);
    } catch (err) {
      throw fsError(err, p, 'read');
    }
  };
  // one read ahead: the next chunk is read while the consumer takes this one (it waits for the
  // consumer, so at most two chunks are in memory)
  let next: Promise<Buffer> | undefined;
  try {
    yield { data: Buffer.alloc(0), offset, sizeBytes: st.size };
    let pos = offset;
    next = readAt(pos);
    for (;;) {
      signal?.throwIfAborted();
      const data = await next;
      if (data.length === 0) return;
      const at0 = pos;
      pos += data.length;
      next = readAt(pos);
      yield { data, offset: at0, sizeBytes: 0 };
    }
  } finally {
    await next?.catch(() => undefined); // never close the fd under a read
    await fh.close();
  }
}

/** writeAll writes data at pos, all of it. */
async function writeAll(fh: FileHandle, data: Uint8Array, pos: number): Promise<void> {
  for (let done = 0; done < data.length;) {
    const { bytesWritten } = await fh.write(data, done, data.length - done, pos + done);
    done += bytesWritten;
  }
}

/** checkHeader validates an upload header. Errors: INVALID_ARGUMENT. */
function checkHeader(h: UploadHeader): void {
  checkStreamPath(h.path);
  if (h.path === '/' || h.path.endsWith('/')) throw new InvalidArgumentError(`path: ${h.path} names a directory`);
  checkOffset(h.offset);
  if (!Number.isInteger(h.mode) || h.mode < 0 || h.mode > 0o7777) throw new InvalidArgumentError(`mode: ${h.mode} is not a permission mask (0..0o7777)`);
}

/**
 * uploadFile writes the data parts after the header (see UploadHeader): at offset 0 without
 * inPlace into a temp file beside the target, fsync'd and renamed over it when the end part
 * arrives (a stream that stops without it is cut: the temp file is removed, the target is
 * untouched); at an offset or inPlace into the
 * target itself (a cut stream leaves, fsync'd, the bytes written so far). A new file gets
 * mode (0: 0644); a replaced file keeps its mode. Errors: INVALID_ARGUMENT (no header first, a
 * second header, a part above MAX_UPLOAD_CHUNK_BYTES, path, mode, no end, an end whose sha256
 * differs), NOT_FOUND (no parent),
 * FAILED_PRECONDITION (a directory, a symlink below beneath, offset beyond the file's size,
 * no space), and the abort error of the stream when the caller goes away.
 */
export async function uploadFile(parts: AsyncIterable<UploadPart>): Promise<UploadResult> {
  const it = parts[Symbol.asyncIterator]();
  const first = await it.next();
  if (first.done || !('header' in first.value)) throw new InvalidArgumentError('header: the first message of an upload must be its header');
  const h = first.value.header;
  checkHeader(h);
  const w = await walkParent(h.path, h.beneath, h.createParents);
  try {
    if (!w.name) throw new InvalidArgumentError(`path: ${h.path} names a directory`);
    let before: Stats | undefined;
    try {
      before = await lstat(at(w.dir.fd, w.name));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw fsError(err, h.path, 'stat');
    }
    if (before?.isDirectory()) throw new FailedPreconditionError(`path: ${h.path} is a directory`);
    if (before?.isSymbolicLink() && w.confined) throw new FailedPreconditionError(`path: ${h.path} is a symlink; uploads below ${h.beneath} do not follow symlinks`);
    if (before && !before.isFile() && !before.isSymbolicLink()) throw new FailedPreconditionError(`path: ${h.path} is not a regular file`);
    const inPlace = h.inPlace || h.offset > 0;
    if (h.offset > 0 && !before) throw new FailedPreconditionError(`offset: ${h.offset} is beyond the end of ${h.path}, which does not exist (resume from offset 0)`);
    const mode = before ? before.mode & 0o7777 : h.mode || DEFAULT_FILE_MODE;
    const tmp = inPlace ? '' : uploadTempName(w.name);
    const flags = inPlace ? fsc.O_WRONLY | fsc.O_CREAT : fsc.O_WRONLY | fsc.O_CREAT | fsc.O_EXCL;
    const { fh, st } = await openRegular(w.dir.fd, inPlace ? w.name : tmp, h.path, w.confined, flags, mode);
    let committed = false;
    try {
      if (!before || tmp) await fh.chmod(mode); // exact bits, whatever the umask
      if (h.offset > st.size) throw new FailedPreconditionError(`offset: ${h.offset} is beyond the end of ${h.path} (${st.size} bytes; resume from there)`);
      if (inPlace) await fh.truncate(h.offset);
      const hash = createHash('sha256');
      // the disk writes beside the transfer, not all of it at the final fsync (writeback.ts)
      const writeback = new WritebackPacer(fh);
      let pos = h.offset;
      let end: { sha256: string } | undefined;
      for (let r = await it.next(); !r.done; r = await it.next()) {
        const part = r.value;
        if ('header' in part) throw new InvalidArgumentError('header: an upload has exactly one header, its first message');
        if ('end' in part) {
          end = part.end;
          break;
        }
        if (part.data.length > MAX_UPLOAD_CHUNK_BYTES) throw new InvalidArgumentError(`data: ${part.data.length} bytes in one message, at most ${MAX_UPLOAD_CHUNK_BYTES}`);
        try {
          await writeAll(fh, part.data, pos);
        } catch (err) {
          throw fsError(err, h.path, 'write');
        }
        hash.update(part.data);
        pos += part.data.length;
        writeback.wrote(part.data.length);
      }
      // a stream that stopped without its end is cut, however the transport ended it
      if (!end) throw new InvalidArgumentError('end: the upload stream stopped before its end message; nothing was committed');
      const sha256 = hash.digest('hex');
      if (end.sha256 && end.sha256 !== sha256) throw new InvalidArgumentError(`end.sha256: the ${pos - h.offset} bytes received hash to ${sha256}, not ${end.sha256}; nothing was committed`);
      try {
        await writeback.drain();
      } catch (err) {
        throw fsError(err, h.path, 'write');
      }
      await fh.sync();
      if (tmp) {
        await rename(at(w.dir.fd, tmp), at(w.dir.fd, w.name));
        committed = true;
        await w.dir.sync();
      } else if (!before) {
        await w.dir.sync();
      }
      const size = (await fh.stat()).size;
      return { sizeBytes: size, bytesWritten: pos - h.offset, sha256 };
    } finally {
      if (tmp && !committed) await unlink(at(w.dir.fd, tmp)).catch(() => undefined);
      else if (!tmp) await fh.sync().catch(() => undefined); // a cut in-place upload keeps what it wrote
      await fh.close();
    }
  } finally {
    await w.release();
  }
}
