/**
 * The contracts of one build as the wire tests see them: its buf-built descriptor set
 * (`descriptorPath(b)`) loaded into a protobufjs reflection Root, and a flat view of every
 * message and enum with the property names ts-proto gives them.
 *
 * Map entry messages (`<Message>.<Field>Entry`, exported by ts-proto as `<Message>_<Field>Entry`)
 * are enumerated like any other message. What protobufjs' descriptor import drops (the proto
 * file a message comes from, which messages are map entries (protobufjs 7 sets `map_entry` on
 * the entry's parent), proto3 `optional`, enum reserved ranges and names) is read from the
 * decoded FileDescriptorSet itself.
 */
import { readFileSync } from 'node:fs';
import * as protobuf from 'protobufjs';
import * as descriptor from 'protobufjs/ext/descriptor';
import type { Build } from '../releases';
import { descriptorPath } from './build-paths';

/** The ts-proto codec of one message (as exported by a build's generated module). */
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
  /** protobufjs scalar type ("int64", "bytes", ...), or "enum" / "message" */
  type: string;
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
  /** inclusive [from, to] */
  reservedRanges: Array<[number, number]>;
  /** the protobufjs reflection type (reference encode/decode) */
  type: protobuf.Type;
}

export interface EnumInfo {
  fullName: string;
  values: Array<{ name: string; number: number }>;
  reservedNames: string[];
  /** inclusive [from, to] */
  reservedRanges: Array<[number, number]>;
}

/** Schema is one build's contracts and (once attached) its ts-proto codecs. */
export interface Schema {
  build: Build;
  root: protobuf.Root;
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

// Shapes of protobufjs' decoded descriptor messages (protobufjs/ext/descriptor types them loosely).
interface RawRange {
  start?: number;
  end?: number;
}
interface RawField {
  name: string;
  number: number;
  proto3Optional?: boolean;
}
interface RawMessage {
  name: string;
  options?: { mapEntry?: boolean };
  field?: RawField[];
  nestedType?: RawMessage[];
  enumType?: RawEnum[];
  reservedRange?: RawRange[];
  reservedName?: string[];
}
interface RawEnum {
  name: string;
  value?: Array<{ name: string; number: number }>;
  reservedRange?: RawRange[];
  reservedName?: string[];
}
interface RawFile {
  name: string;
  package?: string;
  messageType?: RawMessage[];
  enumType?: RawEnum[];
}

const strip = (n: string): string => n.replace(/^\./, '');

/** loadDescriptorSet reads a build's descriptor set; throws naming the file when it is missing or unreadable. */
export function loadDescriptorSet(b: Build): Uint8Array {
  const file = descriptorPath(b);
  try {
    return readFileSync(file);
  } catch (err) {
    throw new Error(`build ${b.label}: cannot read its descriptor set ${file}: ${(err as Error).message}`, { cause: err });
  }
}

/**
 * schemaFromDescriptorSet turns the bytes of a FileDescriptorSet into a Schema for build b
 * (no codecs yet: see attachCodecs). Only packages `sandnode.*` are listed.
 */
export function schemaFromDescriptorSet(b: Build, bytes: Uint8Array): Schema {
  const set = descriptor.FileDescriptorSet.decode(bytes) as unknown as { file: RawFile[] };
  // protobufjs/ext/descriptor adds Root.fromDescriptor at run time; its typings do not declare it
  const root = (protobuf.Root as unknown as { fromDescriptor(set: unknown): protobuf.Root }).fromDescriptor(set);
  const messages = new Map<string, MessageInfo>();
  const enums = new Map<string, EnumInfo>();
  const optionalByMessage = new Map<string, Set<number>>();
  const ranges = (rs: RawRange[] | undefined, exclusiveEnd: boolean): Array<[number, number]> => (rs ?? []).map((r) => [r.start ?? 0, (r.end ?? 0) - (exclusiveEnd ? 1 : 0)]);
  const addEnum = (e: RawEnum, fullName: string) => {
    const reflected = root.lookupEnum(fullName);
    enums.set(fullName, {
      fullName,
      values: Object.entries(reflected.values).map(([name, number]) => ({ name, number: Number(number) })),
      reservedNames: [...(e.reservedName ?? [])],
      reservedRanges: ranges(e.reservedRange, false),
    });
  };
  const walk = (d: RawMessage, prefix: string, exportPrefix: string, file: string) => {
    const fullName = `${prefix}.${d.name}`;
    const exportName = exportPrefix ? `${exportPrefix}_${d.name}` : d.name;
    const type = root.lookupType(fullName);
    optionalByMessage.set(fullName, new Set((d.field ?? []).filter((f) => f.proto3Optional).map((f) => f.number)));
    messages.set(fullName, {
      fullName,
      file,
      exportName,
      isMapEntry: d.options?.mapEntry === true,
      fields: [],
      oneofs: new Map(),
      reservedNames: [...(d.reservedName ?? [])],
      reservedRanges: ranges(d.reservedRange, true),
      type,
    });
    for (const n of d.nestedType ?? []) walk(n, fullName, exportName, file);
    for (const e of d.enumType ?? []) addEnum(e, `${fullName}.${e.name}`);
  };
  for (const f of set.file) {
    if (!f.package?.startsWith('sandnode.')) continue;
    for (const m of f.messageType ?? []) walk(m, f.package, '', f.name);
    for (const e of f.enumType ?? []) addEnum(e, `${f.package}.${e.name}`);
  }
  for (const m of messages.values()) {
    const optional = optionalByMessage.get(m.fullName) ?? new Set<number>();
    for (const pf of m.type.fieldsArray) {
      const f = fieldInfo(pf, optional.has(pf.id));
      if (f.kind === 'message' && f.repeated && f.typeName) {
        const entry = messages.get(f.typeName);
        if (entry?.isMapEntry) {
          const k = entry.type.fieldsArray.find((x) => x.id === 1);
          const v = entry.type.fieldsArray.find((x) => x.id === 2);
          if (k && v) f.map = { key: fieldInfo(k, false), value: fieldInfo(v, false) };
        }
      }
      const oneof = pf.partOf;
      // a oneof holding only a proto3 optional field is synthetic: ts-proto makes it a plain optional property
      if (oneof && !f.optional) {
        f.oneof = oneof.name;
        f.oneofCase = f.prop;
        f.prop = tsName(oneof.name);
        m.oneofs.set(oneof.name, [...(m.oneofs.get(oneof.name) ?? []), f]);
      }
      m.fields.push(f);
    }
  }
  return { build: b, root, messages, enums, codecs: new Map(), problems: [] };
}

function fieldInfo(pf: protobuf.Field, optional: boolean): FieldInfo {
  pf.resolve();
  const rt = pf.resolvedType;
  const kind: Kind = rt instanceof protobuf.Type ? 'message' : rt instanceof protobuf.Enum ? 'enum' : 'scalar';
  return {
    name: pf.name,
    number: pf.id,
    prop: tsName(pf.name),
    kind,
    type: kind === 'scalar' ? pf.type : kind,
    typeName: rt ? strip(rt.fullName) : undefined,
    repeated: pf.repeated,
    optional,
  };
}

/** isReserved says whether a message or enum reserves a number or a name. */
export function isReserved(x: { reservedNames: string[]; reservedRanges: Array<[number, number]> }, number: number, name: string): { number: boolean; name: boolean } {
  return { number: x.reservedRanges.some(([a, z]) => number >= a && number <= z), name: x.reservedNames.includes(name) };
}

/** sameType returns undefined when two versions of a field have the same wire shape and type, else "old -> new". */
export function sameType(a: FieldInfo, b: FieldInfo): string | undefined {
  const show = (f: FieldInfo) => `${f.repeated ? (f.map ? 'map ' : 'repeated ') : ''}${f.typeName ?? f.type}`;
  if (a.type !== b.type || a.repeated !== b.repeated || a.typeName !== b.typeName || !!a.map !== !!b.map) return `${show(a)} -> ${show(b)}`;
  if (a.map && b.map) return sameType(a.map.key, b.map.key) ?? sameType(a.map.value, b.map.value);
  return undefined;
}
