/**
 * Validation of CreateVm input. Shape errors are InvalidArgumentError (nothing changed, the
 * message names the field); host paths that do not exist are FailedPreconditionError.
 */
import { existsSync } from 'node:fs';
import path from 'node:path';
import { FailedPreconditionError, formatEgressPolicy, InvalidArgumentError, parseEgressPolicy, requireResourceId } from '@sandnode/shared';
import { validateMachineId } from './freeze';
import type { VmSpec } from './types';

/**
 * Longest podd_socket_dir in bytes: `<dir>/podd.sock` (and the supervisor's bind name, as long)
 * must fit a unix socket address (107 bytes + NUL).
 */
export const MAX_PODD_SOCKET_DIR_BYTES = 107 - '/podd.sock'.length;

/** Largest vcpus a VM may ask for. */
export const MAX_VCPUS = 64;
/** Smallest non-zero memory limit, MiB. */
export const MIN_MEMORY_MIB = 32;
/** Largest memory limit, MiB. */
export const MAX_MEMORY_MIB = 65536;
/** Range of a non-zero pids limit (Resources.pids), and the default of a spec that says 0. */
export const MIN_PIDS = 16;
export const MAX_PIDS = 1_000_000;
export const DEFAULT_PIDS = 1024;

/**
 * Most bytes spec.env may carry, each entry counted as `KEY=VALUE` with its NUL (32 KiB; the
 * server sets one variable). Keeps the VM's row under the store's MAX_VM_ROW_BYTES (64 KiB).
 */
export const MAX_VM_ENV_BYTES = 32 * 1024;

/** Longest host path a spec may name, in bytes (Linux PATH_MAX). */
const PATH_MAX = 4096;
const DRIVE_ID_RE = /^[a-z0-9-]{1,32}$/;
const HOSTNAME_RE = /^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$/;
const ENV_KEY_RE = /^[A-Za-z_][A-Za-z0-9_]*$/;

/**
 * validateVmSpec checks the vm id and the shape of spec (no host access). Throws
 * InvalidArgumentError naming the field (`vm_id`, `spec.drives`, `spec.template_rootfs`,
 * `spec.podd_socket_dir`, `spec.resources.vcpus`, `spec.machine_id` ...).
 */
export function validateVmSpec(vmId: string, spec: VmSpec | undefined): asserts spec is VmSpec {
  requireResourceId('vm_id', vmId);
  if (!spec) throw new InvalidArgumentError('spec: required');

  let uppers = 0;
  let workspaces = 0;
  spec.drives.forEach((d, i) => {
    const f = `spec.drives[${i}]`;
    if (!DRIVE_ID_RE.test(d.driveId)) throw new InvalidArgumentError(`${f}.drive_id: ${JSON.stringify(d.driveId)} is not [a-z0-9-]{1,32}`);
    if (!path.isAbsolute(d.path)) throw new InvalidArgumentError(`${f}.path: ${JSON.stringify(d.path.slice(0, 200))} must be an absolute path`);
    if (Buffer.byteLength(d.path) > PATH_MAX) throw new InvalidArgumentError(`${f}.path: longer than ${PATH_MAX} bytes`);
    if (d.role === 'rootfs-upper') {
      uppers++;
      if (d.readOnly) throw new InvalidArgumentError(`${f}.read_only: the rootfs upper drive must be writable`);
    } else if (d.role === 'workspace') {
      workspaces++;
    } else {
      throw new InvalidArgumentError(`${f}.role: must be DRIVE_ROLE_ROOTFS_UPPER or DRIVE_ROLE_WORKSPACE`);
    }
  });
  const ids = new Set(spec.drives.map((d) => d.driveId));
  if (ids.size !== spec.drives.length) throw new InvalidArgumentError('spec.drives: drive_id values must be unique');
  if (uppers !== 1) throw new InvalidArgumentError(`spec.drives: need exactly one DRIVE_ROLE_ROOTFS_UPPER drive, got ${uppers}`);
  if (workspaces > 1) throw new InvalidArgumentError(`spec.drives: at most one DRIVE_ROLE_WORKSPACE drive, got ${workspaces}`);

  requireAbsolute('spec.template_rootfs', spec.templateRootfs);
  // The template is an overlay lowerdir option: ',' and ':' would split it.
  if (/[,:\n]/.test(spec.templateRootfs)) throw new InvalidArgumentError('spec.template_rootfs: must not contain "," ":" or a newline');
  requireAbsolute('spec.podd_socket_dir', spec.poddSocketDir);
  if (Buffer.byteLength(spec.poddSocketDir) > MAX_PODD_SOCKET_DIR_BYTES) {
    throw new InvalidArgumentError(`spec.podd_socket_dir: longer than ${MAX_PODD_SOCKET_DIR_BYTES} bytes (its podd.sock must fit a unix socket address)`);
  }

  const { vcpus, memoryMib } = spec.resources;
  if (!Number.isInteger(vcpus) || vcpus < 0 || vcpus > MAX_VCPUS) {
    throw new InvalidArgumentError(`spec.resources.vcpus: ${vcpus} is out of range 0..${MAX_VCPUS}`);
  }
  if (!Number.isInteger(memoryMib) || (memoryMib !== 0 && (memoryMib < MIN_MEMORY_MIB || memoryMib > MAX_MEMORY_MIB))) {
    throw new InvalidArgumentError(`spec.resources.memory_mib: ${memoryMib} is not 0 or ${MIN_MEMORY_MIB}..${MAX_MEMORY_MIB}`);
  }
  const pids = spec.resources.pids ?? 0;
  if (!Number.isInteger(pids) || (pids !== 0 && (pids < MIN_PIDS || pids > MAX_PIDS))) {
    throw new InvalidArgumentError(`spec.resources.pids: ${pids} is not 0 or ${MIN_PIDS}..${MAX_PIDS}`);
  }
  if (spec.hostname !== '' && !HOSTNAME_RE.test(spec.hostname)) {
    throw new InvalidArgumentError(`spec.hostname: ${JSON.stringify(spec.hostname)} is not a valid hostname label`);
  }
  let envBytes = 0;
  for (const [k, v] of Object.entries(spec.env)) {
    if (!ENV_KEY_RE.test(k)) throw new InvalidArgumentError(`spec.env: key ${JSON.stringify(k.slice(0, 80))} is not a valid variable name`);
    if (v.includes('\0')) throw new InvalidArgumentError(`spec.env[${k.slice(0, 80)}]: value contains a NUL byte`);
    envBytes += Buffer.byteLength(k) + Buffer.byteLength(v) + 2;
  }
  if (envBytes > MAX_VM_ENV_BYTES) throw new InvalidArgumentError(`spec.env: ${envBytes} bytes as KEY=VALUE entries, at most ${MAX_VM_ENV_BYTES}`);
  validateMachineId(spec.machineId);
  if (spec.network) {
    requireResourceId('spec.network.owner', spec.network.owner);
    if (!Number.isInteger(spec.network.slot) || spec.network.slot < -1) throw new InvalidArgumentError(`spec.network.slot: ${spec.network.slot} is not -1 (any) or a slot number`);
    // canonical, so that the same policy in another order is the same spec
    spec.network.egress = formatEgressPolicy(parseEgressPolicy(spec.network.egress, 'spec.network.egress'));
  }
}

/**
 * checkHostPaths checks that the template rootfs (a directory) and every drive path exist on
 * this host. Throws FailedPreconditionError naming the field and path.
 */
export function checkHostPaths(spec: VmSpec): void {
  if (!existsSync(spec.templateRootfs)) {
    throw new FailedPreconditionError(`spec.template_rootfs: ${spec.templateRootfs} does not exist`);
  }
  spec.drives.forEach((d, i) => {
    if (!existsSync(d.path)) throw new FailedPreconditionError(`spec.drives[${i}].path: ${d.path} does not exist`);
  });
}

function requireAbsolute(field: string, p: string): void {
  if (!p) throw new InvalidArgumentError(`${field}: required`);
  if (!path.isAbsolute(p)) throw new InvalidArgumentError(`${field}: ${JSON.stringify(p.slice(0, 200))} must be an absolute path`);
  if (Buffer.byteLength(p) > PATH_MAX) throw new InvalidArgumentError(`${field}: longer than ${PATH_MAX} bytes`);
}

/** canonicalSpec is a stable string of spec (env keys sorted) to compare two CreateVm calls. */
export function canonicalSpec(spec: VmSpec): string {
  const env = Object.fromEntries(Object.entries(spec.env).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
  return JSON.stringify({
    templateRootfs: spec.templateRootfs,
    drives: spec.drives.map((d) => ({ driveId: d.driveId, path: d.path, role: d.role, readOnly: d.readOnly })),
    resources: { vcpus: spec.resources.vcpus, memoryMib: spec.resources.memoryMib, diskBytes: spec.resources.diskBytes, ...(spec.resources.pids ? { pids: spec.resources.pids } : {}) },
    poddSocketDir: spec.poddSocketDir,
    hostname: spec.hostname,
    env,
    // Only when set, so rows written before machine_id existed compare equal to a request without it.
    ...(spec.machineId ? { machineId: spec.machineId } : {}),
    ...(spec.network ? { network: { owner: spec.network.owner, slot: spec.network.slot, egress: formatEgressPolicy(parseEgressPolicy(spec.network.egress)) } } : {}),
  });
}
