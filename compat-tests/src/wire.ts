/**
 * Wire compatibility of the contracts between builds (N-1 <-> N, and N-2 <-> N with --skip),
 * checked on the generated ts-proto code of each build, message by message:
 *
 * - cross: a fully populated instance (every field non-default, nested messages populated,
 *   repeated fields with 2 items, maps with 2 entries, each oneof case in turn) built from the
 *   writer's descriptor is encoded by the writer's code, decoded by the reader's, compared on the
 *   fields both know (fields only the writer knows must land in the reader's `_unknownFields`,
 *   fields only the reader knows must be default), re-encoded by the reader and decoded by the
 *   writer again: every field the writer set survives the reader's read-modify-write.
 * - unknown fields: unknown fields (9999 varint twice, 9998 length-delimited, 9997 fixed32,
 *   9996 fixed64) are appended to the bytes, and an unknown length-delimited field 9995 is
 *   placed inside every nested message; each build decodes (no throw), re-encodes, and every
 *   unknown byte is still there, with the known fields intact.
 * - unknown enum values: every enum field (singular, repeated, map value, oneof member) is
 *   encoded as 999; each build decodes it without throwing and surfaces it as the number (kept)
 *   or UNRECOGNIZED (recorded), re-encodes it (preserved or not, recorded), and `toJSON` does not
 *   throw (what it prints is recorded).
 * - schema: a message, field or enum value of the older build that N lacks must be reserved in
 *   N; a field number keeps its name and type.
 *
 * Messages that exist only in N are "new in N" and run the checks against N alone.
 */
import type { Build, ReportSection, RunContext } from './types';
import {
  isReserved,
  loadSchema,
  missingParts,
  ProtoType as T,
  sameType,
  type Codec,
  type FieldInfo,
  type MessageInfo,
  type Schema,
} from './wire-schema';

/** The value encoded for an enum field that no build defines. */
export const UNKNOWN_ENUM_VALUE = 999;

export type EnumOutcome = 'number' | 'UNRECOGNIZED' | 'threw' | 'other';

/** One enum field decoded with an out-of-range value by one reader. */
export interface WireEnumResult {
  message: string;
  field: string;
  enumType: string;
  /** singular, repeated, map value, oneof */
  shape: string;
  writer: string;
  reader: string;
  outcome: EnumOutcome;
  /** what decode returned (e.g. "999", "-1"), or the exception */
  value: string;
  /** the reader's re-encoding still carries 999 */
  preservedOnReencode: boolean;
  /** what the reader's toJSON prints for the field ("threw: ..." if it threw) */
  json: string;
}

/** The result of one message over every pair of builds. */
export interface WireMessageResult {
  message: string;
  file: string;
  mapEntry: boolean;
  /** "both" (in N and every older build), "new in N", "removed in N", or "partial" (missing in some older builds) */
  scope: 'both' | 'new in N' | 'removed in N' | 'partial';
  result: 'pass' | 'fail';
  /** number of individual round trips / decodes performed */
  checks: number;
  failures: string[];
  notes: string[];
}

export interface WireCompatResult {
  /** build labels, oldest first; the last is N */
  builds: string[];
  messages: WireMessageResult[];
  enums: WireEnumResult[];
  /** problems that are not one message's: descriptor/generated-code disagreements, enum schema changes */
  problems: string[];
  ms: number;
}

// ---------------------------------------------------------------------------------------------
// bytes

const utf8 = new TextEncoder();

function varint(n: number | bigint): number[] {
  let v = BigInt.asUintN(64, BigInt(n));
  const out: number[] = [];
  while (v >= 0x80n) {
    out.push(Number(v & 0x7fn) | 0x80);
    v >>= 7n;
  }
  out.push(Number(v));
  return out;
}

function tag(field: number, wireType: number): number {
  return field * 8 + wireType;
}

function concat(parts: Array<Uint8Array | number[]>): Uint8Array {
  const len = parts.reduce((a, p) => a + p.length, 0);
  const out = new Uint8Array(len);
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  return out;
}

function indexOf(hay: Uint8Array, needle: Uint8Array, from = 0): number {
  outer: for (let i = from; i + needle.length <= hay.length; i++) {
    for (let j = 0; j < needle.length; j++) if (hay[i + j] !== needle[j]) continue outer;
    return i;
  }
  return -1;
}

function occurrences(hay: Uint8Array, needle: Uint8Array): number {
  let n = 0;
  for (let i = indexOf(hay, needle); i >= 0; i = indexOf(hay, needle, i + needle.length)) n++;
  return n;
}

function bytesEqual(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

function isBytes(v: unknown): v is Uint8Array {
  return v instanceof Uint8Array || Buffer.isBuffer(v) || (typeof v === 'object' && v !== null && ArrayBuffer.isView(v));
}

/** The unknown fields appended to every message's bytes: [field, wire type, bytes incl. tag]. */
function unknownTail(): Array<{ what: string; field: number; bytes: Uint8Array }> {
  const ld = utf8.encode('sandnode-unknown-length-delimited');
  return [
    { what: '9999 varint', field: 9999, bytes: Uint8Array.from([...varint(tag(9999, 0)), ...varint(987654321012)]) },
    { what: '9998 length-delimited', field: 9998, bytes: Uint8Array.from([...varint(tag(9998, 2)), ...varint(ld.length), ...ld]) },
    { what: '9997 fixed32', field: 9997, bytes: Uint8Array.from([...varint(tag(9997, 5)), 0xde, 0xad, 0xbe, 0xef]) },
    { what: '9996 fixed64', field: 9996, bytes: Uint8Array.from([...varint(tag(9996, 1)), 1, 2, 3, 4, 5, 6, 7, 8]) },
    { what: '9999 varint (second occurrence)', field: 9999, bytes: Uint8Array.from([...varint(tag(9999, 0)), ...varint(-5)]) },
  ];
}

/** Field number of the unknown field placed inside nested messages. */
const NESTED_UNKNOWN_FIELD = 9995;

// ---------------------------------------------------------------------------------------------
// values

interface GenCtx {
  s: Schema;
  variant: number;
  /** when set, every nested message gets an unknown field whose payload is recorded here */
  markers?: Array<{ path: string; payload: Uint8Array }>;
  stack: string[];
}

const MAX_DEPTH = 6;

function scalarValue(f: FieldInfo, type: number, salt: number, path: string): unknown {
  const n = f.number;
  switch (type) {
    case T.DOUBLE:
      return 1.25 + n + salt;
    case T.FLOAT:
      return 0.5 + n + salt;
    case T.INT32:
    case T.SINT32:
    case T.SFIXED32:
      return -(100000 + n * 10 + salt);
    case T.UINT32:
    case T.FIXED32:
      return 3000000000 + n * 10 + salt;
    case T.INT64:
    case T.SINT64:
    case T.SFIXED64:
      return -(2 ** 40 + n * 10 + salt);
    case T.UINT64:
    case T.FIXED64:
      return 2 ** 50 + n * 10 + salt;
    case T.BOOL:
      return salt % 2 === 0;
    case T.STRING:
      return `${path}#${salt} é✓`;
    case T.BYTES:
      return Buffer.from([n & 0xff, 0x00, 0xff, 0x80, salt & 0xff]);
    default:
      throw new Error(`${path}: unsupported scalar type ${type}`);
  }
}

function enumValue(s: Schema, typeName: string, salt: number): number {
  const e = s.enums.get(typeName);
  if (!e) throw new Error(`enum ${typeName} not in the descriptor set of ${s.build.label}`);
  const nonZero = e.values.filter((v) => v.number !== 0);
  if (nonZero.length === 0) return 0;
  return nonZero[(nonZero.length - 1 - (salt % nonZero.length) + nonZero.length) % nonZero.length]!.number;
}

/** singleValue is a value of one element of f (not the list/map around it). */
function singleValue(c: GenCtx, f: FieldInfo, salt: number, path: string): unknown {
  if (f.kind === 'scalar') return scalarValue(f, f.type, salt, path);
  if (f.kind === 'enum') return enumValue(c.s, f.typeName!, salt);
  const m = c.s.messages.get(f.typeName!);
  if (!m) throw new Error(`${path}: message ${f.typeName} not in the descriptor set of ${c.s.build.label}`);
  if (c.stack.includes(m.fullName) || c.stack.length >= MAX_DEPTH) return undefined;
  return populateMsg(c, m, `${path}`);
}

function fieldValue(c: GenCtx, f: FieldInfo, path: string): unknown {
  const p = `${path}.${f.name}`;
  if (f.map) {
    const out: Record<string, unknown> = {};
    for (const i of [0, 1]) {
      const k = f.map.key.kind === 'scalar' && f.map.key.type === T.STRING ? `k${i}-${f.name}` : scalarValue(f.map.key, f.map.key.type, i, p);
      const v = singleValue(c, f.map.value, i, `${p}[${String(k)}]`);
      if (v !== undefined) out[String(k)] = v;
    }
    return out;
  }
  if (f.repeated) return [0, 1].map((i) => singleValue(c, f, i, `${p}[${i}]`)).filter((v) => v !== undefined);
  return singleValue(c, f, 0, p);
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
    obj._unknownFields = { [tag(NESTED_UNKNOWN_FIELD, 2)]: [Uint8Array.from([...varint(payload.length), ...payload])] };
  } else {
    obj._unknownFields = {};
  }
  return obj;
}

/** populate builds a fully populated instance of m in the shape of s's generated code. */
export function populate(s: Schema, m: MessageInfo, variant = 0, markers?: GenCtx['markers']): Record<string, unknown> {
  return populateMsg({ s, variant, markers, stack: [] }, m, shortName(m));
}

function shortName(m: MessageInfo): string {
  return m.fullName.split('.').pop()!;
}

function variantsOf(m: MessageInfo): number {
  return Math.max(1, ...[...m.oneofs.values()].map((x) => x.length));
}

function variantLabel(m: MessageInfo, v: number): string {
  if (m.oneofs.size === 0) return '';
  return ` [${[...m.oneofs].map(([o, members]) => `${o}=${members[v % members.length]!.name}`).join(', ')}]`;
}

// ---------------------------------------------------------------------------------------------
// comparison

function getField(obj: Record<string, unknown> | undefined, f: FieldInfo): unknown {
  if (!obj) return undefined;
  const v = obj[f.prop];
  if (f.oneofCase) {
    const o = v as { $case?: string; value?: unknown } | undefined;
    return o && o.$case === f.oneofCase ? o.value : undefined;
  }
  return v;
}

function isDefault(f: FieldInfo, v: unknown): boolean {
  if (v === undefined || v === null) return true;
  if (f.oneofCase) return false;
  if (f.map) return Object.keys(v as object).length === 0;
  if (f.repeated) return (v as unknown[]).length === 0;
  if (isBytes(v)) return v.length === 0;
  return v === 0 || v === '' || v === false;
}

function show(v: unknown): string {
  if (isBytes(v)) return `bytes[${Buffer.from(v).toString('hex')}]`;
  let s: string;
  try {
    s = JSON.stringify(v, (_k, x: unknown) => (isBytes(x) ? `bytes[${Buffer.from(x).toString('hex')}]` : x)) ?? String(v);
  } catch {
    s = String(v);
  }
  return s.length > 120 ? `${s.slice(0, 117)}...` : s;
}

interface Side {
  s: Schema;
  m: MessageInfo;
}

function unknownNumbers(obj: Record<string, unknown>): Set<number> {
  const u = (obj._unknownFields ?? {}) as Record<string, unknown>;
  return new Set(Object.keys(u).map((k) => Number(k) >>> 3));
}

/**
 * compareMessage compares exp (built for e) with act (decoded by a) on the fields both know;
 * fields only e knows must be in act's unknown fields, fields only a knows must be default.
 */
function compareMessage(e: Side, a: Side, exp: Record<string, unknown> | undefined, act: Record<string, unknown> | undefined, path: string, errs: string[]): void {
  if (exp === undefined || act === undefined) {
    if (exp !== act) errs.push(`${path}: expected ${exp === undefined ? 'unset' : 'a message'}, got ${act === undefined ? 'unset' : 'a message'}`);
    return;
  }
  for (const ef of e.m.fields) {
    const af = a.m.fields.find((x) => x.number === ef.number);
    const ev = getField(exp, ef);
    const p = `${path}.${ef.name}`;
    if (!af) {
      if (!isDefault(ef, ev) && !unknownNumbers(act).has(ef.number)) errs.push(`${p} (${ef.number}): known only to ${e.s.build.label}, not kept in ${a.s.build.label}'s unknown fields`);
      continue;
    }
    if (sameType(ef, af)) continue; // reported by the schema check
    compareValue(e, a, ef, af, ev, getField(act, af), p, errs);
  }
  for (const af of a.m.fields) {
    if (e.m.fields.some((x) => x.number === af.number)) continue;
    const av = getField(act, af);
    if (!isDefault(af, av)) errs.push(`${path}.${af.name} (${af.number}): known only to ${a.s.build.label} but decoded as ${show(av)} from ${e.s.build.label}'s bytes`);
  }
}

function compareValue(e: Side, a: Side, ef: FieldInfo, af: FieldInfo, ev: unknown, av: unknown, p: string, errs: string[]): void {
  if (ef.map && af.map) {
    const em = (ev ?? {}) as Record<string, unknown>;
    const am = (av ?? {}) as Record<string, unknown>;
    const ek = Object.keys(em).sort();
    const ak = Object.keys(am).sort();
    if (show(ek) !== show(ak)) {
      errs.push(`${p}: map keys ${show(ek)} became ${show(ak)}`);
      return;
    }
    for (const k of ek) compareSingle(e, a, ef.map.value, af.map.value, em[k], am[k], `${p}[${k}]`, errs);
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
    el.forEach((x, i) => compareSingle(e, a, ef, af, x, al[i], `${p}[${i}]`, errs));
    return;
  }
  compareSingle(e, a, ef, af, ev, av, p, errs);
}

function compareSingle(e: Side, a: Side, ef: FieldInfo, af: FieldInfo, ev: unknown, av: unknown, p: string, errs: string[]): void {
  if (ef.kind === 'message') {
    const em = e.s.messages.get(ef.typeName!);
    const am = a.s.messages.get(af.typeName!);
    if (!em || !am) {
      errs.push(`${p}: message type ${ef.typeName} missing from a descriptor set`);
      return;
    }
    compareMessage({ s: e.s, m: em }, { s: a.s, m: am }, ev as Record<string, unknown> | undefined, av as Record<string, unknown> | undefined, p, errs);
    return;
  }
  if (ev === undefined || av === undefined) {
    if (ev !== av) errs.push(`${p}: expected ${show(ev)}, got ${show(av)}`);
    return;
  }
  if (ef.type === T.BYTES) {
    if (!isBytes(av) || !bytesEqual(ev as Uint8Array, av)) errs.push(`${p}: expected ${show(ev)}, got ${show(av)}`);
    return;
  }
  const want = ef.type === T.FLOAT ? Math.fround(ev as number) : ev;
  if (want !== av) errs.push(`${p}: expected ${show(want)}, got ${show(av)}`);
}

/** sameShape says whether m (and every message it reaches) is the same in both schemas. */
function sameShape(x: Schema, y: Schema, name: string, seen = new Set<string>()): boolean {
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

// ---------------------------------------------------------------------------------------------
// checks

/** unpopulated lists fields a populated instance left default (a bug of the test, not of the build). */
function unpopulated(s: Schema, m: MessageInfo, obj: Record<string, unknown>, path: string, stack: string[] = []): string[] {
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

function attempt<R>(what: string, errs: string[], fn: () => R): R | undefined {
  try {
    return fn();
  } catch (err) {
    errs.push(`${what} threw: ${(err as Error).message}`);
    return undefined;
  }
}

function codecOf(s: Schema, m: MessageInfo): Codec {
  const c = s.codecs.get(m.fullName);
  if (!c) throw new Error(`${s.build.label} has no generated codec for ${m.fullName}`);
  return c;
}

/** crossCheck: writer encodes, reader decodes and re-encodes, writer decodes again. */
function crossCheck(w: Schema, r: Schema, name: string, res: WireMessageResult): void {
  const wm = w.messages.get(name)!;
  const rm = r.messages.get(name)!;
  const wc = codecOf(w, wm);
  const rc = codecOf(r, rm);
  const same = sameShape(w, r, name);
  for (let v = 0; v < variantsOf(wm); v++) {
    const errs: string[] = [];
    const label = `${w.build.label}->${r.build.label}${variantLabel(wm, v)}`;
    res.checks++;
    const exp = attempt('populate', errs, () => populate(w, wm, v));
    if (exp) errs.push(...unpopulated(w, wm, exp, shortName(wm)));
    const bytes1 = exp && attempt(`encode by ${w.build.label}`, errs, () => wc.encode(exp).finish());
    const act = bytes1 && attempt(`decode by ${r.build.label}`, errs, () => rc.decode(bytes1));
    if (exp && act) compareMessage({ s: w, m: wm }, { s: r, m: rm }, exp, act, shortName(wm), errs);
    const bytes2 = act && attempt(`re-encode by ${r.build.label}`, errs, () => rc.encode(act).finish());
    const back = bytes2 && attempt(`decode of ${r.build.label}'s re-encoding by ${w.build.label}`, errs, () => wc.decode(bytes2));
    if (exp && back) {
      const e2: string[] = [];
      compareMessage({ s: w, m: wm }, { s: w, m: wm }, exp, back, shortName(wm), e2);
      errs.push(...e2.map((x) => `after ${r.build.label} re-encoded: ${x}`));
    }
    if (bytes1 && bytes2 && same && !bytesEqual(bytes1, bytes2) && errs.length === 0) {
      res.notes.push(`${label}: re-encoded bytes differ from the original (${bytes1.length} vs ${bytes2.length} bytes) though the fields are equal`);
    }
    res.failures.push(...errs.map((x) => `${label}: ${x}`));
  }
}

/**
 * unknownCheck: w encodes a populated instance with an unknown field inside every nested
 * message, unknown fields are appended, r decodes and re-encodes: every unknown byte is still
 * there and the known fields are intact.
 */
function unknownCheck(w: Schema, r: Schema, name: string, res: WireMessageResult): void {
  const wm = w.messages.get(name)!;
  const rm = r.messages.get(name)!;
  const errs: string[] = [];
  const label = `unknown fields ${w.build.label}->${r.build.label}`;
  res.checks++;
  const markers: NonNullable<GenCtx['markers']> = [];
  const exp = attempt('populate', errs, () => populate(w, wm, 0, markers));
  const base = exp && attempt(`encode by ${w.build.label}`, errs, () => codecOf(w, wm).encode(exp).finish());
  const tail = unknownTail();
  if (base) {
    const input = concat([base, ...tail.map((t) => t.bytes)]);
    const dec = attempt(`decode by ${r.build.label}`, errs, () => codecOf(r, rm).decode(input));
    if (dec) {
      const nums = unknownNumbers(dec);
      for (const t of tail) if (!nums.has(t.field)) errs.push(`decoded message has no unknown field ${t.field}`);
      const out = attempt(`re-encode by ${r.build.label}`, errs, () => codecOf(r, rm).encode(dec).finish());
      if (out) {
        for (const t of tail) {
          const want = tail.filter((x) => bytesEqual(x.bytes, t.bytes)).length;
          if (occurrences(out, t.bytes) < want) errs.push(`unknown field ${t.what} (${Buffer.from(t.bytes).toString('hex')}) lost on re-encode`);
        }
        for (const mk of markers) if (indexOf(out, mk.payload) < 0) errs.push(`unknown field ${NESTED_UNKNOWN_FIELD} inside ${mk.path} lost on re-encode`);
        const back = attempt(`decode of the re-encoding by ${w.build.label}`, errs, () => codecOf(w, wm).decode(out));
        if (exp && back) compareMessage({ s: w, m: wm }, { s: w, m: wm }, exp, back, shortName(wm), errs);
      }
    }
  }
  res.failures.push(...errs.map((x) => `${label}: ${x}`));
}

function enumFields(m: MessageInfo): FieldInfo[] {
  return m.fields.filter((f) => f.kind === 'enum' || f.map?.value.kind === 'enum');
}

/** enumCheck: every enum field of name set to 999 by w, decoded by r. */
function enumCheck(w: Schema, r: Schema, name: string, res: WireMessageResult, out: WireEnumResult[]): void {
  const wm = w.messages.get(name)!;
  const rm = r.messages.get(name)!;
  const wc = codecOf(w, wm);
  const rc = codecOf(r, rm);
  for (const f of enumFields(wm)) {
    const rf = rm.fields.find((x) => x.number === f.number);
    if (!rf || sameType(f, rf)) continue; // not a field r knows as this enum: covered by the cross check
    res.checks++;
    const errs: string[] = [];
    const shape = f.map ? 'map value' : f.repeated ? 'repeated' : f.oneof ? 'oneof' : 'singular';
    const enumType = f.map ? f.map.value.typeName! : f.typeName!;
    const label = `unknown enum ${w.build.label}->${r.build.label} ${f.name}=${UNKNOWN_ENUM_VALUE}`;
    let variant = 0;
    if (f.oneof) variant = wm.oneofs.get(f.oneof)!.findIndex((x) => x.number === f.number);
    const obj = attempt('populate', errs, () => populate(w, wm, variant));
    if (!obj) {
      res.failures.push(...errs.map((x) => `${label}: ${x}`));
      continue;
    }
    const known = enumValue(w, enumType, 0);
    if (f.map) obj[f.prop] = { [Object.keys(obj[f.prop] as object)[0] ?? 'k0']: UNKNOWN_ENUM_VALUE, [Object.keys(obj[f.prop] as object)[1] ?? 'k1']: known };
    else if (f.repeated) obj[f.prop] = [UNKNOWN_ENUM_VALUE, known];
    else if (f.oneof) obj[f.prop] = { $case: f.oneofCase, value: UNKNOWN_ENUM_VALUE };
    else obj[f.prop] = UNKNOWN_ENUM_VALUE;
    const pick = (m: Record<string, unknown>, fi: FieldInfo): unknown => {
      const v = getField(m, fi);
      if (fi.map) return (v as Record<string, unknown> | undefined)?.[Object.keys(obj[f.prop] as object)[0]!];
      if (fi.repeated) return (v as unknown[] | undefined)?.[0];
      return v;
    };
    const r1: WireEnumResult = { message: name, field: f.name, enumType, shape, writer: w.build.label, reader: r.build.label, outcome: 'threw', value: '', preservedOnReencode: false, json: '' };
    const bytes = attempt(`encode by ${w.build.label}`, errs, () => wc.encode(obj).finish());
    let dec: Record<string, unknown> | undefined;
    if (bytes) {
      try {
        dec = rc.decode(bytes);
      } catch (err) {
        r1.value = `threw: ${(err as Error).message}`;
        errs.push(`decode by ${r.build.label} threw: ${(err as Error).message}`);
      }
    }
    if (dec) {
      const v = pick(dec, rf);
      r1.value = show(v);
      r1.outcome = v === UNKNOWN_ENUM_VALUE ? 'number' : v === -1 || v === 'UNRECOGNIZED' ? 'UNRECOGNIZED' : 'other';
      if (r1.outcome === 'other') errs.push(`decoded as ${show(v)}, neither the number nor UNRECOGNIZED`);
      // the rest of the message is intact
      const rest: string[] = [];
      compareMessage({ s: w, m: wm }, { s: r, m: rm }, obj, dec, shortName(wm), rest);
      const unrelated = rest.filter((x) => !x.startsWith(`${shortName(wm)}.${f.name}`));
      errs.push(...unrelated);
      const out2 = attempt(`re-encode by ${r.build.label}`, errs, () => rc.encode(dec).finish());
      const back = out2 && attempt(`decode of the re-encoding by ${w.build.label}`, errs, () => wc.decode(out2));
      r1.preservedOnReencode = !!back && pick(back, f) === UNKNOWN_ENUM_VALUE;
      if (rc.toJSON) {
        try {
          const j = rc.toJSON(dec) as Record<string, unknown>;
          r1.json = show(f.oneofCase ? j[f.oneofCase] ?? (j[f.prop] as Record<string, unknown> | undefined)?.[f.oneofCase] : j[f.prop]);
        } catch (err) {
          r1.json = `threw: ${(err as Error).message}`;
          errs.push(`toJSON by ${r.build.label} threw: ${(err as Error).message}`);
        }
      }
    }
    out.push(r1);
    res.failures.push(...errs.map((x) => `${label}: ${x}`));
  }
}

/** schemaCheck: what the older build has, N keeps or reserves; a number keeps its name and type. */
function schemaCheck(old: Schema, n: Schema, name: string, res: WireMessageResult): void {
  const om = old.messages.get(name)!;
  const nm = n.messages.get(name)!;
  for (const f of om.fields) {
    const g = nm.fields.find((x) => x.number === f.number);
    if (!g) {
      const r = isReserved(nm, f.number, f.name);
      if (!r.number || !r.name) res.failures.push(`schema ${old.build.label}->${n.build.label}: field ${f.name} = ${f.number} removed without reserving its ${[!r.number && 'number', !r.name && 'name'].filter(Boolean).join(' and ')}`);
      continue;
    }
    if (g.name !== f.name) res.failures.push(`schema ${old.build.label}->${n.build.label}: field ${f.number} renamed ${f.name} -> ${g.name}`);
    const t = sameType(f, g);
    if (t) res.failures.push(`schema ${old.build.label}->${n.build.label}: field ${f.name} = ${f.number} changed type ${t}`);
    if ((f.oneof ?? '') !== (g.oneof ?? '')) res.failures.push(`schema ${old.build.label}->${n.build.label}: field ${f.name} moved from oneof ${f.oneof ?? '-'} to ${g.oneof ?? '-'}`);
  }
}

function enumSchemaProblems(old: Schema, n: Schema): string[] {
  const out: string[] = [];
  for (const [name, oe] of old.enums) {
    const ne = n.enums.get(name);
    if (!ne) {
      out.push(`enum ${name}: in ${old.build.label}, removed in ${n.build.label}`);
      continue;
    }
    for (const v of oe.values) {
      const nv = ne.values.find((x) => x.number === v.number);
      if (!nv) {
        const r = isReserved(ne, v.number, v.name);
        if (!r.number || !r.name) out.push(`enum ${name}: value ${v.name} = ${v.number} removed in ${n.build.label} without reserving it`);
      } else if (nv.name !== v.name) out.push(`enum ${name}: value ${v.number} renamed ${v.name} -> ${nv.name} in ${n.build.label}`);
    }
  }
  return out;
}

/**
 * checkWire runs every check over builds (oldest first; the last is N), pairing each older
 * build with N. Throws only when a build's descriptor set cannot be read.
 */
export function checkWire(builds: Build[]): WireCompatResult {
  if (builds.length === 0) throw new Error('checkWire: no builds');
  return checkSchemas(builds.map((b) => loadSchema(b)));
}

/** checkSchemas is checkWire on loaded schemas (oldest first; the last is N). */
export function checkSchemas(schemas: Schema[]): WireCompatResult {
  const t0 = Date.now();
  const builds = schemas.map((s) => s.build);
  const n = schemas[schemas.length - 1]!;
  const older = schemas.slice(0, -1);
  const problems: string[] = [];
  for (const s of schemas) problems.push(...s.problems.map((p) => `${s.build.label}: ${p}`));
  for (const o of older) problems.push(...enumSchemaProblems(o, n));

  const names = new Set<string>([...n.messages.keys()]);
  for (const o of older) for (const k of o.messages.keys()) names.add(k);
  const messages: WireMessageResult[] = [];
  const enums: WireEnumResult[] = [];
  for (const name of [...names].sort()) {
    const inN = n.messages.get(name);
    const inOld = older.filter((o) => o.messages.has(name));
    const any = (inN ?? inOld[0]!.messages.get(name))!;
    const res: WireMessageResult = {
      message: name,
      file: any.file,
      mapEntry: any.isMapEntry,
      scope: !inN ? 'removed in N' : inOld.length === older.length && older.length > 0 ? 'both' : inOld.length === 0 ? 'new in N' : 'partial',
      result: 'pass',
      checks: 0,
      failures: [],
      notes: [],
    };
    const usable = (s: Schema) => s.codecs.has(name);
    if (!inN) {
      res.failures.push(`in ${inOld.map((o) => o.build.label).join(', ')} but not in N: a message is never removed`);
    } else if (!usable(n)) {
      res.failures.push(`N has no generated codec for it`);
    } else {
      if (res.scope === 'partial') res.notes.push(`not in ${older.filter((o) => !o.messages.has(name)).map((o) => o.build.label).join(', ')}: checked against N alone there`);
      // N alone: round trip, unknown fields, unknown enums (for every message; the only checks for "new in N").
      crossCheck(n, n, name, res);
      unknownCheck(n, n, name, res);
      enumCheck(n, n, name, res, enums);
      for (const o of inOld) {
        if (!usable(o)) {
          res.failures.push(`${o.build.label} has no generated codec for it`);
          continue;
        }
        schemaCheck(o, n, name, res);
        crossCheck(o, n, name, res);
        crossCheck(n, o, name, res);
        unknownCheck(o, o, name, res);
        unknownCheck(n, o, name, res);
        unknownCheck(o, n, name, res);
        enumCheck(n, o, name, res, enums);
        enumCheck(o, n, name, res, enums);
      }
    }
    res.result = res.failures.length ? 'fail' : 'pass';
    messages.push(res);
  }
  return { builds: builds.map((b) => b.label), messages, enums, problems, ms: Date.now() - t0 };
}

// ---------------------------------------------------------------------------------------------
// report

function esc(s: string): string {
  return s.replace(/\|/g, '\\|').replace(/\n/g, ' ');
}

/** summarize turns a result into a report section. */
export function wireSection(r: WireCompatResult, title = 'Wire compatibility'): ReportSection {
  const msgs = r.messages;
  const failed = msgs.filter((m) => m.result === 'fail');
  const mapEntries = msgs.filter((m) => m.mapEntry).length;
  const newInN = msgs.filter((m) => m.scope === 'new in N');
  const enumFieldsChecked = new Set(r.enums.map((e) => `${e.message}.${e.field}`));
  const enumTypes = new Set(r.enums.map((e) => e.enumType));
  const checks = msgs.reduce((a, m) => a + m.checks, 0);
  const n = r.builds[r.builds.length - 1]!;
  const pairs = r.builds.slice(0, -1).map((b) => `${b} <-> ${n}`);
  const result: ReportSection['result'] = failed.length || r.problems.length ? 'fail' : 'pass';
  const summary =
    `${msgs.length} messages (${mapEntries} map entries) over ${pairs.length ? pairs.join(', ') : `${n} alone`}: ` +
    `${msgs.length - failed.length} pass, ${failed.length} fail, ${newInN.length} new in N; ` +
    `${enumFieldsChecked.size} enum fields (${enumTypes.size} enums) decoded with value ${UNKNOWN_ENUM_VALUE}; ${checks} checks` +
    (r.problems.length ? `; ${r.problems.length} schema/codegen problems` : '');

  // how each reader surfaces an unknown enum value
  const byReader = new Map<string, Map<string, number>>();
  for (const e of r.enums) {
    const k = `decode: ${e.outcome === 'number' ? `kept as the number ${UNKNOWN_ENUM_VALUE}` : e.outcome}; re-encode: ${e.preservedOnReencode ? 'value preserved' : 'value lost'}; toJSON: ${e.json}`;
    const m = byReader.get(e.reader) ?? new Map<string, number>();
    m.set(k, (m.get(k) ?? 0) + 1);
    byReader.set(e.reader, m);
  }
  const md: string[] = [summary, ''];
  md.push('Unknown enum values (every enum field set to 999 by a writer, decoded by each reader):', '');
  md.push('| reader | behaviour | fields |', '|---|---|---|');
  for (const [reader, m] of byReader) for (const [k, c] of m) md.push(`| ${esc(reader)} | ${esc(k)} | ${c} |`);
  md.push('');
  if (newInN.length) md.push(`New in N (checked against N alone): ${newInN.map((m) => `\`${m.message}\` (${m.result})`).join(', ')}`, '');
  else md.push('New in N: none (every message of N is in the older builds).', '');
  if (r.problems.length) {
    md.push('Schema / generated-code problems:', '');
    for (const p of r.problems) md.push(`- ${esc(p)}`);
    md.push('');
  }
  if (failed.length) {
    md.push('| message | scope | failure |', '|---|---|---|');
    for (const m of failed) for (const f of m.failures.slice(0, 10)) md.push(`| \`${m.message}\` | ${m.scope} | ${esc(f)} |`);
    md.push('');
  }
  const notes = msgs.flatMap((m) => m.notes.map((x) => `\`${m.message}\`: ${x}`));
  if (notes.length) {
    md.push('Notes:', '');
    for (const x of notes.slice(0, 30)) md.push(`- ${esc(x)}`);
    md.push('');
  }
  const rows = [
    ...failed.flatMap((m) => m.failures.map((f) => ({ message: m.message, scope: m.scope, result: 'fail', detail: f }))),
    ...newInN.filter((m) => m.result === 'pass').map((m) => ({ message: m.message, scope: m.scope, result: 'pass', detail: 'new in N: checked against N alone' })),
    ...r.problems.map((p) => ({ message: '-', scope: 'schema', result: 'fail', detail: p })),
  ];
  return { title, result, summary, rows, markdown: md.join('\n'), ms: r.ms };
}

/**
 * runWireCompat checks the wire compatibility of every build in ctx.order (oldest first)
 * against the newest (N). Never throws: a build without generated code or descriptor set is
 * skipped (the section is skipped when no pair is left), an unexpected error fails the section.
 */
export async function runWireCompat(ctx: RunContext): Promise<ReportSection> {
  const t0 = Date.now();
  const title = 'Wire compatibility';
  const labels = ctx.order.length ? ctx.order : Object.keys(ctx.builds);
  const builds: Build[] = [];
  const skipped: string[] = [];
  for (const l of labels) {
    const b = ctx.builds[l];
    const miss = b ? missingParts(b) : `no build labelled ${l}`;
    if (miss) skipped.push(miss);
    else builds.push(b!);
  }
  const n = builds[builds.length - 1];
  if (!n || n.label !== labels[labels.length - 1]) {
    return { title, result: 'skipped', summary: `N is not usable: ${skipped.join('; ')}`, ms: Date.now() - t0 };
  }
  try {
    ctx.log(`wire: checking ${builds.map((b) => b.label).join(', ')}`);
    const r = checkWire(builds);
    const section = wireSection(r, title);
    if (skipped.length) {
      section.summary = `${section.summary ?? ''}; skipped: ${skipped.join('; ')}`;
      section.markdown = `Skipped builds: ${skipped.join('; ')}\n\n${section.markdown ?? ''}`;
    }
    ctx.log(`wire: ${section.result}: ${section.summary}`);
    section.ms = Date.now() - t0;
    return section;
  } catch (err) {
    return { title, result: 'fail', summary: `wire tests failed to run: ${(err as Error).message}`, ms: Date.now() - t0 };
  }
}
