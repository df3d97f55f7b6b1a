/**
 * parseVmRecord: one stored VM-table row (JSON text) to a {@link VmRecord}, checked field by
 * field, so that a damaged row is set aside by the store instead of reaching adoption or the wire.
 */
import { RESOURCE_ID_RE } from '@sandnode/shared';
import { VM_RECORD_SCHEMA, type VmRecord } from '../core/types';

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

/**
 * parseVmRecord parses `raw` (the row's JSON) stored under `vmId` (the key column) and checks
 * every field this release reads: schema 1..{@link VM_RECORD_SCHEMA} (a newer one is refused,
 * its meaning is unknown), vmId a resource id equal to the key, state one of the four, counts
 * non-negative integers, strings strings, spec with drives/resources/env of the right shape.
 * Fields this release does not know are kept. `driverBinary` and `spec.machineId` may be missing
 * (rows of older releases). Throws {@link BadVmRowError} naming the first bad field.
 */
export function parseVmRecord(raw: unknown, vmId: string): VmRecord {
  need(typeof raw === 'string', `record is not text (${typeof raw})`);
  let v: unknown;
  try {
    v = JSON.parse(raw as string);
  } catch (err) {
    throw new BadVmRowError(`record is not JSON: ${(err as Error).message}`);
  }
  need(isObj(v), 'record is not a JSON object');
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
