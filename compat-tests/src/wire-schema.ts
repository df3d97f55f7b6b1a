/**
 * The contracts of one build as the wire tests see them: every message and enum from the
 * build's buf-built descriptor set (`shared/descriptor/sandnode.binpb`), each message paired
 * with the ts-proto codec (`encode/decode/fromPartial`) exported by the build's generated code
 * (`shared/dist/gen/sandnode/<pkg>/v1/<file>.js`).
 *
 * The raw descriptor protos are used (not the reflection registry) so that map entry
 * messages, which ts-proto exports as `<Message>_<Field>Entry`, are enumerated like any other.
 */
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fromBinary, isFieldSet } from '@bufbuild/protobuf';
import {
  FieldDescriptorProtoSchema,
  FieldDescriptorProto_Label,
  FieldDescriptorProto_Type,
  FileDescriptorSetSchema,
  type DescriptorProto,
  type EnumDescriptorProto,
} from '@bufbuild/protobuf/wkt';
import type { Build } from './releases';

/** The ts-proto codec of one message. */
export interface Codec {
  encode(message: unknown, writer?: unknown): { finish(): Uint8Array };
  decode(input: Uint8Array, length?: number): Record<string, unknown>;
  fromPartial(object: unknown): Record<string, unknown>;
  toJSON?(message: unknown): unknown;
  fromJSON?(object: unknown): Record<string, unknown>;
}

export type Kind = 'scalar' | 'enum' | 'message';

/** FieldInfo is one field of a message, with the names ts-proto gives it. */
export interface FieldInfo {
  name: string;
  number: number;
  /** ts-proto property: the field's camelCase name, or the oneof's for a oneof member */
  prop: string;
  /** for a oneof member: the `$case` value (the field's camelCase name) */
  oneofCase?: string;
  /** the oneof's proto name, for a (non-synthetic) oneof member */
  oneof?: string;
  kind: Kind;
  /** FieldDescriptorProto_Type */
  type: number;
  /** full name without the leading dot, for enum and message fields */
  typeName?: string;
  repeated: boolean;
  /** proto3 `optional` */
  optional: boolean;
  /** for a map field: its key and value (fields 1 and 2 of the entry message) */
  map?: { key: FieldInfo; value: FieldInfo };
}

export interface MessageInfo {
  fullName: string;
  /** proto file, e.g. "sandnode/server/v1/record.proto" */
  file: string;
  /** ts-proto export name, e.g. "RuntimeRecord_MetadataEntry" */
  exportName: string;
  isMapEntry: boolean;
  fields: FieldInfo[];
  /** non-synthetic oneofs: proto name -> members */
  oneofs: Map<string, FieldInfo[]>;
  reservedNames: string[];
  reservedRanges: Array<[number, number]>;
}

export interface EnumInfo {
  fullName: string;
  values: Array<{ name: string; number: number }>;
  reservedNames: string[];
  reservedRanges: Array<[number, number]>;
}

/** Schema is one build's contracts and codecs. */
export interface Schema {
  build: Build;
  messages: Map<string, MessageInfo>;
  enums: Map<string, EnumInfo>;
  /** full name -> codec, for every message whose export was found */
  codecs: Map<string, Codec>;
  /** inconsistencies between the descriptor set and the generated code */
  problems: string[];
}

/** tsName is ts-proto's property name for a proto field or oneof name (snakeToCamel=keys). */
export function tsName(protoName: string): string {
  if (!protoName.includes('_')) return protoName;
  const s = /[a-z]/.test(protoName) && /[A-Z]/.test(protoName) ? protoName : protoName.toLowerCase();
  return s.replace(/_([a-z0-9])/g, (_m, c: string) => c.toUpperCase());
}

export function descriptorPath(b: Build): string {
  return path.join(b.dir, 'shared', 'descriptor', 'sandnode.binpb');
}

export function genDir(b: Build): string {
  return path.join(b.dir, 'shared', 'dist', 'gen');
}

/** missingParts names what a build lacks for the wire tests, or returns undefined. */
export function missingParts(b: Build): string | undefined {
  if (!existsSync(descriptorPath(b))) return `build ${b.label} lacks ${descriptorPath(b)}`;
  if (!existsSync(genDir(b))) return `build ${b.label} lacks ${genDir(b)}`;
  return undefined;
}

const T = FieldDescriptorProto_Type;

/** loadSchema reads a build's descriptor set and requires its generated modules. */
export function loadSchema(b: Build): Schema {
  const fds = fromBinary(FileDescriptorSetSchema, readFileSync(descriptorPath(b)));
  const messages = new Map<string, MessageInfo>();
  const enums = new Map<string, EnumInfo>();
  const rawMessages = new Map<string, { d: DescriptorProto; file: string; exportName: string }>();
  const problems: string[] = [];
  const ranges = (rs: Array<{ start: number; end: number }>, exclusiveEnd: boolean): Array<[number, number]> =>
    rs.map((r) => [r.start, exclusiveEnd ? r.end - 1 : r.end]);
  const addEnum = (e: EnumDescriptorProto, fullName: string) => {
    enums.set(fullName, {
      fullName,
      values: e.value.map((v) => ({ name: v.name, number: v.number })),
      reservedNames: [...e.reservedName],
      reservedRanges: ranges(e.reservedRange, false),
    });
  };
  const walk = (d: DescriptorProto, prefix: string, exportPrefix: string, file: string) => {
    const fullName = `${prefix}.${d.name}`;
    const exportName = exportPrefix ? `${exportPrefix}_${d.name}` : d.name;
    rawMessages.set(fullName, { d, file, exportName });
    for (const n of d.nestedType) walk(n, fullName, exportName, file);
    for (const e of d.enumType) addEnum(e, `${fullName}.${e.name}`);
  };
  for (const f of fds.file) {
    if (!f.package.startsWith('sandnode.')) continue;
    for (const m of f.messageType) walk(m, f.package, '', f.name);
    for (const e of f.enumType) addEnum(e, `${f.package}.${e.name}`);
  }
  const strip = (n: string) => n.replace(/^\./, '');
  const field = (fd: DescriptorProto['field'][number], d: DescriptorProto): FieldInfo => {
    const kind: Kind = fd.type === T.MESSAGE || fd.type === T.GROUP ? 'message' : fd.type === T.ENUM ? 'enum' : 'scalar';
    const f: FieldInfo = {
      name: fd.name,
      number: fd.number,
      prop: tsName(fd.name),
      kind,
      type: fd.type,
      typeName: fd.typeName ? strip(fd.typeName) : undefined,
      repeated: fd.label === FieldDescriptorProto_Label.REPEATED,
      optional: fd.proto3Optional,
    };
    if (!fd.proto3Optional && isFieldSet(fd, FieldDescriptorProtoSchema.field.oneofIndex)) {
      const o = d.oneofDecl[fd.oneofIndex];
      if (o) {
        f.oneof = o.name;
        f.oneofCase = f.prop;
        f.prop = tsName(o.name);
      }
    }
    return f;
  };
  for (const [fullName, { d, file, exportName }] of rawMessages) {
    const fields: FieldInfo[] = [];
    const oneofs = new Map<string, FieldInfo[]>();
    for (const fd of d.field) {
      const f = field(fd, d);
      if (f.kind === 'message' && f.repeated && f.typeName) {
        const entry = rawMessages.get(f.typeName);
        if (entry?.d.options?.mapEntry) {
          const k = entry.d.field.find((x) => x.number === 1);
          const v = entry.d.field.find((x) => x.number === 2);
          if (k && v) f.map = { key: field(k, entry.d), value: field(v, entry.d) };
        }
      }
      if (f.oneof) oneofs.set(f.oneof, [...(oneofs.get(f.oneof) ?? []), f]);
      fields.push(f);
    }
    messages.set(fullName, {
      fullName,
      file,
      exportName,
      isMapEntry: d.options?.mapEntry === true,
      fields,
      oneofs,
      reservedNames: [...d.reservedName],
      reservedRanges: ranges(d.reservedRange, true),
    });
  }

  // The generated modules: every export with encode/decode/fromPartial is a message.
  const codecs = new Map<string, Codec>();
  const files = new Set([...messages.values()].map((m) => m.file));
  const exported = new Map<string, Set<string>>();
  for (const file of files) {
    const js = path.join(genDir(b), file.replace(/\.proto$/, '.js'));
    if (!existsSync(js)) {
      problems.push(`${file}: generated module ${js} missing`);
      continue;
    }
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    const mod = require(js) as Record<string, unknown>;
    const names = new Set<string>();
    for (const [k, v] of Object.entries(mod)) {
      const c = v as Partial<Codec> | null;
      if (c && typeof c === 'object' && typeof c.encode === 'function' && typeof c.decode === 'function' && typeof c.fromPartial === 'function') names.add(k);
    }
    exported.set(file, names);
  }
  for (const m of messages.values()) {
    const names = exported.get(m.file);
    if (!names) continue;
    if (!names.has(m.exportName)) {
      problems.push(`${m.fullName}: in the descriptor set but ${m.file.replace(/\.proto$/, '.js')} exports no ${m.exportName}`);
      continue;
    }
    names.delete(m.exportName);
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    const codec = (require(path.join(genDir(b), m.file.replace(/\.proto$/, '.js'))) as Record<string, Codec>)[m.exportName]!;
    codecs.set(m.fullName, codec);
    // The generated base object must have exactly the properties the descriptor implies.
    const base = codec.fromPartial({});
    const want = new Set(m.fields.map((f) => f.prop));
    const have = new Set(Object.keys(base).filter((k) => k !== '_unknownFields'));
    const missing = [...want].filter((p) => !have.has(p));
    const extra = [...have].filter((p) => !want.has(p));
    if (missing.length || extra.length) {
      problems.push(
        `${m.fullName}: generated code and descriptor disagree (descriptor-only: ${missing.join(', ') || '-'}; generated-only: ${extra.join(', ') || '-'})`,
      );
    }
  }
  for (const [file, names] of exported) {
    for (const n of names) problems.push(`${file}: generated code exports message ${n}, which is not in the descriptor set`);
  }
  return { build: b, messages, enums, codecs, problems };
}

/** isReserved says whether a message or enum reserves a number or a name. */
export function isReserved(x: { reservedNames: string[]; reservedRanges: Array<[number, number]> }, number: number, name: string): { number: boolean; name: boolean } {
  return { number: x.reservedRanges.some(([a, z]) => number >= a && number <= z), name: x.reservedNames.includes(name) };
}

/** sameType says whether two versions of a field have the same wire shape and type. */
export function sameType(a: FieldInfo, b: FieldInfo): string | undefined {
  const show = (f: FieldInfo) => `${f.repeated ? (f.map ? 'map ' : 'repeated ') : ''}${f.typeName ?? FieldDescriptorProto_Type[f.type]}`;
  if (a.type !== b.type || a.repeated !== b.repeated || a.typeName !== b.typeName || !!a.map !== !!b.map) return `${show(a)} -> ${show(b)}`;
  if (a.map && b.map) return sameType(a.map.key, b.map.key) ?? sameType(a.map.value, b.map.value);
  return undefined;
}

export { FieldDescriptorProto_Type as ProtoType };
