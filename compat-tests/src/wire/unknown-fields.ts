/**
 * Unknown fields on the wire, written and read with protobufjs' Writer/Reader: the unknown
 * fields appended to a message's bytes, and a scan of encoded bytes that lists every field the
 * schema does not know, at the top level and inside every nested message (through maps too).
 */
import * as protobuf from 'protobufjs';
import { NESTED_UNKNOWN_FIELD } from './populate';
import type { MessageInfo, Schema } from './schema';

/** One unknown field appended to a message: its number and its bytes (tag included). */
export interface TailField {
  what: string;
  field: number;
  bytes: Uint8Array;
}

const utf8 = new TextEncoder();
const tagged = (field: number, wireType: number) => protobuf.Writer.create().uint32(((field << 3) | wireType) >>> 0);

/** unknownTail is the unknown fields appended to every message's bytes (9999 occurs twice). */
export function unknownTail(): TailField[] {
  return [
    { what: '9999 varint', field: 9999, bytes: tagged(9999, 0).uint64(987654321012).finish() },
    { what: '9998 length-delimited', field: 9998, bytes: tagged(9998, 2).bytes(utf8.encode('sandnode-unknown-length-delimited')).finish() },
    { what: '9997 fixed32', field: 9997, bytes: tagged(9997, 5).fixed32(0xefbeadde).finish() },
    { what: '9996 fixed64', field: 9996, bytes: tagged(9996, 1).fixed32(0x04030201).fixed32(0x08070605).finish() },
    { what: '9999 varint (second occurrence)', field: 9999, bytes: tagged(9999, 0).int64(-5).finish() },
  ];
}

/** An unknown field found in encoded bytes. */
export interface FoundUnknown {
  /** 0 at the top level */
  depth: number;
  field: number;
  wireType: number;
  /** the field's bytes, tag included */
  raw: Uint8Array;
  /** for a length-delimited field: its payload */
  payload?: Uint8Array;
}

/**
 * scanUnknown reads bytes as message m of schema s and returns every field s does not know,
 * descending into known message fields (map entries included). Throws on malformed bytes.
 */
export function scanUnknown(s: Schema, m: MessageInfo, bytes: Uint8Array, depth = 0, out: FoundUnknown[] = []): FoundUnknown[] {
  const r = protobuf.Reader.create(bytes);
  while (r.pos < r.len) {
    const start = r.pos;
    const t = r.uint32();
    const field = t >>> 3;
    const wireType = t & 7;
    const f = m.fields.find((x) => x.number === field);
    if (f && f.kind === 'message' && wireType === 2) {
      const sub = s.messages.get(f.typeName!);
      const payload = r.bytes();
      if (sub) scanUnknown(s, sub, payload, depth + 1, out);
      continue;
    }
    if (f) {
      r.skipType(wireType);
      continue;
    }
    let payload: Uint8Array | undefined;
    if (wireType === 2) payload = r.bytes();
    else r.skipType(wireType);
    out.push({ depth, field, wireType, raw: bytes.subarray(start, r.pos), payload });
  }
  return out;
}

/** isNestedMarker says whether u is the nested unknown field populate placed with this payload. */
export function isNestedMarker(u: FoundUnknown, payload: Uint8Array): boolean {
  return u.depth > 0 && u.field === NESTED_UNKNOWN_FIELD && !!u.payload && Buffer.from(u.payload).equals(Buffer.from(payload));
}

/**
 * keptInsideUnknown says whether the marker payload survives inside an unknown length-delimited
 * field the reader kept whole: a message-typed field the reader's schema does not have (a field
 * a newer release added) is one unknown field to it, so the marker inside is carried as bytes,
 * not found as a nested unknown field.
 */
export function keptInsideUnknown(found: FoundUnknown[], payload: Uint8Array): boolean {
  return found.some((u) => u.wireType === 2 && Buffer.from(u.raw).includes(Buffer.from(payload)));
}
