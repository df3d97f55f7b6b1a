/**
 * podd's half of the bulk channel (feature "podd.files.bulk.v1"; protocol in @sandnode/shared
 * bulk-channel.ts and files.proto PrepareBulkTransferRequest): a connection on podd's socket
 * that begins with BULK_MAGIC carries one request line written by the server, then the raw
 * bytes of one upload or download with the caller (the server passed the connection on).
 * The file work is file-stream.ts's (the same walk below beneath, the same temp file and
 * commit of an upload); only the framing differs. Data moves in BULK_IO_BYTES pieces: the
 * socket's 64 KiB reads are gathered before a write to the file, and a download reads the
 * file in pieces of that size.
 */
import type net from 'node:net';
import { BULK_MAGIC, errorLine, InvalidArgumentError, isSize, nextChunk, parseBulkLine, readLine, writeOrDrain, type PoddBulkRequest, type RawProtocol, type Logger } from '@sandnode/shared';
import { openDownload, uploadFile, type UploadPart } from './file-stream';

/** Bytes per file read of a download, and the most an upload gathers before one file write (2 MiB, below MAX_UPLOAD_CHUNK_BYTES). */
export const BULK_IO_BYTES = 2 * 1024 * 1024;
/** The trailer of an upload: 64 hex digits of SHA-256 and "\n". */
const TRAILER_BYTES = 65;

let activeTransfers = 0;

/** activeBulkTransfers is how many bulk connections serveBulk runs now (Health's bulk_transfers). */
export function activeBulkTransfers(): number {
  return activeTransfers;
}

/** bulkProtocol is the listener hook of podd's socket (GrpcHost.serveListener). */
export function bulkProtocol(log: Logger): RawProtocol {
  return {
    magic: BULK_MAGIC,
    handle: (socket) => {
      serveBulk(socket).catch((err: unknown) => log.warn({ err }, 'bulk transfer failed'));
    },
  };
}

/** checkRequest validates the server's request line. Errors: INVALID_ARGUMENT. */
function checkRequest(v: Record<string, unknown>): PoddBulkRequest {
  const str = (k: string) => (typeof v[k] === 'string' ? (v[k] as string) : '');
  if (!isSize(v.offset)) throw new InvalidArgumentError('offset: not a byte count');
  if (v.op === 'download') return { op: 'download', path: str('path'), offset: v.offset, beneath: str('beneath') };
  if (v.op === 'upload') {
    if (!isSize(v.sizeBytes) || !isSize(v.mode)) throw new InvalidArgumentError('sizeBytes, mode: not counts');
    return { op: 'upload', path: str('path'), offset: v.offset, mode: v.mode, inPlace: v.inPlace === true, beneath: str('beneath'), sizeBytes: v.sizeBytes };
  }
  throw new InvalidArgumentError('op: must be upload or download');
}

/** serveBulk runs one bulk connection (magic read): the request line, then the transfer; a failure is answered with an error line when no data was sent yet. */
export async function serveBulk(socket: net.Socket): Promise<void> {
  socket.on('error', () => undefined);
  let sending = false;
  activeTransfers++;
  try {
    const req = checkRequest(parseBulkLine(await readLine(socket)));
    if (req.op === 'download') {
      const { fh, st } = await openDownload(req.path, req.offset, req.beneath);
      try {
        const end = st.size; // the file as opened: appends while it streams are not sent
        await writeOrDrain(socket, `${JSON.stringify({ sizeBytes: end })}\n`);
        sending = true;
        for (let pos = req.offset; pos < end;) {
          const buf = Buffer.allocUnsafe(Math.min(BULK_IO_BYTES, end - pos));
          const { bytesRead } = await fh.read(buf, 0, buf.length, pos);
          if (bytesRead === 0) break; // cut short while streaming: the caller sees a short stream
          pos += bytesRead;
          await writeOrDrain(socket, buf.subarray(0, bytesRead));
        }
      } finally {
        await fh.close();
      }
      await new Promise<void>((resolve) => socket.end(() => resolve()));
    } else {
      const r = await uploadFile(uploadParts(socket, req));
      await new Promise<void>((resolve) => socket.end(`${JSON.stringify(r)}\n`, () => resolve()));
    }
  } catch (err) {
    if (!sending && !socket.destroyed) await new Promise<void>((resolve) => socket.end(errorLine(err), () => resolve()));
    throw err;
  } finally {
    activeTransfers--;
    socket.destroySoon();
  }
}

/**
 * uploadParts reads an upload from socket as file-stream.ts parts: the header, data gathered
 * to BULK_IO_BYTES, and the end from the trailer. Errors: INVALID_ARGUMENT (the stream ended
 * before size + trailer, bytes after the trailer, a trailer that is not 64 hex digits + "\n").
 */
async function* uploadParts(socket: net.Socket, req: Extract<PoddBulkRequest, { op: 'upload' }>): AsyncIterable<UploadPart> {
  yield { header: { path: req.path, offset: req.offset, mode: req.mode, createParents: true, inPlace: req.inPlace, beneath: req.beneath } };
  let left = req.sizeBytes;
  let gathered: Buffer[] = [];
  let n = 0;
  let tail = Buffer.alloc(0);
  for (;;) {
    const c = await nextChunk(socket);
    if (!c) break;
    const take = Math.min(left, c.length);
    if (take > 0) {
      gathered.push(take === c.length ? c : c.subarray(0, take));
      n += take;
      left -= take;
    }
    if (take < c.length) tail = Buffer.concat([tail, c.subarray(take)]);
    if (tail.length > TRAILER_BYTES) throw new InvalidArgumentError(`the upload sent more than its ${req.sizeBytes} bytes and trailer; nothing was committed`);
    if (n >= BULK_IO_BYTES || (left === 0 && n > 0)) {
      yield { data: gathered.length === 1 ? gathered[0]! : Buffer.concat(gathered, n) };
      gathered = [];
      n = 0;
    }
    if (left === 0 && tail.length === TRAILER_BYTES) break;
  }
  if (left > 0 || tail.length !== TRAILER_BYTES)
    throw new InvalidArgumentError(`end: the upload stopped after ${req.sizeBytes - left} of ${req.sizeBytes} bytes (or without its trailer); nothing was committed`);
  const hex = tail.subarray(0, 64).toString('latin1');
  if (tail[64] !== 10 || !/^[0-9a-f]{64}$/.test(hex)) throw new InvalidArgumentError('end: the trailer is not 64 lowercase hex digits and a newline');
  yield { end: { sha256: hex } };
}
