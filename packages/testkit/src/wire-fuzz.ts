/**
 * Wire fuzzing (issue 11 section 3): seeded random bytes and mutated valid messages for every
 * RPC of the sandnode descriptor set (`@sandnode/shared/descriptor/sandnode.binpb`, written by
 * `npm run gen`), sent as raw bytes over a grpc-js client with identity serializers, so that
 * a new RPC is fuzzed without touching the test. protobufjs reflection builds the valid seed of
 * each request type; the mutations then break it at the wire level.
 *
 * Same seed, same cases: a failure names the seed, the case number and the payload (hex).
 */
import { readFileSync } from 'node:fs';
import * as grpc from '@grpc/grpc-js';
import * as protobuf from 'protobufjs';
import type { Rng } from './fuzz-random';

/** protobufjs's descriptor extension: the google.protobuf descriptor types, and Root.fromDescriptor. */
const descriptor = require('protobufjs/ext/descriptor') as { FileDescriptorSet: { decode(b: Uint8Array): unknown } };

/** One RPC of the descriptor set. */
export interface FuzzRpc {
  /** e.g. "sandnode.vmm.v1.VmService" */
  service: string;
  /** e.g. "/sandnode.vmm.v1.VmService/DeleteVm" */
  path: string;
  requestType: protobuf.Type;
  serverStreaming: boolean;
  clientStreaming: boolean;
  /** the RPC's idempotency_level ("NO_SIDE_EFFECTS", "IDEMPOTENT" or "") */
  idempotency: string;
}

/** What one fuzz case sends. */
export interface FuzzCase {
  /** the mutation's name, e.g. "bit-flip" */
  kind: string;
  bytes: Buffer;
}

/** What a call answered: the gRPC code and details, and how long it took (ms). */
export interface FuzzAnswer {
  code: grpc.status;
  details: string;
  ms: number;
}

/** descriptorPath is the descriptor set of the sandnode protos (built by `npm run gen`). */
export function descriptorPath(): string {
  return require.resolve('@sandnode/shared/descriptor');
}

/** loadRpcs lists every RPC of every service in the descriptor set at file. */
export function loadRpcs(file = descriptorPath()): FuzzRpc[] {
  const root = (protobuf.Root as unknown as { fromDescriptor(d: unknown): protobuf.Root }).fromDescriptor(descriptor.FileDescriptorSet.decode(readFileSync(file))).resolveAll();
  const out: FuzzRpc[] = [];
  const walk = (ns: protobuf.NamespaceBase) => {
    for (const o of ns.nestedArray) {
      if (o instanceof protobuf.Service) {
        const service = o.fullName.replace(/^\./, '');
        for (const m of o.methodsArray) {
          out.push({
            service,
            path: `/${service}/${m.name}`,
            requestType: m.resolvedRequestType!,
            serverStreaming: !!m.responseStream,
            clientStreaming: !!m.requestStream,
            idempotency: String((m.options as Record<string, unknown> | undefined)?.idempotency_level ?? ''),
          });
        }
      }
      if (o instanceof protobuf.Namespace) walk(o);
    }
  };
  walk(root);
  return out;
}

const snake = (s: string) => s.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);

/**
 * seedMessage builds a valid request of type: every field set (one member per oneof), string
 * fields from `strings` by snake_case field name (else "fuzz"), numbers small, enums valid,
 * nested messages to depth 3. Encoded with protobufjs.
 */
export function seedMessage(type: protobuf.Type, strings: Record<string, string>, rng: Rng): Buffer {
  return Buffer.from(type.encode(type.fromObject(seedObject(type, strings, rng, 0))).finish());
}

function seedObject(type: protobuf.Type, strings: Record<string, string>, rng: Rng, depth: number): Record<string, unknown> {
  const obj: Record<string, unknown> = {};
  const oneofTaken = new Set<string>();
  for (const f of type.fieldsArray) {
    if (f.partOf) {
      if (oneofTaken.has(f.partOf.name)) continue;
      oneofTaken.add(f.partOf.name);
    }
    const one = () => scalarOrMessage(f, strings, rng, depth);
    if (f.map) obj[f.name] = { [strings[snake(f.name)] ?? 'k']: one() };
    else if (f.repeated) obj[f.name] = [one()];
    else obj[f.name] = one();
    if (obj[f.name] === undefined) delete obj[f.name];
  }
  return obj;
}

function scalarOrMessage(f: protobuf.Field, strings: Record<string, string>, rng: Rng, depth: number): unknown {
  const t = f.resolvedType;
  if (t instanceof protobuf.Enum) return rng.pick(Object.values(t.values));
  if (t instanceof protobuf.Type) return depth < 3 ? seedObject(t, strings, rng, depth + 1) : undefined;
  switch (f.type) {
    case 'string':
      return strings[snake(f.name)] ?? 'fuzz';
    case 'bytes':
      return rng.bytes(rng.below(8));
    case 'bool':
      return rng.below(2) === 1;
    case 'double':
    case 'float':
      return rng.below(1000) / 10;
    default:
      return rng.below(1000);
  }
}

/** varint encodes a non-negative integer (up to 2^64-1) as a protobuf varint. */
export function varint(n: bigint | number): Buffer {
  let v = BigInt(n);
  const out: number[] = [];
  do {
    let b = Number(v & 0x7fn);
    v >>= 7n;
    if (v > 0n) b |= 0x80;
    out.push(b);
  } while (v > 0n);
  return Buffer.from(out);
}

/** repeat is b n times over. */
const repeat = (b: Buffer, n: number) => Buffer.alloc(b.length * n).fill(b);
const tag = (field: number, wireType: number) => varint((BigInt(field) << 3n) | BigInt(wireType));
const lenField = (field: number, payload: Buffer) => Buffer.concat([tag(field, 2), varint(payload.length), payload]);

function wireTypeOf(f: protobuf.Field): number {
  if (f.resolvedType instanceof protobuf.Type || f.map || f.type === 'string' || f.type === 'bytes') return 2;
  if (['double', 'fixed64', 'sfixed64'].includes(f.type)) return 1;
  if (['float', 'fixed32', 'sfixed32'].includes(f.type)) return 5;
  return 0;
}

const payloadOf = (wt: number, rng: Rng): Buffer => (wt === 0 ? varint(rng.below(1 << 20)) : wt === 1 ? rng.bytes(8) : wt === 5 ? rng.bytes(4) : Buffer.concat([varint(3), Buffer.from('abc')]));

/** The deepest nesting a deep-nesting case builds (levels). */
export const DEEP_NESTING_LEVELS = 100_000;
/** How many elements a huge-repeated case appends. */
export const HUGE_REPEATED_COUNT = 100_000;

/** recursiveField finds a message field whose type contains itself (directly or below); undefined when none does. */
function recursiveField(type: protobuf.Type): protobuf.Field | undefined {
  const reaches = (t: protobuf.Type, target: protobuf.Type, seen: Set<protobuf.Type>): boolean => {
    if (t === target) return true;
    if (seen.has(t)) return false;
    seen.add(t);
    return t.fieldsArray.some((f) => f.resolvedType instanceof protobuf.Type && reaches(f.resolvedType, target, seen));
  };
  return type.fieldsArray.find((f) => f.resolvedType instanceof protobuf.Type && reaches(f.resolvedType, type, new Set()));
}

/**
 * Mutation kinds. `undecodable` ones are malformed for every conforming protobuf parser (a
 * length past the end, a varint of 11 bytes): the only ones sent to RPCs whose well-formed
 * default request is a legitimate node-wide operation (see {@link FuzzOptions.onlyUndecodable}).
 */
export const MUTATIONS = {
  'random-bytes': { undecodable: false },
  'bit-flip': { undecodable: false },
  truncate: { undecodable: false },
  'wrong-wire-type': { undecodable: false },
  'huge-length': { undecodable: true },
  'overlong-varint': { undecodable: true },
  'unknown-fields': { undecodable: false },
  'out-of-range-enum': { undecodable: false },
  'negative-and-2^64': { undecodable: false },
  'invalid-utf8': { undecodable: false },
  'huge-repeated': { undecodable: false },
  'huge-string': { undecodable: false },
  'deep-nesting': { undecodable: false },
} as const;
export type MutationKind = keyof typeof MUTATIONS;

/** mutate makes one case of kind from the valid seed of rpc's request type. */
export function mutate(kind: MutationKind, type: protobuf.Type, seed: Buffer, rng: Rng): FuzzCase {
  const fields = type.fieldsArray;
  const someField = () => (fields.length ? rng.pick(fields) : undefined);
  const unknownNo = () => 1000 + rng.below(536_870_000);
  let bytes: Buffer;
  switch (kind) {
    case 'random-bytes':
      bytes = rng.bytes(rng.below(4) === 0 ? rng.below(4096) : rng.below(64));
      break;
    case 'bit-flip': {
      bytes = Buffer.from(seed.length ? seed : rng.bytes(8));
      for (let i = 1 + rng.below(8); i > 0; i--) bytes[rng.below(bytes.length)]! ^= 1 << rng.below(8);
      break;
    }
    case 'truncate':
      bytes = seed.subarray(0, seed.length ? rng.below(seed.length) : 0);
      break;
    case 'wrong-wire-type': {
      const f = someField();
      const no = f?.id ?? 1;
      const wt = rng.pick([0, 1, 2, 5].filter((w) => !f || w !== wireTypeOf(f)));
      bytes = Buffer.concat([seed, tag(no, wt), payloadOf(wt, rng)]);
      break;
    }
    case 'huge-length': {
      // a length-delimited field (known or unknown number) that claims far more than follows
      const f = fields.find((x) => wireTypeOf(x) === 2);
      const no = f && rng.below(2) ? f.id : unknownNo();
      const len = rng.pick([2n ** 31n, 2n ** 32n - 1n, 2n ** 63n, BigInt(seed.length + 100)]);
      bytes = Buffer.concat([seed, tag(no, 2), varint(len), rng.bytes(rng.below(16))]);
      break;
    }
    case 'overlong-varint':
      bytes = Buffer.concat([seed, tag(someField()?.id ?? 1, 0), Buffer.alloc(11, 0xff)]);
      break;
    case 'unknown-fields': {
      const parts = [seed];
      for (let i = 1 + rng.below(20); i > 0; i--) {
        const wt = rng.pick([0, 1, 2, 5]);
        parts.push(tag(unknownNo(), wt), payloadOf(wt, rng));
      }
      bytes = Buffer.concat(parts);
      break;
    }
    case 'out-of-range-enum': {
      const enums = fields.filter((f) => f.resolvedType instanceof protobuf.Enum);
      const f = enums.length ? rng.pick(enums) : someField();
      // 9999, or -1 as int32 (a 10-byte varint), or 2^32 + 1
      const v = rng.pick([9999n, 2n ** 64n - 1n, 2n ** 32n + 1n]);
      bytes = Buffer.concat([seed, tag(f?.id ?? 1, 0), varint(v)]);
      break;
    }
    case 'negative-and-2^64': {
      const ints = fields.filter((f) => wireTypeOf(f) === 0 && !(f.resolvedType instanceof protobuf.Enum));
      const f = ints.length ? rng.pick(ints) : someField();
      bytes = Buffer.concat([seed, tag(f?.id ?? 1, 0), varint(rng.pick([2n ** 64n - 1n, 2n ** 63n, 2n ** 53n + 1n, 2n ** 32n]))]);
      break;
    }
    case 'invalid-utf8': {
      const strs = fields.filter((f) => f.type === 'string');
      const f = strs.length ? rng.pick(strs) : undefined;
      bytes = Buffer.concat([seed, lenField(f?.id ?? unknownNo(), Buffer.from([0xff, 0xfe, 0xc3, 0x28, 0xed, 0xa0, 0x80]))]);
      break;
    }
    case 'huge-repeated': {
      const reps = fields.filter((f) => f.repeated || f.map);
      const f = reps.length ? rng.pick(reps) : undefined;
      const no = f?.id ?? unknownNo();
      const el = !f
        ? lenField(no, Buffer.from('x'))
        : f.map
          ? undefined // entries need distinct keys: built below
          : wireTypeOf(f) === 2
            ? lenField(no, f.resolvedType instanceof protobuf.Type ? Buffer.alloc(0) : Buffer.from('x'))
            : Buffer.concat([tag(no, wireTypeOf(f)), payloadOf(wireTypeOf(f), rng)]);
      if (el) bytes = Buffer.concat([seed, repeat(el, HUGE_REPEATED_COUNT)]);
      else {
        const parts = [seed];
        for (let i = 0; i < HUGE_REPEATED_COUNT; i++) parts.push(lenField(no, Buffer.concat([lenField(1, Buffer.from(`k${i}`)), lenField(2, Buffer.from('v'))])));
        bytes = Buffer.concat(parts);
      }
      break;
    }
    case 'huge-string': {
      // a known string/bytes field (the last value wins) of 4 KiB .. 300 KiB: paths, ids, argv entries
      const strs = fields.filter((f) => f.type === 'string' || f.type === 'bytes');
      const f = strs.length ? rng.pick(strs) : undefined;
      const n = rng.pick([4096, 65_536, 300_000]);
      bytes = Buffer.concat([seed, lenField(f?.id ?? unknownNo(), Buffer.alloc(n, rng.pick(['a', '/', '.', '-'])))]);
      break;
    }
    case 'deep-nesting': {
      const rec = recursiveField(type);
      if (rec) {
        let inner = Buffer.alloc(0);
        for (let i = 0; i < 2000; i++) inner = lenField(rec.id, inner);
        bytes = Buffer.concat([seed, inner]);
      } else {
        // no message recurses: nest unknown groups (START_GROUP ... END_GROUP), which every parser must skip recursively
        const no = unknownNo();
        const levels = rng.below(2) ? DEEP_NESTING_LEVELS : 100 + rng.below(1000);
        bytes = Buffer.concat([seed, repeat(tag(no, 3), levels), repeat(tag(no, 4), levels)]);
      }
      break;
    }
  }
  return { kind, bytes };
}

/** rawClient is a grpc-js client of address whose calls take and give raw bytes. */
export function rawClient(address: string): grpc.Client {
  return new grpc.Client(address, grpc.credentials.createInsecure(), { 'grpc.max_receive_message_length': 8 * 1024 * 1024, 'grpc.max_send_message_length': 8 * 1024 * 1024 });
}

const identity = (b: Buffer) => b;

/**
 * sendRaw sends bytes as the request of rpc (unary or server streaming; streamed answers are
 * read and dropped) with metadata, and resolves with the final status; deadlineMs bounds the
 * call (a client-side DEADLINE_EXCEEDED after it means the call hung).
 */
export function sendRaw(client: grpc.Client, rpc: FuzzRpc, bytes: Buffer, metadata: Record<string, string>, deadlineMs: number): Promise<FuzzAnswer> {
  const md = new grpc.Metadata();
  for (const [k, v] of Object.entries(metadata)) md.set(k, v);
  const t0 = Date.now();
  const options = { deadline: Date.now() + deadlineMs };
  return new Promise((resolve) => {
    const done = (code: grpc.status, details: string) => resolve({ code, details, ms: Date.now() - t0 });
    if (rpc.clientStreaming) {
      const call = rpc.serverStreaming
        ? client.makeBidiStreamRequest(rpc.path, identity, identity, md, options)
        : client.makeClientStreamRequest(rpc.path, identity, identity, md, options, () => undefined);
      call.on('status', (s: grpc.StatusObject) => done(s.code, s.details));
      call.on('error', () => undefined);
      call.on('data', () => undefined);
      call.write(bytes);
      call.end();
    } else if (rpc.serverStreaming) {
      const call = client.makeServerStreamRequest(rpc.path, identity, identity, bytes, md, options);
      call.on('data', () => undefined);
      call.on('error', () => undefined);
      call.on('status', (s: grpc.StatusObject) => done(s.code, s.details));
    } else {
      const call = client.makeUnaryRequest(rpc.path, identity, identity, bytes, md, options, () => undefined);
      call.on('status', (s: grpc.StatusObject) => done(s.code, s.details));
    }
  });
}

/**
 * badAnswer says why an answer is not a clear one, or undefined when it is: UNKNOWN, INTERNAL
 * and DATA_LOSS never are (an unmapped error or a crash); a DEADLINE_EXCEEDED that took the
 * whole client deadline is a hang; an UNAVAILABLE that names a broken connection is a crash;
 * a stack trace in the details leaks internals. An UNAVAILABLE whose details name a broken
 * connection to ownSocket (the endpoint's own socket path) is a crash; one that names another
 * address is the handler's report of a peer it could not reach.
 */
export function badAnswer(a: FuzzAnswer, deadlineMs: number, ownSocket?: string): string | undefined {
  if (a.code === grpc.status.UNKNOWN || a.code === grpc.status.INTERNAL || a.code === grpc.status.DATA_LOSS) return `${grpc.status[a.code]}: ${a.details}`;
  if (a.code === grpc.status.DEADLINE_EXCEEDED && a.ms >= deadlineMs) return `no answer within ${deadlineMs} ms (hang): ${a.details}`;
  if (a.code === grpc.status.CANCELLED) return `CANCELLED: ${a.details}`;
  const broken = /No connection established|Connection dropped|ECONNREFUSED|ENOENT|RST_STREAM|Connection closed/i.test(a.details);
  if (a.code === grpc.status.UNAVAILABLE && broken && (ownSocket === undefined || a.details.includes(ownSocket) || !/\//.test(a.details))) return `the connection broke (crash?): ${a.details}`;
  if (/\n\s+at .+\(.+:\d+:\d+\)/.test(a.details)) return `a stack trace on the wire: ${a.details}`;
  return undefined;
}
