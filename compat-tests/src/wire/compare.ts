/**
 * Field-by-field comparison of a message as one build wrote it (the expected object, in that
 * build's ts-proto shape) with what another build read (the actual object): fields both know
 * must be equal (recursively, by field number), a field only the writer knows must be in the
 * reader's `_unknownFields`, a field only the reader knows must be default. Fields whose type
 * changed are left to the schema check.
 */
import { sameType, type FieldInfo, type MessageInfo, type Schema } from './schema';

/** One side of a comparison: a schema and a message of it. */
export interface Side {
  s: Schema;
  m: MessageInfo;
}

/** isBytes says whether v is a byte array (Uint8Array, Buffer, any typed array view). */
export function isBytes(v: unknown): v is Uint8Array {
  return v instanceof Uint8Array || (typeof v === 'object' && v !== null && ArrayBuffer.isView(v));
}

export function bytesEqual(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

/** getField reads f from a ts-proto object (a oneof member only when its `$case` is set). */
export function getField(obj: Record<string, unknown> | undefined, f: FieldInfo): unknown {
  if (!obj) return undefined;
  const v = obj[f.prop];
  if (f.oneofCase) {
    const o = v as { $case?: string; value?: unknown } | undefined;
    return o && o.$case === f.oneofCase ? o.value : undefined;
  }
  return v;
}

/** isDefault says whether v is f's proto3 default (a set oneof member never is). */
export function isDefault(f: FieldInfo, v: unknown): boolean {
  if (v === undefined || v === null) return true;
  if (f.oneofCase) return false;
  if (f.map) return Object.keys(v as object).length === 0;
  if (f.repeated) return (v as unknown[]).length === 0;
  if (isBytes(v)) return v.length === 0;
  return v === 0 || v === '' || v === false;
}

/** show prints a value for a failure message (bytes as hex, at most 120 characters). */
export function show(v: unknown): string {
  if (isBytes(v)) return `bytes[${Buffer.from(v).toString('hex')}]`;
  let s: string;
  try {
    s = JSON.stringify(v, (_k, x: unknown) => (isBytes(x) ? `bytes[${Buffer.from(x).toString('hex')}]` : x)) ?? String(v);
  } catch {
    s = String(v);
  }
  return s.length > 120 ? `${s.slice(0, 117)}...` : s;
}

/** unknownNumbers is the set of field numbers in a ts-proto object's `_unknownFields`. */
export function unknownNumbers(obj: Record<string, unknown>): Set<number> {
  const u = (obj._unknownFields ?? {}) as Record<string, unknown>;
  return new Set(Object.keys(u).map((k) => Number(k) >>> 3));
}

/**
 * compareMessage compares exp (built for e) with act (decoded by a) on the fields both know;
 * fields only e knows must be in act's unknown fields (unless ignoreUnknown: a reader that
 * keeps none, like protobufjs), fields only a knows must be default. Appends to errs.
 */
export function compareMessage(e: Side, a: Side, exp: Record<string, unknown> | undefined, act: Record<string, unknown> | undefined, path: string, errs: string[], ignoreUnknown = false): void {
  if (exp === undefined || act === undefined) {
    if (exp !== act) errs.push(`${path}: expected ${exp === undefined ? 'unset' : 'a message'}, got ${act === undefined ? 'unset' : 'a message'}`);
    return;
  }
  for (const ef of e.m.fields) {
    const af = a.m.fields.find((x) => x.number === ef.number);
    const ev = getField(exp, ef);
    const p = `${path}.${ef.name}`;
    if (!af) {
      if (!ignoreUnknown && !isDefault(ef, ev) && !unknownNumbers(act).has(ef.number))
        errs.push(`${p} (${ef.number}): known only to ${e.s.build.label}, not kept in ${a.s.build.label}'s unknown fields`);
      continue;
    }
    if (sameType(ef, af)) continue; // reported by the schema check
    compareValue(e, a, ef, af, ev, getField(act, af), p, errs, ignoreUnknown);
  }
  for (const af of a.m.fields) {
    if (e.m.fields.some((x) => x.number === af.number)) continue;
    const av = getField(act, af);
    if (!isDefault(af, av)) errs.push(`${path}.${af.name} (${af.number}): known only to ${a.s.build.label} but decoded as ${show(av)} from ${e.s.build.label}'s bytes`);
  }
}

function compareValue(e: Side, a: Side, ef: FieldInfo, af: FieldInfo, ev: unknown, av: unknown, p: string, errs: string[], ignoreUnknown: boolean): void {
  if (ef.map && af.map) {
    const em = (ev ?? {}) as Record<string, unknown>;
    const am = (av ?? {}) as Record<string, unknown>;
    const ek = Object.keys(em).sort();
    const ak = Object.keys(am).sort();
    if (show(ek) !== show(ak)) {
      errs.push(`${p}: map keys ${show(ek)} became ${show(ak)}`);
      return;
    }
    for (const k of ek) compareSingle(e, a, ef.map.value, af.map.value, em[k], am[k], `${p}[${k}]`, errs, ignoreUnknown);
    return;
  }
  if (ef.repeated) {
    const el = (ev ?? []) as unknown[];
    const al = (av ?? []) as unknown[];
    if (!Array.isArray(av) && av !== undefined) {
      errs.push(`${p}: expected a list, got ${show(av)}`);
      return;
    }
    if (el.length !== al.length) {
      errs.push(`${p}: ${el.length} items became ${al.length}`);
      return;
    }
    el.forEach((x, i) => compareSingle(e, a, ef, af, x, al[i], `${p}[${i}]`, errs, ignoreUnknown));
    return;
  }
  compareSingle(e, a, ef, af, ev, av, p, errs, ignoreUnknown);
}

function compareSingle(e: Side, a: Side, ef: FieldInfo, af: FieldInfo, ev: unknown, av: unknown, p: string, errs: string[], ignoreUnknown: boolean): void {
  if (ef.kind === 'message') {
    const em = e.s.messages.get(ef.typeName!);
    const am = a.s.messages.get(af.typeName!);
    if (!em || !am) {
      errs.push(`${p}: message type ${ef.typeName} missing from a descriptor set`);
      return;
    }
    compareMessage({ s: e.s, m: em }, { s: a.s, m: am }, ev as Record<string, unknown> | undefined, av as Record<string, unknown> | undefined, p, errs, ignoreUnknown);
    return;
  }
  if (ev === undefined || av === undefined) {
    if (ev !== av) errs.push(`${p}: expected ${show(ev)}, got ${show(av)}`);
    return;
  }
  if (ef.type === 'bytes') {
    if (!isBytes(av) || !bytesEqual(ev as Uint8Array, av)) errs.push(`${p}: expected ${show(ev)}, got ${show(av)}`);
    return;
  }
  const want = ef.type === 'float' ? Math.fround(ev as number) : ev;
  if (want !== av) errs.push(`${p}: expected ${show(want)}, got ${show(av)}`);
}

/** sameShape says whether message name (and every message it reaches) is the same in both schemas. */
export function sameShape(x: Schema, y: Schema, name: string, seen = new Set<string>()): boolean {
  if (seen.has(name)) return true;
  seen.add(name);
  const a = x.messages.get(name);
  const b = y.messages.get(name);
  if (!a || !b || a.fields.length !== b.fields.length) return false;
  for (const f of a.fields) {
    const g = b.fields.find((z) => z.number === f.number);
    if (!g || g.name !== f.name || sameType(f, g) || g.oneof !== f.oneof) return false;
    const nested = f.map ? f.map.value : f;
    if (nested.kind === 'message' && !sameShape(x, y, nested.typeName!, seen)) return false;
    if (nested.kind === 'enum' && show(x.enums.get(nested.typeName!)?.values) !== show(y.enums.get(nested.typeName!)?.values)) return false;
  }
  return true;
}
