/**
 * `sandnode sandbox cp SRC DST | ls ID [PATH] | stat ID PATH`: files in and out of a sandbox,
 * like `kubectl cp`. One side of `cp` is `sb-<16 hex>:PATH` (PATH relative to /workspace, or
 * absolute below it), the other a local file. Any size: the bytes stream (UploadFile /
 * DownloadFile, feature "server.files.stream.v1"), one chunk in memory at a time; on a unix
 * socket over the bulk channel instead (sandbox-bulk.ts, "server.files.bulk.v1": the server
 * leaves the data path), falling back to the streams when the server or podd lacks it. A copy goes
 * to a temp file beside the target that replaces it at the end, so a cut copy leaves the
 * target as it was; `--resume` writes in place and continues from the target's size instead.
 * Progress goes to stderr on a TTY; `--json` prints {source, destination, bytes, bytesSent,
 * offset, sha256, durationMs, mbPerSec} (sha256 of the whole file).
 */
import { createHash, type Hash } from 'node:crypto';
import { createReadStream, type Stats } from 'node:fs';
import { stat, type FileHandle } from 'node:fs/promises';
import path from 'node:path';
import { ClientError, Status } from 'nice-grpc-common';
import { FileType, type FileInfo, type UploadFileRequest } from '@sandnode/shared/proto/server/v1/files';
import type { ServerApi } from '@sandnode/node-stack';
import { WritebackPacer } from '@sandnode/shared';
import { CliError, UsageError } from '../output';
import { openRoot, receiveFile } from './local-beneath';
import { bulkDownload, bulkUpload, downloadRequest, openBulk, uploadRequest } from './sandbox-bulk';

/** Bytes per UploadFile data message (1 MiB). */
export const UPLOAD_CHUNK_BYTES = 1024 * 1024;

/** A `sb-<id>:PATH` operand. */
export interface RemoteSpec {
  sandboxId: string;
  path: string;
}

/** parseRemote reads `sb-<16 hex>:PATH`; undefined for a local path. */
export function parseRemote(s: string): RemoteSpec | undefined {
  const m = /^(sb-[0-9a-f]{16}):(.*)$/.exec(s);
  return m ? { sandboxId: m[1] ?? '', path: m[2] ?? '' } : undefined;
}

/** What `cp` reports. */
export interface CopyResult {
  source: string;
  destination: string;
  /** the file's size after the copy, bytes */
  bytes: number;
  /** bytes moved by this run (less than bytes after --resume) */
  bytesSent: number;
  /** where this run started, bytes */
  offset: number;
  /** SHA-256 of the whole file, lowercase hex */
  sha256: string;
  durationMs: number;
  /** bytesSent / duration, 10^6 bytes per second */
  mbPerSec: number;
  /** how the bytes moved: "bulk" (the bulk channel, sandbox-bulk.ts) or "grpc" (the streamed calls) */
  via: 'bulk' | 'grpc';
}

const mib = (n: number) => (n / 1048576).toFixed(1);
/** rate is bytes per ms as MB/s (10^6 bytes), one decimal. */
const rate = (bytes: number, ms: number) => Math.round((bytes / 1e3 / Math.max(ms, 1)) * 10) / 10;

/** Progress on stderr when it is a TTY (and not --json): bytes, percent and rate, at most 4 times a second. */
export class Progress {
  private last = 0;
  private readonly on: boolean;
  private readonly t0 = Date.now();
  constructor(
    private readonly total: number,
    private readonly start: number,
    json: boolean,
  ) {
    this.on = !json && process.stderr.isTTY === true;
  }
  tick(done: number): void {
    const now = Date.now();
    if (!this.on || now - this.last < 250) return;
    this.last = now;
    const pct = this.total ? Math.floor((100 * done) / this.total) : 100;
    process.stderr.write(`\r${mib(done)} / ${mib(this.total)} MiB  ${pct}%  ${rate(done - this.start, now - this.t0).toFixed(0)} MB/s   `);
  }
  end(): void {
    if (this.on) process.stderr.write('\n');
  }
}

/** hashPrefix feeds the first n bytes of a local file into h (the part a resumed copy does not send). */
async function hashPrefix(file: string, n: number, h: Hash): Promise<void> {
  if (n === 0) return;
  for await (const c of createReadStream(file, { start: 0, end: n - 1, highWaterMark: UPLOAD_CHUNK_BYTES })) h.update(c as Buffer);
}

/** streamFailed turns an UNIMPLEMENTED of an older server into words (the gRPC code stays in --json); other errors pass. */
export function streamFailed(err: unknown): unknown {
  if (err instanceof ClientError && err.code === Status.UNIMPLEMENTED && !/podd/.test(err.details)) {
    return new CliError('the server lacks the streamed file calls (feature "server.files.stream.v1"): upgrade it (sandnode upgrade server)', { cause: err });
  }
  return err;
}

export async function statRemote(api: ServerApi, r: RemoteSpec): Promise<FileInfo | undefined> {
  try {
    return (await api.sandboxes.statFile({ sandboxId: r.sandboxId, path: r.path })).info;
  } catch (err) {
    if (err instanceof ClientError && err.code === Status.NOT_FOUND && /no such file/.test(err.details)) return undefined;
    throw streamFailed(err);
  }
}

/** upload copies local file src to r (into it when r is a directory). */
export async function upload(api: ServerApi, src: string, r: RemoteSpec, o: { resume?: boolean; json?: boolean }): Promise<CopyResult> {
  const st = await stat(src).catch((err: NodeJS.ErrnoException) => {
    throw new CliError(`${src}: ${err.code ?? err.message}`);
  });
  if (!st.isFile()) throw new UsageError(`${src} is not a regular file`);
  let dest = r;
  const there = await statRemote(api, r);
  if (r.path.endsWith('/') || there?.type === FileType.FILE_TYPE_DIRECTORY) dest = { ...r, path: path.posix.join(r.path || '/workspace', path.basename(src)) };
  const cur = o.resume ? (dest === r ? there : await statRemote(api, dest)) : undefined;
  return sendFile(api, src, st, dest, cur, o);
}

/**
 * sendFile streams local file src (stat st) to exactly dest; with resume and cur (dest's
 * description) a regular file no longer than src, from cur's size. Errors: CliError (a damaged
 * copy), the stream's ClientError.
 */
export async function sendFile(api: ServerApi, src: string, st: Stats, dest: RemoteSpec, cur: FileInfo | undefined, o: { resume?: boolean; json?: boolean; quiet?: boolean }): Promise<CopyResult> {
  let offset = 0;
  if (o.resume && cur?.type === FileType.FILE_TYPE_REGULAR && cur.sizeBytes <= st.size) offset = cur.sizeBytes;
  // one hash when the whole file is sent (offset 0), two when a resume sends only its tail
  const sent = createHash('sha256');
  const whole = offset === 0 ? sent : createHash('sha256');
  await hashPrefix(src, offset, whole);
  const progress = new Progress(st.size, offset, o.json === true || o.quiet === true);
  let pos = offset;
  const t0 = Date.now();
  let res: { sizeBytes: number; bytesWritten: number; sha256: string } | undefined;
  const bulk = await openBulk(api, uploadRequest(dest.sandboxId, dest.path, offset, st.mode & 0o777, o.resume === true, st.size - offset)).catch((err: unknown) => {
    throw streamFailed(err);
  });
  if (bulk) {
    try {
      res = await bulkUpload(bulk, src, offset, st.size - offset, whole === sent ? [sent] : [sent, whole], (p) => {
        pos = p;
        progress.tick(p);
      });
    } finally {
      progress.end();
    }
  }
  async function* requests(): AsyncIterable<UploadFileRequest> {
    yield { part: { $case: 'header', value: { sandboxId: dest.sandboxId, path: dest.path, offset, mode: st.mode & 0o777, inPlace: o.resume === true } } };
    for await (const c of createReadStream(src, { start: offset, highWaterMark: UPLOAD_CHUNK_BYTES })) {
      const b = c as Buffer;
      if (whole !== sent) whole.update(b);
      sent.update(b);
      pos += b.length;
      progress.tick(pos);
      yield { part: { $case: 'data', value: b } };
    }
    // the end says the upload is complete (a stream cut before it is never committed), with the hash podd checks
    yield { part: { $case: 'end', value: { sha256: sent.copy().digest('hex') } } };
  }
  if (!res) {
    try {
      // no deadline: the size decides how long it takes; Ctrl-C ends it
      res = await api.sandboxes.uploadFile(requests(), { deadline: undefined, retry: false });
    } catch (err) {
      throw streamFailed(err);
    } finally {
      progress.end();
    }
  }
  const ms = Date.now() - t0;
  const mine = sent.copy().digest('hex');
  if (res.sha256 !== mine || res.bytesWritten !== pos - offset) {
    throw new CliError(`the sandbox wrote ${res.bytesWritten} bytes with sha256 ${res.sha256}, this side sent ${pos - offset} with sha256 ${mine}: the copy is damaged; copy again`);
  }
  return {
    source: src,
    destination: `${dest.sandboxId}:${dest.path}`,
    bytes: res.sizeBytes,
    bytesSent: pos - offset,
    offset,
    sha256: whole.digest('hex'),
    durationMs: ms,
    mbPerSec: rate(pos - offset, ms),
    via: bulk ? 'bulk' : 'grpc',
  };
}

/** What one received file came to: its size, the bytes this run moved, where it started, its sha256. */
export interface Received {
  bytes: number;
  bytesSent: number;
  offset: number;
  sha256: string;
  ms: number;
  via: 'bulk' | 'grpc';
}

/**
 * receiveInto streams r into name of the local directory dir (local-beneath.ts: no symlink
 * followed; a temp file renamed over name at the end, or with resume name itself from its
 * size). mode, when set, is given to the file. Errors: CliError (a damaged or cut stream, a
 * symlink or directory at name), the stream's ClientError.
 */
export async function receiveInto(
  api: ServerApi,
  r: RemoteSpec,
  dir: FileHandle,
  name: string,
  shown: string,
  o: { resume?: boolean; json?: boolean; mode?: number; quiet?: boolean },
): Promise<Received> {
  const f = await receiveFile(dir, name, shown, o.resume === true);
  const offset = f.size;
  const whole = createHash('sha256');
  let pos = offset;
  let committed = false;
  const t0 = Date.now();
  let progress: Progress | undefined;
  let size = 0;
  let via: 'bulk' | 'grpc' = 'grpc';
  try {
    if (offset > 0) await hashHandle(f.fh, offset, whole);
    const bulk = await openBulk(api, downloadRequest(r.sandboxId, r.path, offset));
    if (bulk) {
      via = 'bulk';
      pos = await bulkDownload(
        bulk,
        f.fh,
        offset,
        whole,
        (n) => (progress = new Progress(n, offset, o.json === true || o.quiet === true)),
        (p) => progress?.tick(p),
      );
    }
    const writeback = new WritebackPacer(f.fh);
    for await (const m of bulk ? [] : api.sandboxes.downloadFile({ sandboxId: r.sandboxId, path: r.path, offset })) {
      if (!progress) {
        progress = new Progress(m.sizeBytes, offset, o.json === true || o.quiet === true);
        size = m.sizeBytes;
      }
      if (m.data.length === 0) continue;
      if (m.offset !== pos) throw new CliError(`the stream skipped from byte ${pos} to ${m.offset}; copy again`);
      // podd runs in the sandbox: one that sends past the size it announced is not written out (it could fill this disk)
      if (pos + m.data.length > size) throw new CliError(`the sandbox sent more than the ${size} bytes the file had when the copy began; stopped there (only the bytes up to that size were written)`);
      await writeFully(f.fh, m.data, pos);
      writeback.wrote(m.data.length);
      whole.update(m.data);
      pos += m.data.length;
      progress.tick(pos);
    }
    // the first message announced the size: a stream that ends short of it is cut (the file
    // shrank while podd read it, or a hostile podd stopped), never committed (the bulk path's rule)
    if (!bulk && progress && pos < size)
      throw new CliError(
        `the sandbox's stream ended at byte ${pos} of the ${size} it announced; nothing was committed; copy again (only a copy with --resume keeps what arrived, and a later --resume continues it)`,
      );
    await writeback.drain();
    await f.commit(o.mode);
    committed = true;
  } catch (err) {
    throw streamFailed(err);
  } finally {
    progress?.end();
    if (!committed) await f.abort();
  }
  return { bytes: pos, bytesSent: pos - offset, offset, sha256: whole.digest('hex'), ms: Date.now() - t0, via };
}

/** writeFully writes all of data at pos. */
async function writeFully(fh: FileHandle, data: Uint8Array, pos: number): Promise<void> {
  for (let done = 0; done < data.length;) {
    const { bytesWritten } = await fh.write(data, done, data.length - done, pos + done);
    done += bytesWritten;
  }
}

/** hashHandle feeds the first n bytes of an open file into h (the part a resumed copy does not fetch). */
async function hashHandle(fh: FileHandle, n: number, h: Hash): Promise<void> {
  const buf = Buffer.allocUnsafe(UPLOAD_CHUNK_BYTES);
  for (let pos = 0; pos < n;) {
    const { bytesRead } = await fh.read(buf, 0, Math.min(buf.length, n - pos), pos);
    if (bytesRead === 0) break;
    h.update(buf.subarray(0, bytesRead));
    pos += bytesRead;
  }
}

/**
 * download copies file r to local dst (into it when dst is a directory), given permission bits
 * o.mode when set (else 0600). The file is written through the fd of its directory without
 * following a symlink (local-beneath.ts). Errors: CliError (a damaged or cut stream, a symlink
 * at the target with --resume), the stream's ClientError.
 */
export async function download(api: ServerApi, r: RemoteSpec, dst: string, o: { resume?: boolean; json?: boolean; mode?: number }): Promise<CopyResult> {
  let target = dst;
  const local = await stat(dst).catch(() => undefined);
  if (dst.endsWith('/') || local?.isDirectory()) target = path.join(dst, path.posix.basename(r.path));
  const dir = await openRoot(path.dirname(target));
  try {
    const got = await receiveInto(api, r, dir, path.basename(target), target, o);
    return {
      source: `${r.sandboxId}:${r.path}`,
      destination: target,
      bytes: got.bytes,
      bytesSent: got.bytesSent,
      offset: got.offset,
      sha256: got.sha256,
      durationMs: got.ms,
      mbPerSec: rate(got.bytesSent, got.ms),
      via: got.via,
    };
  } finally {
    await dir.close();
  }
}

const TYPE_WORD: Record<number, string> = { [FileType.FILE_TYPE_REGULAR]: 'file', [FileType.FILE_TYPE_DIRECTORY]: 'dir', [FileType.FILE_TYPE_SYMLINK]: 'link', [FileType.FILE_TYPE_OTHER]: 'other' };

/** infoLine is one line of `sandbox ls` / `sandbox stat`: type, mode (octal), size (bytes), mtime (ISO), name (control characters escaped). */
export function infoLine(e: FileInfo): string {
  return `${(TYPE_WORD[e.type] ?? '?').padEnd(5)} ${e.mode.toString(8).padStart(4, '0')} ${String(e.sizeBytes).padStart(12)} ${new Date(e.mtimeMs).toISOString()} ${shownName(e.name)}`;
}

/**
 * shownName is a file name as a terminal may show it: control characters (C0, DEL, C1) as \xNN.
 * The names come from the sandbox: one named with escape sequences would otherwise drive the
 * operator's terminal (retitle it, rewrite earlier lines, hide entries), as GNU ls's quoting prevents.
 */
export function shownName(name: string): string {
  // eslint-disable-next-line no-control-regex
  return name.replace(/[\u0000-\u001f\u007f-\u009f]/g, (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, '0')}`);
}

/** infoJson is FileInfo as the proto JSON mapping shows it (the type by its enum name). */
export const infoJson = (e: FileInfo) => ({ name: e.name, type: FileType[e.type], sizeBytes: e.sizeBytes, mode: e.mode, mtimeMs: e.mtimeMs });

/** The most entries `sandbox ls` collects, and the size of the pages it asks for. */
export const LS_MAX_ENTRIES = 1_000_000;
const LS_PAGE_SIZE = 1000;

/**
 * listAll lists directory p of sandbox id page by page. The pages come from the sandbox's podd:
 * a page token seen before (a loop) or more than LS_MAX_ENTRIES entries end it with a CliError
 * instead of collecting without end. Errors: CliError, and the calls' (streamFailed).
 */
export async function listAll(api: ServerApi, id: string, p: string): Promise<FileInfo[]> {
  const all: FileInfo[] = [];
  const seen = new Set<string>();
  let token = '';
  try {
    do {
      const page = await api.sandboxes.listDirectory({ sandboxId: id, path: p, pageSize: LS_PAGE_SIZE, pageToken: token });
      all.push(...page.entries);
      token = page.nextPageToken;
      if (token && seen.has(token)) throw new CliError(`the sandbox's listing of ${p || '/workspace'} came back to a page it gave before (after ${all.length} entries); stopped`);
      seen.add(token);
      if (all.length > LS_MAX_ENTRIES) throw new CliError(`${p || '/workspace'} has more than ${LS_MAX_ENTRIES} entries; stopped (list a directory below it)`);
    } while (token);
  } catch (err) {
    throw streamFailed(err);
  }
  return all;
}
