/**
 * The reference codec: a build's descriptor set through protobufjs reflection, converting
 * between protobufjs' objects (proto field names, maps as repeated entries since the descriptor
 * import keeps map entry types) and ts-proto's shape (camelCase, `{$case, value}` oneofs,
 * maps as objects, int64 as number). protobufjs keeps no unknown fields.
 */
import type { FieldInfo, MessageInfo, Schema } from './schema';

type Obj = Record<string, unknown>;

/** referenceDecode decodes bytes as m with protobufjs and returns the ts-proto shaped object. Throws on malformed bytes. */
export function referenceDecode(s: Schema, m: MessageInfo, bytes: Uint8Array): Obj {
  const msg = m.type.decode(bytes);
  const o = m.type.toObject(msg, { longs: Number, enums: Number, defaults: true, arrays: true, objects: true });
  return toTs(s, m, o);
}

/** referenceEncode encodes a ts-proto shaped object as m with protobufjs (its `_unknownFields` are not written). Throws when protobufjs' verify rejects it. */
export function referenceEncode(s: Schema, m: MessageInfo, obj: Obj): Uint8Array {
  const plain = toPbjs(s, m, obj);
  const err = m.type.verify(plain);
  if (err) throw new Error(`protobufjs: ${m.fullName}: ${err}`);
  return m.type.encode(m.type.fromObject(plain)).finish();
}

function sub(s: Schema, f: FieldInfo): MessageInfo {
  const m = s.messages.get(f.typeName!);
  if (!m) throw new Error(`message ${f.typeName} not in the descriptor set of ${s.build.label}`);
  return m;
}

function toTs(s: Schema, m: MessageInfo, o: Obj): Obj {
  const out: Obj = {};
  const one = (f: FieldInfo, v: unknown): unknown => (v === null || v === undefined ? undefined : f.kind === 'message' ? toTs(s, sub(s, f), v as Obj) : v);
  for (const f of m.fields) {
    const v = o[f.name];
    if (f.map) {
      const entries = (v ?? []) as Obj[];
      out[f.prop] = Object.fromEntries(entries.map((e) => [String(e.key), one(f.map!.value, e.value)]));
    } else if (f.repeated) out[f.prop] = ((v ?? []) as unknown[]).map((x) => one(f, x));
    else if (f.oneof) {
      if (v !== undefined && v !== null) out[f.prop] = { $case: f.oneofCase, value: one(f, v) };
      else if (!(f.prop in out)) out[f.prop] = undefined;
    } else out[f.prop] = one(f, v);
  }
  return out;
}

function mapKey(f: FieldInfo, k: string): unknown {
  if (f.type === 'string') return k;
  if (f.type === 'bool') return k === 'true';
  return Number(k);
}

function toPbjs(s: Schema, m: MessageInfo, obj: Obj): Obj {
  const out: Obj = {};
  const one = (f: FieldInfo, v: unknown): unknown => (v !== undefined && f.kind === 'message' ? toPbjs(s, sub(s, f), v as Obj) : v);
  for (const f of m.fields) {
    if (f.oneof) {
      const o = obj[f.prop] as { $case?: string; value?: unknown } | undefined;
      if (o && o.$case === f.oneofCase && o.value !== undefined) out[f.name] = one(f, o.value);
      continue;
    }
    const v = obj[f.prop];
    if (v === undefined) continue;
    if (f.map) out[f.name] = Object.entries(v as Obj).map(([k, x]) => ({ key: mapKey(f.map!.key, k), value: one(f.map!.value, x) }));
    else if (f.repeated) out[f.name] = (v as unknown[]).map((x) => one(f, x));
    else out[f.name] = one(f, v);
  }
  return out;
}
