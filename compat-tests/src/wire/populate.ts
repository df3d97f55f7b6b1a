/**
 * A fully populated, deterministic sample of any message type of a schema, in the shape of
 * that build's ts-proto code: every field non-default, nested messages populated (down to
 * MAX_DEPTH, a recursive type stops at its second occurrence), repeated fields with 2 items,
 * maps with 2 entries, one member per oneof (variant v picks member v mod n of each oneof).
 */
import * as protobuf from 'protobufjs';
import { getField, isDefault } from './compare';
import type { FieldInfo, MessageInfo, Schema } from './schema';

/** Field number of the unknown (length-delimited) field placed inside nested messages. */
export const NESTED_UNKNOWN_FIELD = 9995;

/** A nested unknown field placed by populate: where, and its payload (without tag and length). */
export interface Marker {
  path: string;
  payload: Uint8Array;
}

/** How deep populate nests messages. */
export const MAX_DEPTH = 6;

interface GenCtx {
  s: Schema;
  variant: number;
  /** when set, every nested message gets an unknown field whose payload is recorded here */
  markers?: Marker[];
  stack: string[];
}

const utf8 = new TextEncoder();

/** scalarValue is the sample of a scalar of protobufjs type `type` for field number n (salt tells items apart). */
export function scalarValue(n: number, type: string, salt: number, path: string): unknown {
  switch (type) {
    case 'double':
      return 1.25 + n + salt;
    case 'float':
      return 0.5 + n + salt;
    case 'int32':
    case 'sint32':
    case 'sfixed32':
      return -(100000 + n * 10 + salt);
    case 'uint32':
    case 'fixed32':
      return 3000000000 + n * 10 + salt;
    case 'int64':
    case 'sint64':
    case 'sfixed64':
      return -(2 ** 40 + n * 10 + salt);
    case 'uint64':
    case 'fixed64':
      return 2 ** 50 + n * 10 + salt;
    case 'bool':
      return salt % 2 === 0;
    case 'string':
      return `${path}#${salt} é✓`;
    case 'bytes':
      return Buffer.from([n & 0xff, 0x00, 0xff, 0x80, salt & 0xff]);
    default:
      throw new Error(`${path}: unsupported scalar type ${type}`);
  }
}

/** enumValue picks a non-zero value of enum typeName (0 when it has no other). */
export function enumValue(s: Schema, typeName: string, salt: number): number {
  const e = s.enums.get(typeName);
  if (!e) throw new Error(`enum ${typeName} not in the descriptor set of ${s.build.label}`);
  const nonZero = e.values.filter((v) => v.number !== 0);
  if (nonZero.length === 0) return 0;
  return nonZero[(nonZero.length - 1 - (salt % nonZero.length) + nonZero.length) % nonZero.length]!.number;
}

/** singleValue is a value of one element of f (not the list/map around it). */
function singleValue(c: GenCtx, f: FieldInfo, salt: number, path: string): unknown {
  if (f.kind === 'scalar') return scalarValue(f.number, f.type, salt, path);
  if (f.kind === 'enum') return enumValue(c.s, f.typeName!, salt);
  const m = c.s.messages.get(f.typeName!);
  if (!m) throw new Error(`${path}: message ${f.typeName} not in the descriptor set of ${c.s.build.label}`);
  if (c.stack.includes(m.fullName) || c.stack.length >= MAX_DEPTH) return undefined;
  return populateMsg(c, m, path);
}

function fieldValue(c: GenCtx, f: FieldInfo, path: string): unknown {
  const p = `${path}.${f.name}`;
  if (f.map) {
    const out: Record<string, unknown> = {};
    for (const i of [0, 1]) {
      const k = f.map.key.type === 'string' ? `k${i}-${f.name}` : scalarValue(f.map.key.number, f.map.key.type, i, p);
      const v = singleValue(c, f.map.value, i, `${p}[${String(k)}]`);
      if (v !== undefined) out[String(k)] = v;
    }
    return out;
  }
  if (f.repeated) return [0, 1].map((i) => singleValue(c, f, i, `${p}[${i}]`)).filter((v) => v !== undefined);
  return singleValue(c, f, 0, p);
}

/** unknownFieldEntry is a ts-proto `_unknownFields` entry: the tag as key, the bytes after the tag. */
export function unknownFieldEntry(field: number, payload: Uint8Array): Record<number, Uint8Array[]> {
  return { [(field << 3) | 2]: [protobuf.Writer.create().bytes(payload).finish()] };
}

function populateMsg(c: GenCtx, m: MessageInfo, path: string): Record<string, unknown> {
  const codec = c.s.codecs.get(m.fullName);
  const obj: Record<string, unknown> = codec ? { ...codec.fromPartial({}) } : {};
  const inner: GenCtx = { ...c, stack: [...c.stack, m.fullName] };
  for (const f of m.fields) {
    if (f.oneof) continue;
    obj[f.prop] = fieldValue(inner, f, path);
  }
  for (const [, members] of m.oneofs) {
    const f = members[c.variant % members.length]!;
    const v = singleValue(inner, f, 0, `${path}.${f.name}`);
    obj[f.prop] = v === undefined ? undefined : { $case: f.oneofCase, value: v };
  }
  if (c.markers && c.stack.length > 0) {
    const payload = utf8.encode(`unknown@${path}`);
    c.markers.push({ path, payload });
    obj._unknownFields = unknownFieldEntry(NESTED_UNKNOWN_FIELD, payload);
  } else {
    obj._unknownFields = {};
  }
  return obj;
}

/** populate builds a fully populated instance of m in the shape of s's generated code. */
export function populate(s: Schema, m: MessageInfo, variant = 0, markers?: Marker[]): Record<string, unknown> {
  return populateMsg({ s, variant, markers, stack: [] }, m, shortName(m));
}

/** shortName is the message's name without its package. */
export function shortName(m: MessageInfo): string {
  return m.fullName.split('.').pop()!;
}

/** variantsOf is how many populated variants cover every member of every oneof of m. */
export function variantsOf(m: MessageInfo): number {
  return Math.max(1, ...[...m.oneofs.values()].map((x) => x.length));
}

/** variantLabel names the oneof members variant v sets (" [event=started]"), or "". */
export function variantLabel(m: MessageInfo, v: number): string {
  if (m.oneofs.size === 0) return '';
  return ` [${[...m.oneofs].map(([o, members]) => `${o}=${members[v % members.length]!.name}`).join(', ')}]`;
}

/** unpopulated lists fields a populated instance left default (a bug of the test, not of the build). */
export function unpopulated(s: Schema, m: MessageInfo, obj: Record<string, unknown>, path: string, stack: string[] = []): string[] {
  const inner = [...stack, m.fullName];
  const out: string[] = [];
  for (const f of m.fields) {
    if (f.oneof && (obj[f.prop] as { $case?: string } | undefined)?.$case !== f.oneofCase) continue;
    const v = getField(obj, f);
    const nested = f.map ? f.map.value : f;
    const recursive = nested.kind === 'message' && (inner.includes(nested.typeName!) || inner.length >= MAX_DEPTH);
    if (isDefault(f, v)) {
      if (!recursive) out.push(`test bug: populate left ${path}.${f.name} default`);
      continue;
    }
    if (f.map && Object.keys(v as object).length !== 2) out.push(`test bug: ${path}.${f.name} has ${Object.keys(v as object).length} entries`);
    else if (f.repeated && !f.map && (v as unknown[]).length !== 2) out.push(`test bug: ${path}.${f.name} has ${(v as unknown[]).length} items`);
    if (nested.kind === 'message') {
      const nm = s.messages.get(nested.typeName!)!;
      const items = f.map ? Object.values(v as object) : f.repeated ? (v as unknown[]) : [v];
      for (const it of items) out.push(...unpopulated(s, nm, it as Record<string, unknown>, `${path}.${f.name}`, inner));
    }
  }
  return out;
}
