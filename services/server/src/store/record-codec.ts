/**
 * Conversion between the domain SandboxRecord and the persisted protobuf RuntimeRecord.
 * The decoded message is carried in `opaque`, and encoding starts from it, so fields (and
 * unknown fields, kept by ts-proto's unknownFields option) written by a newer server survive a
 * read-modify-write by this one.
 */
import { FailedPreconditionError, formatEgressPolicy, parseEgressPolicy, parseIpv4 } from '@sandnode/shared';
import { SandboxState as PbState } from '@sandnode/shared/proto/server/v1/sandbox';
import { DeviceRole as PbRole, PoolState as PbPoolState, RuntimeRecord, type IdleRecord, type NetworkRecord, type PoolRecord } from '@sandnode/shared/proto/server/v1/record';
import { RECORD_SCHEMA, type DeviceRole, type IdleRef, type NetworkRef, type PoolMark, type SandboxRecord, type SandboxState } from '../core/types';

const STATE_TO_PB: Record<SandboxState, PbState> = {
  CREATING: PbState.SANDBOX_STATE_CREATING,
  RUNNING: PbState.SANDBOX_STATE_RUNNING,
  PAUSED: PbState.SANDBOX_STATE_PAUSED,
  DELETING: PbState.SANDBOX_STATE_DELETING,
  ERROR: PbState.SANDBOX_STATE_ERROR,
  DRAINED: PbState.SANDBOX_STATE_DRAINED,
  UNKNOWN: PbState.SANDBOX_STATE_UNSPECIFIED,
};

/** stateToPb maps a domain state to the proto enum. */
export function stateToPb(s: SandboxState): PbState {
  return STATE_TO_PB[s];
}

/** stateFromPb maps the proto enum to a domain state; unknown values become UNKNOWN. */
export function stateFromPb(s: PbState | number): SandboxState {
  for (const [k, v] of Object.entries(STATE_TO_PB)) if (v === s) return k as SandboxState;
  return 'UNKNOWN';
}

/** roleFromPb maps the proto enum; a value this version cannot name (0, or a newer one) is 'other'. */
function roleFromPb(r: PbRole): DeviceRole {
  if (r === PbRole.DEVICE_ROLE_ROOTFS_UPPER) return 'rootfs-upper';
  if (r === PbRole.DEVICE_ROLE_WORKSPACE) return 'workspace';
  return 'other';
}

/** roleToPb maps a domain role; 'other' keeps the stored value (old), so a newer server's role survives. */
function roleToPb(r: DeviceRole, old: PbRole | undefined): PbRole {
  if (r === 'rootfs-upper') return PbRole.DEVICE_ROLE_ROOTFS_UPPER;
  if (r === 'workspace') return PbRole.DEVICE_ROLE_WORKSPACE;
  return old ?? PbRole.DEVICE_ROLE_UNSPECIFIED;
}

/** encodeRecord returns the bytes to persist for rec. */
export function encodeRecord(rec: SandboxRecord): Uint8Array {
  const base = (rec.opaque as RuntimeRecord | undefined) ?? RuntimeRecord.fromPartial({});
  const msg: RuntimeRecord = {
    ...base,
    schema: RECORD_SCHEMA,
    sandboxId: rec.sandboxId,
    // UNKNOWN is a newer server's state this one cannot name: a rewrite (a SetTimeout, say)
    // keeps the stored value instead of writing UNSPECIFIED over it
    state: rec.state === 'UNKNOWN' && rec.opaque ? base.state : stateToPb(rec.state),
    template: rec.template,
    templatePoddVersion: rec.templatePoddVersion,
    templateRootfs: rec.templateRootfs,
    vm: rec.vm ? { ...(base.vm ?? {}), ...rec.vm, isolation: rec.vm.isolation ?? base.vm?.isolation ?? [] } : undefined,
    devices: rec.devices.map((d) => {
      const old = base.devices.find((o) => o.deviceId === d.deviceId);
      return {
        ...(old ?? {}),
        deviceId: d.deviceId,
        role: roleToPb(d.role, old?.role),
        path: d.path,
        backingFile: d.backingFile,
        sizeBytes: d.sizeBytes,
      };
    }),
    poddAddress: rec.poddAddress,
    network: rec.network ? networkToPb(rec.network, base.network) : undefined,
    // the mirror of network.slot for older readers: -1 without network; a read record of an
    // older server without network keeps its value (0.2.0 wrote -1, 0.1.0 0)
    networkSlot: rec.network ? rec.network.slot : rec.opaque && !base.network ? base.networkSlot : -1,
    egressPolicy: base.egressPolicy,
    createdAtMs: rec.createdAtMs,
    updatedAtMs: rec.updatedAtMs,
    expiresAtMs: rec.expiresAtMs,
    metadata: { ...rec.metadata },
    resources: { ...(base.resources ?? {}), ...rec.resources },
    requestId: rec.requestId,
    errorMessage: rec.errorMessage,
    resumeMethod: rec.resumeMethod,
    rootfsGeneration: rec.rootfsGeneration,
    forkedFrom: rec.forkedFrom,
    forkPausedAtMs: rec.forkPausedAtMs,
    machineId: rec.machineId,
    resetUpperDeviceId: rec.resetUpperDeviceId,
    idle: rec.idle ? idleToPb(rec.idle, base.idle) : undefined,
    pool: rec.pool ? poolToPb(rec.pool, base.pool) : undefined,
    env: { ...(rec.env ?? {}) },
  };
  // A record that was read with a schema this version knows keeps that schema (lowest that
  // expresses the data); this release only writes schema 1.
  msg.schema = Math.min(Math.max(base.schema || RECORD_SCHEMA, 1), RECORD_SCHEMA);
  return RuntimeRecord.encode(msg).finish();
}

/** networkToPb encodes a record's network over the stored one (its unknown fields survive). */
function networkToPb(n: NetworkRef, old: NetworkRecord | undefined): NetworkRecord {
  return {
    ...(old ?? {}),
    slot: n.slot,
    address: n.address,
    gateway: n.gateway,
    egress: { ...(old?.egress ?? {}), allowOut: [...n.egress.allowOut], denyOut: [...n.egress.denyOut], blockAll: n.egress.blockAll },
    public: n.public,
    accessTokenSha256: n.accessTokenSha256,
    hostIfname: n.hostIfname,
  };
}

/** idleToPb encodes a record's idle part over the stored one (its unknown fields survive). */
function idleToPb(i: IdleRef, old: IdleRecord | undefined): IdleRecord {
  return {
    ...(old ?? {}),
    settings: { ...(old?.settings ?? {}), ...i.settings },
    lastActivityMs: i.lastActivityMs,
    keepAliveUntilMs: i.keepAliveUntilMs,
    pausedAtMs: i.pausedAtMs,
    hibernatedAtMs: i.hibernatedAtMs,
  };
}

/** idleFromPb reads a stored idle part; settings without auto_resume (never written so) mean true. */
function idleFromPb(i: IdleRecord): IdleRef {
  const s = i.settings;
  return {
    settings: { pauseAfterS: s?.pauseAfterS ?? 0, hibernateAfterS: s?.hibernateAfterS ?? 0, pausedTtlS: s?.pausedTtlS ?? 0, autoResume: s?.autoResume ?? true },
    lastActivityMs: i.lastActivityMs,
    keepAliveUntilMs: i.keepAliveUntilMs,
    pausedAtMs: i.pausedAtMs,
    hibernatedAtMs: i.hibernatedAtMs,
  };
}

/**
 * networkFromPb reads a stored network; throws (the row is quarantined) when it is not one this
 * server could have written: a slot below -1, an address that is not IPv4 on a slot, a policy
 * the shared parser refuses, a token hash that is not 64 hex digits.
 */
function networkFromPb(id: string, n: NetworkRecord): NetworkRef {
  const bad = (why: string) => new Error(`runtime record ${id}: network: ${why}`);
  if (!Number.isInteger(n.slot) || n.slot < -1) throw bad(`slot ${n.slot} is not -1 or a slot number`);
  if (n.slot >= 0 && (parseIpv4(n.address) === undefined || parseIpv4(n.gateway) === undefined))
    throw bad(`slot ${n.slot} has address ${JSON.stringify(n.address)} / gateway ${JSON.stringify(n.gateway)}, not IPv4`);
  if (!/^[0-9a-f]{64}$/.test(n.accessTokenSha256)) throw bad('access_token_sha256 is not 64 hex digits');
  let egress;
  try {
    egress = formatEgressPolicy(parseEgressPolicy(n.egress ? { allowOut: n.egress.allowOut, denyOut: n.egress.denyOut, blockAll: n.egress.blockAll } : undefined, 'network.egress'));
  } catch (err) {
    throw bad((err as Error).message);
  }
  return { slot: n.slot, address: n.address, gateway: n.gateway, egress, public: n.public, accessTokenSha256: n.accessTokenSha256, hostIfname: n.hostIfname };
}

/** How far above RECORD_SCHEMA a schema may be and still be read as a newer release's record (above: a damaged row). */
const PLAUSIBLE_SCHEMA_STEPS = 100;

/**
 * decodeRecord parses persisted bytes. Throws FailedPreconditionError naming both schema
 * numbers when the record is newer than this server can read, and a plain Error (the row is
 * quarantined as damaged) for a schema more than PLAUSIBLE_SCHEMA_STEPS above it (a random or
 * huge varint: before, it said "upgrade the server").
 */
export function decodeRecord(bytes: Uint8Array): SandboxRecord {
  const msg = RuntimeRecord.decode(bytes);
  // a schema far above this one is no newer release's (schema moves by one per incompatible change): the row is damaged
  if (msg.schema > RECORD_SCHEMA + PLAUSIBLE_SCHEMA_STEPS) {
    throw new Error(`runtime record ${msg.sandboxId.slice(0, 64)}: schema ${msg.schema} is no schema any sandnode writes (this server reads ${RECORD_SCHEMA}); the row is damaged, not newer`);
  }
  if (msg.schema > RECORD_SCHEMA) {
    throw new FailedPreconditionError(`runtime record ${msg.sandboxId}: schema ${msg.schema} is newer than schema ${RECORD_SCHEMA} this server reads; upgrade the server`);
  }
  return {
    schema: msg.schema,
    sandboxId: msg.sandboxId,
    state: stateFromPb(msg.state),
    template: msg.template,
    templatePoddVersion: msg.templatePoddVersion,
    templateRootfs: msg.templateRootfs,
    vm: msg.vm
      ? {
          vmId: msg.vm.vmId,
          driver: msg.vm.driver,
          pid: msg.vm.pid,
          startTimeTicks: msg.vm.startTimeTicks,
          driverVersion: msg.vm.driverVersion,
          apiSocket: msg.vm.apiSocket,
          isolation: [...msg.vm.isolation],
        }
      : undefined,
    // every device is kept, also one of a role this version cannot name: a rewrite keeps it
    // and a teardown deletes it
    devices: msg.devices.map((d) => ({ deviceId: d.deviceId, role: roleFromPb(d.role), path: d.path, backingFile: d.backingFile, sizeBytes: d.sizeBytes })),
    poddAddress: msg.poddAddress,
    createdAtMs: msg.createdAtMs,
    updatedAtMs: msg.updatedAtMs,
    expiresAtMs: msg.expiresAtMs,
    metadata: { ...msg.metadata },
    resources: {
      vcpus: msg.resources?.vcpus ?? 0,
      memoryMib: msg.resources?.memoryMib ?? 0,
      diskBytes: msg.resources?.diskBytes ?? 0,
      pids: msg.resources?.pids ?? 0,
    },
    requestId: msg.requestId,
    errorMessage: msg.errorMessage,
    resumeMethod: msg.resumeMethod,
    rootfsGeneration: msg.rootfsGeneration || 1,
    forkedFrom: msg.forkedFrom,
    forkPausedAtMs: msg.forkPausedAtMs,
    machineId: msg.machineId,
    resetUpperDeviceId: msg.resetUpperDeviceId,
    // a record of 0.2.0 has no network field (network_slot -1 or 0): no network
    network: msg.network ? networkFromPb(msg.sandboxId, msg.network) : undefined,
    idle: msg.idle ? idleFromPb(msg.idle) : undefined,
    pool: msg.pool ? poolFromPb(msg.pool) : undefined,
    env: Object.keys(msg.env).length > 0 ? { ...msg.env } : undefined,
    opaque: msg,
  };
}

const POOL_STATES: [PoolMark['state'], PbPoolState][] = [
  ['READY', PbPoolState.POOL_STATE_READY],
  ['CLAIMING', PbPoolState.POOL_STATE_CLAIMING],
  ['NONE', PbPoolState.POOL_STATE_UNSPECIFIED],
];

/** poolToPb encodes a record's pool part over the stored one (its unknown fields survive). */
function poolToPb(p: PoolMark, old: PoolRecord | undefined): PoolRecord {
  return { ...(old ?? {}), key: p.key, state: POOL_STATES.find(([s]) => s === p.state)?.[1] ?? PbPoolState.POOL_STATE_UNSPECIFIED, claimedAtMs: p.claimedAtMs };
}

/** poolFromPb reads a stored pool part; a state this version cannot name is NONE (not a member: never claimed). */
function poolFromPb(p: PoolRecord): PoolMark {
  return { key: p.key, state: POOL_STATES.find(([, v]) => v === p.state)?.[0] ?? 'NONE', claimedAtMs: p.claimedAtMs };
}

/** poolColumn is the value of records.pool for rec: the pool key of a READY member, else "" (what a claim looks for). */
export function poolColumn(rec: SandboxRecord): string {
  return rec.pool?.state === 'READY' ? rec.pool.key : '';
}
