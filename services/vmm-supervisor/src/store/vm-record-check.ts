/**
 * parseVmRecord: one stored VM-table row (JSON text) to a {@link VmRecord}, checked field by
 * field, so that a damaged row is set aside by the store instead of reaching adoption or the wire.
 */
import path from 'node:path';
import { RESOURCE_ID_RE } from '@sandnode/shared';
import { VM_RECORD_SCHEMA, type VmRecord } from '../core/types';

/**
 * Largest VM-table row, in bytes of its JSON. A real row is 1-2 KB (CreateVm bounds the env,
 * see MAX_VM_ENV_BYTES, and the paths it stores must exist, so each is under PATH_MAX); the
 * bound keeps one planted row from making ListVms (no paging) exceed grpc-js's 4 MiB message
 * limit: 64 rows of the largest size, or thousands of real rows, fit one message.
 */
export const MAX_VM_ROW_BYTES = 64 * 1024;

/** BadVmRowError says why a stored row cannot be read; `message` is the reason kept in quarantine. */
export class BadVmRowError extends Error {}

const STATES = ['creating', 'running', 'paused', 'stopped'];
const ROLES = ['unspecified', 'rootfs-upper', 'workspace'];

type Obj = Record<string, unknown>;

function isObj(v: unknown): v is Obj {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function need(ok: boolean, what: string): void {
  if (!ok) throw new BadVmRowError(what);
}

function str(o: Obj, key: string, at: string): void {
  need(typeof o[key] === 'string', `${at}${key} is not a string`);
}

function count(o: Obj, key: string, at: string): void {
  const v = o[key];
  need(typeof v === 'number' && Number.isSafeInteger(v) && v >= 0, `${at}${key} is not a non-negative integer`);
}

/** What a row is checked against: the dir of the supervisor's own driver binaries (`<stateDir>/vmm-supervisor/bin`, absolute). */
export interface VmRowContext {
  binDir: string;
}

/**
 * inBinDir says whether p is a copy inside binDir as DriverBinaries.install makes them,
 * `<binDir>/<driver>-<version>/<name>`: absolute, normalized (no "." or ".." part), exactly two
 * parts below binDir. Lexical: binDir is written only by the supervisor (no sandbox can plant a
 * symlink there).
 */
export function inBinDir(p: string, binDir: string): boolean {
  if (!path.isAbsolute(p) || path.normalize(p) !== p) return false;
  const rel = path.relative(binDir, p);
  const parts = rel.split(path.sep);
  return !path.isAbsolute(rel) && parts.length === 2 && parts.every((x) => x !== '' && x !== '.' && x !== '..');
}

/**
 * parseVmRecord parses `raw` (the row's JSON) stored under `vmId` (the key column) and checks
 * every field this release reads: schema 1..{@link VM_RECORD_SCHEMA} (a newer one is refused,
 * its meaning is unknown), vmId a resource id equal to the key, state one of the four, counts
 * non-negative integers, strings strings, spec with drives/resources/env of the right shape.
 * Fields this release does not know are kept. `driverBinary`, `isolation` and `spec.machineId` may be missing
 * (rows of older releases). Also refused: a row over {@link MAX_VM_ROW_BYTES}; a row that is not
 * exactly the JSON.stringify form this store writes (a duplicated key, which JSON.parse would
 * silently resolve to its last value, or text edited by hand: its meaning is ambiguous); a
 * non-empty `driverBinary` that is not a copy in ctx.binDir ({@link inBinDir}: the supervisor
 * runs it as root). Throws {@link BadVmRowError} naming the first bad field.
 */
export function parseVmRecord(raw: unknown, vmId: string, ctx: VmRowContext): VmRecord {
  need(typeof raw === 'string', `record is not text (${typeof raw})`);
  const size = Buffer.byteLength(raw as string);
  need(size <= MAX_VM_ROW_BYTES, `record is ${size} bytes, over the ${MAX_VM_ROW_BYTES}-byte bound of a VM row`);
  let v: unknown;
  try {
    v = JSON.parse(raw as string);
  } catch (err) {
    throw new BadVmRowError(`record is not JSON: ${(err as Error).message}`);
  }
  need(isObj(v), 'record is not a JSON object');
  need(JSON.stringify(v) === raw, 'record is not in the form this store writes (a duplicated key, whitespace or a non-canonical number or escape): its meaning is ambiguous');
  const r = v as Obj;
  need(typeof r.schema === 'number' && Number.isInteger(r.schema) && r.schema >= 1, 'schema is missing or not a positive integer');
  need((r.schema as number) <= VM_RECORD_SCHEMA, `schema ${r.schema as number} is newer than this release reads (${VM_RECORD_SCHEMA})`);
  str(r, 'vmId', '');
  need(RESOURCE_ID_RE.test(r.vmId as string), `vmId ${JSON.stringify(r.vmId)} is not a valid id`);
  need(r.vmId === vmId, `vmId ${JSON.stringify(r.vmId)} differs from the row key ${JSON.stringify(vmId)}`);
  need(STATES.includes(r.state as string), `state ${JSON.stringify(r.state)} is not one of ${STATES.join(', ')}`);
  count(r, 'pid', '');
  count(r, 'startTimeTicks', '');
  count(r, 'createdAtMs', '');
  for (const k of ['driver', 'driverVersion', 'apiSocket']) str(r, k, '');
  if (r.driverBinary === undefined) r.driverBinary = '';
  str(r, 'driverBinary', '');
  need(r.driverBinary === '' || inBinDir(r.driverBinary as string, ctx.binDir), `driverBinary ${JSON.stringify(r.driverBinary)} is not a copy in ${ctx.binDir}`);
  if (r.isolation !== undefined) need(Array.isArray(r.isolation) && r.isolation.every((x) => typeof x === 'string'), 'isolation is not an array of strings');
  need(isObj(r.spec), 'spec is not an object');
  const s = r.spec as Obj;
  for (const k of ['templateRootfs', 'poddSocketDir', 'hostname']) str(s, k, 'spec.');
  if (s.machineId !== undefined) str(s, 'machineId', 'spec.');
  need(isObj(s.resources), 'spec.resources is not an object');
  for (const k of ['vcpus', 'memoryMib', 'diskBytes']) count(s.resources as Obj, k, 'spec.resources.');
  need(isObj(s.env) && Object.values(s.env).every((e) => typeof e === 'string'), 'spec.env is not an object of strings');
  need(Array.isArray(s.drives), 'spec.drives is not an array');
  (s.drives as unknown[]).forEach((d, i) => {
    const at = `spec.drives[${i}].`;
    need(isObj(d), `${at.slice(0, -1)} is not an object`);
    const drive = d as Obj;
    str(drive, 'driveId', at);
    str(drive, 'path', at);
    need(ROLES.includes(drive.role as string), `${at}role ${JSON.stringify(drive.role)} is not one of ${ROLES.join(', ')}`);
    need(typeof drive.readOnly === 'boolean', `${at}readOnly is not a boolean`);
  });
  return r as unknown as VmRecord;
}
