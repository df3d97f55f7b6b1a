/**
 * The codec of the bulk-data messages of the file streams: server.v1 / podd.v1
 * DownloadFileResponse and UploadFileRequest (data part), each up to 3 MiB and a GiB copy moves
 * a thousand of them per hop. The generated (ts-proto 2.18 + @bufbuild/protobuf wire) codec
 * copies a bytes field three times to encode it (BinaryWriter grows its buffer by doubling,
 * `finish` joins the chunks, nice-grpc hands that on) and once more to decode it
 * (`Buffer.from(reader.bytes())`); on a `sandbox cp` of 1 GiB the server spent most of its CPU
 * in those copies and in the garbage collector they fed (bench `files`, profile of the server).
 *
 * This module replaces `encode` / `decode` of those four message objects with versions that
 * write the message into one buffer of its exact size (one copy of the data) and decode a data
 * field as a view of the received message (no copy; grpc-js gives each message its own buffer).
 * The wire bytes are the same as the generated codec's (field order, the oneof's empty data
 * still written); anything but the plain data messages (a header, an end, unknown fields, a
 * nested use with a writer) goes to the generated codec. Applied once, when @sandnode/shared
 * loads, before any client or server reads the definitions.
 */
import { BinaryReader, type BinaryWriter } from '@bufbuild/protobuf/wire';
import * as podd from './gen/sandnode/podd/v1/files';
import * as server from './gen/sandnode/server/v1/files';

/** varintLen is the length of n (0..2^53) as a protobuf varint, bytes. */
function varintLen(n: number): number {
  let len = 1;
  while (n >= 128) {
    n = Math.floor(n / 128);
    len++;
  }
  return len;
}

/** putVarint writes n (0..2^53) at pos and returns the position after it. */
function putVarint(buf: Buffer, pos: number, n: number): number {
  while (n >= 128) {
    buf[pos++] = (n % 128) | 128;
    n = Math.floor(n / 128);
  }
  buf[pos++] = n;
  return pos;
}

/** getVarint reads a varint at pos: [value, next pos], or undefined for one above 2^53 or cut. */
function getVarint(buf: Uint8Array, pos: number): [number, number] | undefined {
  let n = 0;
  let mul = 1;
  for (let i = 0; i < 8; i++) {
    const b = buf[pos + i];
    if (b === undefined) return undefined;
    n += (b & 127) * mul;
    if (b < 128) return [n, pos + i + 1];
    mul *= 128;
  }
  return undefined; // 8+ bytes: leave such a number to the generated codec
}

/** A writer-shaped result: nice-grpc calls `encode(m).finish()`. */
const finished = (buf: Buffer): BinaryWriter => ({ finish: () => buf }) as unknown as BinaryWriter;

const noUnknown = (m: { _unknownFields?: Record<number, Uint8Array[]> | undefined }): boolean => m._unknownFields === undefined || Object.keys(m._unknownFields).length === 0;

/** view is data [pos, pos+len) of buf as a Buffer sharing its memory. */
const view = (buf: Uint8Array, pos: number, len: number): Buffer => Buffer.from(buf.buffer, buf.byteOffset + pos, len);

type DownloadMsg = server.DownloadFileResponse | podd.DownloadFileResponse;
type DownloadFns = typeof server.DownloadFileResponse | typeof podd.DownloadFileResponse;

/** encodeDownload is DownloadFileResponse's wire form (fields 1 data, 2 offset, 3 size_bytes; zero values left out). */
export function encodeDownload(m: DownloadMsg): Buffer {
  const d = m.data;
  const size = (d.length ? 1 + varintLen(d.length) + d.length : 0) + (m.offset ? 1 + varintLen(m.offset) : 0) + (m.sizeBytes ? 1 + varintLen(m.sizeBytes) : 0);
  const buf = Buffer.allocUnsafe(size);
  let pos = 0;
  if (d.length) {
    buf[pos++] = 10;
    pos = putVarint(buf, pos, d.length);
    buf.set(d, pos);
    pos += d.length;
  }
  if (m.offset) {
    buf[pos++] = 16;
    pos = putVarint(buf, pos, m.offset);
  }
  if (m.sizeBytes) {
    buf[pos++] = 24;
    putVarint(buf, pos, m.sizeBytes);
  }
  return buf;
}

/** decodeDownload parses DownloadFileResponse with data as a view; undefined when it holds anything else (the generated codec decides). */
export function decodeDownload(buf: Uint8Array): DownloadMsg | undefined {
  const m: { data: Buffer; offset: number; sizeBytes: number; _unknownFields: Record<number, Uint8Array[]> } = { data: Buffer.alloc(0), offset: 0, sizeBytes: 0, _unknownFields: {} };
  let pos = 0;
  while (pos < buf.length) {
    const tag = buf[pos++];
    const v = getVarint(buf, pos);
    if (!v) return undefined;
    if (tag === 10) {
      if (v[1] + v[0] > buf.length) return undefined;
      m.data = view(buf, v[1], v[0]);
      pos = v[1] + v[0];
    } else if (tag === 16 || tag === 24) {
      if (tag === 16) m.offset = v[0];
      else m.sizeBytes = v[0];
      pos = v[1];
    } else {
      return undefined;
    }
  }
  return m;
}

type UploadMsg = server.UploadFileRequest | podd.UploadFileRequest;

/** encodeUploadData is UploadFileRequest{part: data} on the wire (field 2, written also when empty, as the generated codec does). */
export function encodeUploadData(data: Uint8Array): Buffer {
  const buf = Buffer.allocUnsafe(1 + varintLen(data.length) + data.length);
  buf[0] = 18;
  const pos = putVarint(buf, 1, data.length);
  buf.set(data, pos);
  return buf;
}

/** decodeUploadData parses an UploadFileRequest that is one data field (data as a view); undefined for any other message. */
export function decodeUploadData(buf: Uint8Array): Buffer | undefined {
  if (buf[0] !== 18) return undefined;
  const v = getVarint(buf, 1);
  if (!v || v[1] + v[0] !== buf.length) return undefined;
  return view(buf, v[1], v[0]);
}

function patchDownload(fns: DownloadFns): void {
  const encode = fns.encode.bind(fns);
  const decode = fns.decode.bind(fns);
  fns.encode = (m: DownloadMsg, writer?: BinaryWriter) => (writer === undefined && noUnknown(m) ? finished(encodeDownload(m)) : encode(m as never, writer));
  fns.decode = (input: BinaryReader | Uint8Array, length?: number) => ((!(input instanceof BinaryReader) && length === undefined && decodeDownload(input)) || decode(input, length)) as never;
}

function patchUpload(fns: typeof server.UploadFileRequest | typeof podd.UploadFileRequest): void {
  const encode = fns.encode.bind(fns);
  const decode = fns.decode.bind(fns);
  fns.encode = (m: UploadMsg, writer?: BinaryWriter) => (writer === undefined && m.part?.$case === 'data' && noUnknown(m) ? finished(encodeUploadData(m.part.value)) : encode(m as never, writer));
  fns.decode = (input: BinaryReader | Uint8Array, length?: number) => {
    const data = !(input instanceof BinaryReader) && length === undefined ? decodeUploadData(input) : undefined;
    return (data ? { part: { $case: 'data', value: data }, _unknownFields: {} } : decode(input, length)) as never;
  };
}

let patched = false;

/** installBulkCodec puts the fast codec on the four message objects (idempotent; done when the package loads). */
export function installBulkCodec(): void {
  if (patched) return;
  patched = true;
  patchDownload(server.DownloadFileResponse);
  patchDownload(podd.DownloadFileResponse);
  patchUpload(server.UploadFileRequest);
  patchUpload(podd.UploadFileRequest);
}

installBulkCodec();
