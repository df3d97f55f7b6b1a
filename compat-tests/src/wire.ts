/**
 * Wire compatibility of the contracts between builds (N-1 <-> N, and N-2 <-> N with --skip):
 * the entry points main.ts, the matrix and the tests use. The parts live in `wire/`:
 *
 * - build-paths.ts: where a build keeps its descriptor set and generated modules
 * - schema.ts: a build's descriptor set loaded into a protobufjs Root, flattened per message
 * - codegen.ts: the build's ts-proto modules, checked against its descriptor set
 * - populate.ts: a fully populated, deterministic sample of any message
 * - reference.ts: protobufjs encode/decode in ts-proto's object shape
 * - unknown-fields.ts: unknown fields written and found with protobufjs Writer/Reader
 * - compare.ts: field-by-field comparison across two schemas
 * - checks.ts: the checks of one message between a writer and a reader
 * - run.ts: every message over every pair; report.ts: the report section and runWireCompat
 */
export { ciStrict, descriptorPath, genDir, missingParts, sharedPath } from './wire/build-paths';
export { attachCodecs, loadSchema } from './wire/codegen';
export { populate } from './wire/populate';
export { runWireCompat, wireSection } from './wire/report';
export { checkSchemas, checkWire } from './wire/run';
export { loadDescriptorSet, schemaFromDescriptorSet, type Codec, type FieldInfo, type MessageInfo, type Schema } from './wire/schema';
export { UNKNOWN_ENUM_VALUE, type EnumOutcome, type WireCompatResult, type WireEnumResult, type WireMessageResult } from './wire/types';
