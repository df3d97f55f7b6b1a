/**
 * `sandbox cp` over the bulk channel (feature "server.files.bulk.v1"; @sandnode/shared
 * bulk-channel.ts): PrepareBulkTransfer, then the server hands this process a socket connected
 * to the sandbox's podd and the bytes move between this process and podd only. Used when the
 * server is reached on a unix socket; a server without the call (0.2.0: UNIMPLEMENTED), a podd
 * without "podd.files.bulk.v1" (UNIMPLEMENTED) or a refused channel before any byte moved make
 * the caller fall back to the streamed gRPC calls (undefined).
 *
 * The podd runs in the sandbox: every line it sends is bounded (BULK_MAX_LINE_BYTES), its
 * announced size must be a byte count not below the offset, a byte past that size or a stream
 * shorter than it is an error and the local file is never committed.
 */
import type { Hash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import type { FileHandle } from 'node:fs/promises';
import net from 'node:net';
import { ClientError, Status } from 'nice-grpc-common';
import { BULK_LINE_TIMEOUT_MS, BULK_MAGIC, WritebackPacer, isSize, nextChunk, parseBulkLine, readLine, writeOrDrain, type ServerApi } from '@sandnode/shared';
import { BulkDirection, type PrepareBulkTransferRequest } from '@sandnode/shared/proto/server/v1/files';
import { CliError } from '../output';

/** How long the CLI waits for podd's answer to an upload once every byte was sent, ms (its fsync and sha256 of a large file). */
const UPLOAD_ANSWER_TIMEOUT_MS = 60 * 60 * 1000;
/** Most bytes of podd's answer to an upload the CLI keeps (one JSON line). */
const UPLOAD_ANSWER_MAX_BYTES = 64 * 1024;

/** Bytes the CLI reads from a local file at once, and gathers before one write to it (4 MiB). */
export const BULK_CLI_IO_BYTES = 4 * 1024 * 1024;

interface USock {
  connect(path: string, cb?: () => void): void;
  on(ev: string, cb: (...a: unknown[]) => void): void;
  removeAllListeners(ev: string): void;
  read(size?: number, fds?: number): { data?: Buffer; fds?: number[] } | Buffer | null;
  write(data: Buffer): void;
  destroy(): void;
}
type USocketModule = { USocket: new () => USock };

/** the method a bulk failure is reported as (its gRPC code kept for --json) */
const METHOD = '/sandnode.server.v1.SandboxService/PrepareBulkTransfer';

/** lineError turns a peer's {"error":{code,message}} line into a ClientError; undefined when the line is none. */
function lineError(v: Record<string, unknown>, who: string): ClientError | undefined {
  const e = v.error as { code?: unknown; message?: unknown } | undefined;
  if (!e) return undefined;
  const code = typeof e.code === 'number' && e.code > 0 && e.code < 17 ? (e.code as Status) : Status.UNKNOWN;
  return new ClientError(METHOD, code, `${who}: ${String(e.message ?? '').slice(0, 1000)}`);
}

/**
 * openBulk asks for a bulk transfer and returns the socket connected to the sandbox's podd
 * (already told what to do); undefined to fall back to gRPC (not a unix server, an older
 * server or podd, the channel refused before it was passed). Errors: the ClientError of a
 * refused PrepareBulkTransfer other than UNIMPLEMENTED (a bad path, a missing sandbox).
 */
export async function openBulk(api: ServerApi, req: PrepareBulkTransferRequest): Promise<net.Socket | undefined> {
  const m = /^unix:\/\/(\/.*)$/.exec(api.address ?? '');
  if (!m || process.env.SANDNODE_CP_GRPC === '1') return undefined;
  let token: string;
  try {
    token = (await api.sandboxes.prepareBulkTransfer(req)).token;
  } catch (err) {
    // an older server or podd (UNIMPLEMENTED), or a caller the channel is not served to
    if (err instanceof ClientError && (err.code === Status.UNIMPLEMENTED || (err.code === Status.FAILED_PRECONDITION && /bulk channel/.test(err.details)))) return undefined;
    throw err;
  }
  let usocket: USocketModule;
  try {
    usocket = require('usocket') as USocketModule;
  } catch {
    return undefined;
  }
  const fd = await receiveFd(usocket, m[1] ?? '', token).catch(() => undefined);
  if (fd === undefined) return undefined;
  const s = new net.Socket({ fd, readable: true, writable: true, allowHalfOpen: true });
  s.pause();
  s.on('error', () => undefined);
  return s;
}

/** receiveFd connects to the server at socketPath, sends the token and takes the fd it passes; rejects on an error line, an end or BULK_LINE_TIMEOUT_MS. */
function receiveFd(usocket: USocketModule, socketPath: string, token: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const u = new usocket.USocket();
    let text = Buffer.alloc(0);
    let over = false;
    const finish = (err: Error | undefined, fd?: number) => {
      if (over) return;
      over = true;
      clearTimeout(timer);
      // not from inside its own 'readable' handler: usocket asserts on a read of a destroyed handle
      u.removeAllListeners('readable');
      setImmediate(() => u.destroy());
      if (err) reject(err);
      else resolve(fd!);
    };
    const timer = setTimeout(() => finish(new Error('the server passed no connection in time')), BULK_LINE_TIMEOUT_MS);
    u.on('error', (e) => finish(e as Error));
    u.on('end', () => finish(new Error(`the server ended the bulk connection: ${text.toString().slice(0, 300)}`)));
    // 'readable' only once connected: a read before it reaches usocket's unconnected handle (an assertion aborts the process)
    u.connect(socketPath, () => {
      u.on('readable', () => {
        const got = u.read(1, 1) as { data?: Buffer; fds?: number[] } | null;
        if (got?.fds?.length) {
          for (const extra of got.fds.slice(1)) closeFd(extra);
          if (got.data?.[0] === 0x4b) finish(undefined, got.fds[0]);
          else {
            for (const f of got.fds) closeFd(f);
            finish(new Error('the server sent an fd with an unknown tag'));
          }
          return;
        }
        const d = u.read() as Buffer | null;
        if (d) text = Buffer.concat([text, d]).subarray(0, 4096);
      });
      u.write(Buffer.concat([BULK_MAGIC, Buffer.from(`${token}\n`)]));
    });
  });
}

function closeFd(fd: number): void {
  try {
    require('node:fs').closeSync(fd);
  } catch {
    /* gone */
  }
}

/** What a bulk upload reports (podd's result line, checked). */
export interface BulkUploaded {
  sizeBytes: number;
  bytesWritten: number;
  sha256: string;
}

/**
 * bulkUpload sends bytes [offset, offset + size) of local file src on s, each through sent
 * (and whole), then the trailer, and reads podd's result. Errors: ClientError (podd's error
 * line), CliError (the file changed size, a bad result line).
 */
export async function bulkUpload(s: net.Socket, src: string, offset: number, size: number, hashes: Hash[], tick: (pos: number) => void): Promise<BulkUploaded> {
  // what podd sends: nothing until its result line, or an error line at once when it refuses
  // (a symlink or fifo at the target), then it closes; read as it comes, so a refusal's reason
  // and code survive the close (attacker: "closed during the upload" was all the CLI said)
  let text = '';
  let closed = false;
  let wake: () => void = () => undefined;
  s.on('data', (d: Buffer) => {
    if (text.length < UPLOAD_ANSWER_MAX_BYTES) text += d.toString('utf8');
    wake();
  });
  s.once('close', () => {
    closed = true;
    wake();
  });
  s.resume();
  const line = (): string | undefined => {
    const i = text.indexOf('\n');
    return i >= 0 ? text.slice(0, i) : undefined;
  };
  const refusal = (): Error => {
    const l = line();
    try {
      const err = l ? lineError(parseBulkLine(l), 'the sandbox refused the upload') : undefined;
      if (err) return err;
    } catch {
      /* not a line of podd's */
    }
    return new CliError('the sandbox closed the bulk connection during the upload');
  };
  try {
    let pos = offset;
    const failed = new Promise<never>((_, reject) => {
      const check = () => (closed || line() !== undefined ? reject(refusal()) : undefined);
      wake = check;
      check();
    });
    failed.catch(() => undefined);
    if (size > 0) {
      for await (const c of createReadStream(src, { start: offset, end: offset + size - 1, highWaterMark: BULK_CLI_IO_BYTES })) {
        const b = c as Buffer;
        for (const h of hashes) h.update(b);
        pos += b.length;
        tick(pos);
        await Promise.race([writeOrDrain(s, b).catch((err: unknown) => Promise.reject(line() !== undefined ? refusal() : err)), failed]);
      }
    }
    if (pos !== offset + size) throw new CliError(`${src} changed while it was copied (${pos - offset} bytes read of ${size}); copy again`);
    // no end(): podd's socket is not half-open, a FIN would close its side before it answers
    s.write(`${hashes[0]!.copy().digest('hex')}\n`);
    const answer = await new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => reject(new CliError('the sandbox did not answer the upload within 1 h; copy again')), UPLOAD_ANSWER_TIMEOUT_MS);
      const check = () => {
        const l = line();
        if (l === undefined && !closed) return;
        clearTimeout(timer);
        if (l === undefined) reject(new CliError('the sandbox closed the bulk connection before its answer; the copy may not be complete; copy again'));
        else resolve(l);
      };
      wake = check;
      check();
    });
    const v = parseBulkLine(answer);
    const err = lineError(v, 'the sandbox refused the upload');
    if (err) throw err;
    if (!isSize(v.sizeBytes) || !isSize(v.bytesWritten) || typeof v.sha256 !== 'string')
      throw new CliError('the sandbox answered the upload with a malformed result; the copy may be damaged; copy again');
    return { sizeBytes: v.sizeBytes, bytesWritten: v.bytesWritten, sha256: v.sha256.slice(0, 64) };
  } finally {
    s.destroy();
  }
}

/**
 * bulkDownload reads the file podd sends on s into fh from offset, hashing into whole, and
 * returns the file's size. Errors: ClientError (podd's error line), CliError (a malformed
 * size, a byte past it, a short stream).
 */
export async function bulkDownload(s: net.Socket, fh: FileHandle, offset: number, whole: Hash, start: (size: number) => void, tick: (pos: number) => void): Promise<number> {
  try {
    const v = parseBulkLine(await readLine(s));
    const err = lineError(v, 'the sandbox refused the download');
    if (err) throw err;
    const size = v.sizeBytes;
    if (!isSize(size) || size < offset) throw new CliError(`the sandbox announced a size (${String(size).slice(0, 40)}) that is no byte count at or above ${offset}; nothing was written`);
    start(size);
    let pos = offset;
    let gathered: Buffer[] = [];
    let n = 0;
    // the disk writes beside the transfer, not all of it at the commit's fsync (writeback.ts)
    const writeback = new WritebackPacer(fh);
    const flush = async () => {
      if (n === 0) return;
      const b = gathered.length === 1 ? gathered[0]! : Buffer.concat(gathered, n);
      for (let done = 0; done < b.length;) done += (await fh.write(b, done, b.length - done, pos - n + done)).bytesWritten;
      writeback.wrote(b.length);
      gathered = [];
      n = 0;
    };
    while (pos < size) {
      const c = await nextChunk(s);
      if (!c) throw new CliError(`the sandbox's stream ended at byte ${pos} of ${size}; copy again (only a copy with --resume keeps what arrived, and a later --resume continues it)`);
      if (pos + c.length > size) throw new CliError(`the sandbox sent more than the ${size} bytes it announced; stopped (the copy was not committed)`);
      whole.update(c);
      gathered.push(c);
      n += c.length;
      pos += c.length;
      if (n >= BULK_CLI_IO_BYTES) await flush();
      tick(pos);
    }
    await flush();
    await writeback.drain();
    // after the announced size only the end may come
    const more = await Promise.race([nextChunk(s), new Promise<'late'>((r) => setTimeout(() => r('late'), BULK_LINE_TIMEOUT_MS).unref())]);
    if (more === 'late') throw new CliError(`the sandbox did not end the stream after the ${size} bytes it announced; stopped (the copy was not committed)`);
    if (more) throw new CliError(`the sandbox sent more than the ${size} bytes it announced; stopped (the copy was not committed)`);
    return size;
  } finally {
    s.destroy();
  }
}

/** uploadRequest / downloadRequest are the PrepareBulkTransfer requests of a copy. */
export const uploadRequest = (sandboxId: string, path: string, offset: number, mode: number, inPlace: boolean, sizeBytes: number): PrepareBulkTransferRequest => ({
  sandboxId,
  path,
  direction: BulkDirection.BULK_DIRECTION_UPLOAD,
  offset,
  mode,
  inPlace,
  sizeBytes,
});
export const downloadRequest = (sandboxId: string, path: string, offset: number): PrepareBulkTransferRequest => ({
  sandboxId,
  path,
  direction: BulkDirection.BULK_DIRECTION_DOWNLOAD,
  offset,
  mode: 0,
  inPlace: false,
  sizeBytes: 0,
});
