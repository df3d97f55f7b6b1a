/**
 * The checks of one message between a writer build and a reader build (both directions are
 * run by checkSchemas in run.ts):
 *
 * - cross: a populated instance built from the writer's descriptor is encoded by the writer's
 *   ts-proto code, decoded by the reader's, compared on the fields both know (fields only the
 *   writer knows must land in the reader's `_unknownFields`, fields only the reader knows must
 *   be default), re-encoded by the reader and decoded by the writer again: every field survives
 *   the reader's read-modify-write. The same bytes are also read through the reader's
 *   descriptor (protobufjs), and bytes written through the writer's descriptor are read by the
 *   reader's code, so generated code that disagrees with its descriptor fails.
 * - unknown fields: fields 9999 (twice), 9998, 9997, 9996 are appended and an unknown field
 *   9995 is placed inside every nested message; the reader decodes, re-encodes, and every
 *   unknown field is still there at its level, with the known fields intact.
 * - unknown enum values: every enum field (singular, repeated, map value, oneof member) set to
 *   999; the reader must surface it as the number or UNRECOGNIZED (recorded with whether its
 *   re-encoding keeps 999 and what toJSON prints) without throwing.
 * - schema: a field of the older build that N lacks must be reserved in N; a field number
 *   keeps its name, type and oneof.
 */
import { bytesEqual, compareMessage, getField, sameShape, show } from './compare';
import { enumValue, populate, shortName, unpopulated, variantLabel, variantsOf, NESTED_UNKNOWN_FIELD, type Marker } from './populate';
import { referenceDecode, referenceEncode } from './reference';
import { isReserved, sameType, type Codec, type FieldInfo, type MessageInfo, type Schema } from './schema';
import { isNestedMarker, keptInsideUnknown, scanUnknown, unknownTail } from './unknown-fields';
import { UNKNOWN_ENUM_VALUE, type WireEnumResult, type WireMessageResult } from './types';

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

/** crossCheck: writer encodes, reader decodes and re-encodes, writer decodes again; plus both reference paths. */
export function crossCheck(w: Schema, r: Schema, name: string, res: WireMessageResult): void {
  const wm = w.messages.get(name)!;
  const rm = r.messages.get(name)!;
  const wc = codecOf(w, wm);
  const rc = codecOf(r, rm);
  const same = sameShape(w, r, name);
  const ws = { s: w, m: wm };
  const rs = { s: r, m: rm };
  for (let v = 0; v < variantsOf(wm); v++) {
    const errs: string[] = [];
    const label = `${w.build.label}->${r.build.label}${variantLabel(wm, v)}`;
    res.checks++;
    const exp = attempt('populate', errs, () => populate(w, wm, v));
    if (exp) errs.push(...unpopulated(w, wm, exp, shortName(wm)));
    const bytes1 = exp && attempt(`encode by ${w.build.label}`, errs, () => wc.encode(exp).finish());
    const act = bytes1 && attempt(`decode by ${r.build.label}`, errs, () => rc.decode(bytes1));
    if (exp && act) compareMessage(ws, rs, exp, act, shortName(wm), errs);
    const bytes2 = act && attempt(`re-encode by ${r.build.label}`, errs, () => rc.encode(act).finish());
    const back = bytes2 && attempt(`decode of ${r.build.label}'s re-encoding by ${w.build.label}`, errs, () => wc.decode(bytes2));
    if (exp && back) {
      const e2: string[] = [];
      compareMessage(ws, ws, exp, back, shortName(wm), e2);
      errs.push(...e2.map((x) => `after ${r.build.label} re-encoded: ${x}`));
    }
    // the writer's ts-proto bytes read through the reader's descriptor
    const ref = bytes1 && attempt(`decode by ${r.build.label}'s descriptor (protobufjs)`, errs, () => referenceDecode(r, rm, bytes1));
    if (exp && ref) {
      const e3: string[] = [];
      compareMessage(ws, rs, exp, ref, shortName(wm), e3, true);
      errs.push(...e3.map((x) => `read by ${r.build.label}'s descriptor: ${x}`));
    }
    // bytes written through the writer's descriptor read by the reader's ts-proto code
    const refBytes = exp && attempt(`encode by ${w.build.label}'s descriptor (protobufjs)`, errs, () => referenceEncode(w, wm, exp));
    const act2 = refBytes && attempt(`decode of ${w.build.label}'s descriptor encoding by ${r.build.label}`, errs, () => rc.decode(refBytes));
    if (exp && act2) {
      const e4: string[] = [];
      compareMessage(ws, rs, exp, act2, shortName(wm), e4);
      errs.push(...e4.map((x) => `written by ${w.build.label}'s descriptor: ${x}`));
    }
    if (bytes1 && bytes2 && same && !bytesEqual(bytes1, bytes2) && errs.length === 0) {
      res.notes.push(`${label}: re-encoded bytes differ from the original (${bytes1.length} vs ${bytes2.length} bytes) though the fields are equal`);
    }
    res.failures.push(...errs.map((x) => `${label}: ${x}`));
  }
}

/**
 * unknownCheck: w encodes a populated instance with an unknown field inside every nested
 * message, unknown fields are appended, r decodes and re-encodes: every unknown field is still
 * there at its level (read back with the reader's descriptor) and the known fields are intact.
 */
export function unknownCheck(w: Schema, r: Schema, name: string, res: WireMessageResult): void {
  const wm = w.messages.get(name)!;
  const rm = r.messages.get(name)!;
  const errs: string[] = [];
  const label = `unknown fields ${w.build.label}->${r.build.label}`;
  res.checks++;
  const markers: Marker[] = [];
  const exp = attempt('populate', errs, () => populate(w, wm, 0, markers));
  const base = exp && attempt(`encode by ${w.build.label}`, errs, () => codecOf(w, wm).encode(exp).finish());
  const tail = unknownTail();
  if (base) {
    const input = Buffer.concat([base, ...tail.map((t) => t.bytes)]);
    const dec = attempt(`decode by ${r.build.label}`, errs, () => codecOf(r, rm).decode(input));
    if (dec) {
      const u = (dec._unknownFields ?? {}) as Record<string, unknown>;
      const nums = new Set(Object.keys(u).map((k) => Number(k) >>> 3));
      for (const t of tail) if (!nums.has(t.field)) errs.push(`decoded message has no unknown field ${t.field}`);
      const out = attempt(`re-encode by ${r.build.label}`, errs, () => codecOf(r, rm).encode(dec).finish());
      const found = out && attempt(`scan of ${r.build.label}'s re-encoding`, errs, () => scanUnknown(r, rm, out));
      if (out && found) {
        const top = found.filter((x) => x.depth === 0);
        for (const t of tail) {
          const want = tail.filter((x) => bytesEqual(x.bytes, t.bytes)).length;
          if (top.filter((x) => bytesEqual(x.raw, t.bytes)).length < want) errs.push(`unknown field ${t.what} (${Buffer.from(t.bytes).toString('hex')}) lost on re-encode`);
        }
        for (const mk of markers)
          if (!found.some((x) => isNestedMarker(x, mk.payload)) && !keptInsideUnknown(found, mk.payload)) errs.push(`unknown field ${NESTED_UNKNOWN_FIELD} inside ${mk.path} lost on re-encode`);
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

/** enumCheck: every enum field of name set to 999 by w, decoded by r; one WireEnumResult per field. */
export function enumCheck(w: Schema, r: Schema, name: string, res: WireMessageResult, out: WireEnumResult[]): void {
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
    const variant = f.oneof ? wm.oneofs.get(f.oneof)!.findIndex((x) => x.number === f.number) : 0;
    const obj = attempt('populate', errs, () => populate(w, wm, variant));
    if (!obj) {
      res.failures.push(...errs.map((x) => `${label}: ${x}`));
      continue;
    }
    const known = enumValue(w, enumType, 0);
    const keys = f.map ? Object.keys(obj[f.prop] as object) : [];
    if (f.map) obj[f.prop] = { [keys[0] ?? 'k0']: UNKNOWN_ENUM_VALUE, [keys[1] ?? 'k1']: known };
    else if (f.repeated) obj[f.prop] = [UNKNOWN_ENUM_VALUE, known];
    else if (f.oneof) obj[f.prop] = { $case: f.oneofCase, value: UNKNOWN_ENUM_VALUE };
    else obj[f.prop] = UNKNOWN_ENUM_VALUE;
    const firstKey = Object.keys(obj[f.prop] as object)[0]!;
    const pick = (m: Record<string, unknown>, fi: FieldInfo): unknown => {
      const v = getField(m, fi);
      if (fi.map) return (v as Record<string, unknown> | undefined)?.[firstKey];
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
      errs.push(...rest.filter((x) => !x.startsWith(`${shortName(wm)}.${f.name}`)));
      const out2 = attempt(`re-encode by ${r.build.label}`, errs, () => rc.encode(dec).finish());
      const back = out2 && attempt(`decode of the re-encoding by ${w.build.label}`, errs, () => wc.decode(out2));
      r1.preservedOnReencode = !!back && pick(back, f) === UNKNOWN_ENUM_VALUE;
      if (rc.toJSON) {
        try {
          const j = rc.toJSON(dec) as Record<string, unknown>;
          r1.json = show(f.oneofCase ? (j[f.oneofCase] ?? (j[f.prop] as Record<string, unknown> | undefined)?.[f.oneofCase]) : j[f.prop]);
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

/** schemaCheck: what the older build has, N keeps or reserves; a number keeps its name, type and oneof. */
export function schemaCheck(old: Schema, n: Schema, name: string, res: WireMessageResult): void {
  const om = old.messages.get(name)!;
  const nm = n.messages.get(name)!;
  const at = `schema ${old.build.label}->${n.build.label}`;
  for (const f of om.fields) {
    const g = nm.fields.find((x) => x.number === f.number);
    if (!g) {
      const r = isReserved(nm, f.number, f.name);
      if (!r.number || !r.name) res.failures.push(`${at}: field ${f.name} = ${f.number} removed without reserving its ${[!r.number && 'number', !r.name && 'name'].filter(Boolean).join(' and ')}`);
      continue;
    }
    if (g.name !== f.name) res.failures.push(`${at}: field ${f.number} renamed ${f.name} -> ${g.name}`);
    const t = sameType(f, g);
    if (t) res.failures.push(`${at}: field ${f.name} = ${f.number} changed type ${t}`);
    if ((f.oneof ?? '') !== (g.oneof ?? '')) res.failures.push(`${at}: field ${f.name} moved from oneof ${f.oneof ?? '-'} to ${g.oneof ?? '-'}`);
  }
}

/** enumSchemaProblems: an enum or enum value of old that n lacks must be reserved; a number keeps its name. */
export function enumSchemaProblems(old: Schema, n: Schema): string[] {
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
