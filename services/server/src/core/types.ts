/**
 * Domain types of the server: sandboxes, their runtime records and the ports to the other
 * components. No proto imports here: `store/` and `peers/` convert.
 */

/**
 * Lifecycle states of a sandbox (the transition table and its diagram: transitions.ts). UNKNOWN
 * is a state of a newer server that this one cannot read.
 */
export type SandboxState = 'CREATING' | 'RUNNING' | 'PAUSED' | 'DELETING' | 'ERROR' | 'DRAINED' | 'UNKNOWN';

/** Resources with defaults filled in. */
export interface Resources {
  /** virtual CPUs */
  vcpus: number;
  /** memory limit, MiB */
  memoryMib: number;
  /** /workspace device size, bytes */
  diskBytes: number;
  /** most tasks in the sandbox; 0 = the supervisor's default (common.v1.Resources.pids) */
  pids: number;
}

/**
 * What a device is to its sandbox. 'other' is a role this version cannot name (a newer
 * server's): the device is kept in the record (its stored role survives a rewrite, see
 * store/record-codec.ts) and torn down with the sandbox, but never booted on.
 */
export type DeviceRole = 'rootfs-upper' | 'workspace' | 'other';

/** One device of a sandbox as recorded. */
export interface DeviceRef {
  deviceId: string;
  role: DeviceRole;
  /** device node at the time of the record, e.g. /dev/loop3 */
  path: string;
  backingFile: string;
  sizeBytes: number;
}

/** The VM of a sandbox as recorded. */
export interface VmRef {
  vmId: string;
  driver: string;
  /** host pid of the VM's init */
  pid: number;
  /** /proc/<pid>/stat field 22 */
  startTimeTicks: number;
  driverVersion: string;
  apiSocket: string;
  /**
   * isolation the supervisor applied at the VM's create (feature strings, vmm Vm.isolation);
   * [] or absent when it named none (a 0.2.0 supervisor) or in records of older servers
   */
  isolation?: string[];
}

/**
 * SandboxRecord is the runtime record of one sandbox: the persisted truth. `opaque` carries the
 * stored encoding so that a rewrite keeps fields this version does not know (downgrades lose
 * nothing); core code never looks inside it.
 */
export interface SandboxRecord {
  schema: number;
  sandboxId: string;
  state: SandboxState;
  template: string;
  templatePoddVersion: string;
  templateRootfs: string;
  vm: VmRef | undefined;
  devices: DeviceRef[];
  poddAddress: string;
  createdAtMs: number;
  updatedAtMs: number;
  /** 0 means no timeout */
  expiresAtMs: number;
  metadata: Record<string, string>;
  resources: Resources;
  requestId: string;
  errorMessage: string;
  /** how a DRAINED sandbox comes back: "cold-start" (or "criu"); empty otherwise */
  resumeMethod: string;
  /** rootfs uppers so far: 1 at create, +1 per ResetRootfs (0 from an older writer means 1) */
  rootfsGeneration: number;
  /** the parent's id for a fork child; else "" */
  forkedFrom: string;
  /** set (epoch ms) while a pause-fallback fork holds this sandbox's VM paused; else 0 */
  forkPausedAtMs: number;
  /** /etc/machine-id of the sandbox (32 hex); "" in records of older servers */
  machineId: string;
  /** the fresh upper device of a ResetRootfs in progress; else "" */
  resetUpperDeviceId: string;
  /** the sandbox's network (record.proto NetworkRecord); undefined: none (also in records of 0.2.0) */
  network?: NetworkRef;
  /** the sandbox's idle settings and timers (record.proto IdleRecord; core/idle.ts); undefined: none */
  idle?: IdleRef;
  /** the warm-pool part (record.proto PoolRecord); undefined for a sandbox never in a pool (pool.ts) */
  pool?: PoolMark;
  /** the sandbox's environment for every Exec/ExecStream (CreateSandboxRequest.env); undefined or {}: none */
  env?: Record<string, string>;
  opaque?: unknown;
}

/** A sandbox's idle settings (sandbox.proto IdleSettings): seconds, 0 = never. */
export interface IdleSettings {
  pauseAfterS: number;
  hibernateAfterS: number;
  pausedTtlS: number;
  autoResume: boolean;
}

/** The idle part of a record; every time is absolute, Unix epoch ms, 0 = none (core/idle.ts). */
export interface IdleRef {
  settings: IdleSettings;
  /** last activity persisted (the active server holds a newer one in memory) */
  lastActivityMs: number;
  /** end of the KeepAlive lease */
  keepAliveUntilMs: number;
  /** when it was paused or hibernated; 0 while RUNNING */
  pausedAtMs: number;
  /** set while DRAINED by hibernate_after_s; counts only with state DRAINED */
  hibernatedAtMs: number;
}

/** A record's warm-pool part: READY (a member waiting), CLAIMING (claimed, the request's policy being applied), NONE (claimed from a pool). */
export interface PoolMark {
  /** the pool's key (pool-config.ts poolKey) */
  key: string;
  state: 'READY' | 'CLAIMING' | 'NONE';
  /** when a CreateSandbox claimed it, epoch ms; 0 for a member */
  claimedAtMs: number;
}

/** An egress policy in its wire shape (common.v1.EgressPolicy); in a record always canonical (formatEgressPolicy). */
export interface EgressPolicyWire {
  allowOut: string[];
  denyOut: string[];
  blockAll: boolean;
}

/**
 * The network of a sandbox as recorded. A create or fork records it with slot -1 and no
 * address before the VM is made (the supervisor picks the slot); the VM's answer fills it in.
 */
export interface NetworkRef {
  /** slot in the node's pool; -1 until the VM got one */
  slot: number;
  /** the sandbox's IPv4 address ("" until the VM got one) */
  address: string;
  /** the slot's host-side address */
  gateway: string;
  /** the egress policy, canonical */
  egress: EgressPolicyWire;
  /** ingress needs no access token */
  public: boolean;
  /** hex SHA-256 of the ingress access token */
  accessTokenSha256: string;
  /** host side of the veth pair */
  hostIfname: string;
}

/** The network a VM got (vmm VmNetwork). */
export interface VmNetworkInfo {
  slot: number;
  address: string;
  gateway: string;
  hostIfname: string;
  owner: string;
  egress: EgressPolicyWire;
}

/** A slot of the node's pool that is not free (vmm NetworkSlot). */
export interface NetworkSlotInfo {
  slot: number;
  state: 'SPARE' | 'IN_USE' | 'RESERVED' | 'UNKNOWN';
  owner: string;
  vmId: string;
  address: string;
}

/** The node's network as the supervisor reports it (vmm ListNetworkSlots), or why there is none. */
export interface NodeNetwork {
  /** the supervisor can give VMs a network (it lists "vmm.network.v1" and says enabled) */
  available: boolean;
  /** why not, naming the component and its version ("vmm-supervisor 0.2.0 lacks feature \"vmm.network.v1\""); "" when available */
  reason: string;
  slots: NetworkSlotInfo[];
  pool: string;
  dnsPort: number;
  egressProxyPort: number;
  proxiedPorts: number[];
  alwaysDenied: string[];
}

/** The resume method of a DRAINED sandbox whose VM is stopped and whose disks are kept. */
export const COLD_START = 'cold-start';

/** The newest record schema this server reads and the one it writes. */
export const RECORD_SCHEMA = 1;

/** RecordStore persists runtime records; every write is durable (fsync) when it returns. */
export interface RecordStore {
  get(id: string): SandboxRecord | undefined;
  /** list returns every record ordered by id. */
  list(): SandboxRecord[];
  findByRequestId(requestId: string): SandboxRecord | undefined;
  /** put inserts or replaces the record; durable on return. */
  put(rec: SandboxRecord): void;
  /** delete removes the record; durable on return. */
  delete(id: string): void;
  /**
   * mentioning returns the records other than exceptId whose stored bytes contain one of
   * needles: a superset of those listing one of those ids (callers check the fields). Absent: callers filter list().
   */
  mentioning?(needles: string[], exceptId: string): SandboxRecord[];
  /**
   * claimPoolMember moves one READY member of pool key (id: that one only) that is RUNNING out
   * of the pool with one compare-and-swap on the row (durable on return): apply(rec) gives the
   * record to write (its pool state no longer READY). Exactly one caller gets a member, across
   * processes too. undefined when none was left. Absent: the store has no pools.
   */
  claimPoolMember?(key: string, apply: (rec: SandboxRecord) => SandboxRecord, id?: string): SandboxRecord | undefined;
  /** claimPoolMembers: claimPoolMember for each of applies in one durable transaction; per item the record, undefined (none left) or the Error its apply threw. */
  claimPoolMembers?(key: string, applies: ((rec: SandboxRecord) => SandboxRecord)[]): (SandboxRecord | undefined | Error)[];
  /** quarantinedIds lists the sandbox ids of rows set aside as unservable (their parts are not orphans). */
  quarantinedIds?(): string[];
  close(): void;
}

/** VmInfo is what the supervisor reports of a VM. */
export interface VmInfo {
  vmId: string;
  state: 'CREATING' | 'RUNNING' | 'PAUSED' | 'STOPPED' | 'UNKNOWN';
  pid: number;
  startTimeTicks: number;
  driver: string;
  driverVersion: string;
  apiSocket: string;
  /** isolation applied at the VM's create (feature strings); [] or absent = none named (0.2.0 supervisor) */
  isolation?: string[];
  /** the VM's network; absent for a VM without one */
  network?: VmNetworkInfo;
}

/** VmFreezeInfo is a VM's freeze as the supervisor (not the sandbox) saw it; times are Unix epoch ms. */
export interface VmFreezeInfo {
  token: string;
  frozen: boolean;
  frozenAtMs: number;
  /** 0 while frozen */
  endedAtMs: number;
  endedBy: 'caller' | 'watchdog' | 'unknown';
}

/** VmPort is the server's view of the vmm-supervisor. */
export interface VmPort {
  /** reachable resolves once the supervisor can be called; UnavailableError naming it and its socket when it stays away past the peer wait (nothing sent) */
  reachable?(signal?: AbortSignal): Promise<void>;
  create(args: {
    vmId: string;
    templateRootfs: string;
    upperPath: string;
    workspacePath: string;
    resources: Resources;
    poddSocketDir: string;
    hostname: string;
    env: Record<string, string>;
    /** /etc/machine-id for the VM (32 hex) or "" to leave it; an older supervisor ignores it */
    machineId: string;
    /** the VM's network (vmm NetworkSpec; slot -1: any free one); absent: loopback only. Check networkStatus first: an older supervisor ignores it */
    network?: { owner: string; slot: number; egress: EgressPolicyWire };
  }): Promise<VmInfo>;
  /** get returns undefined for an unknown VM. */
  get(vmId: string): Promise<VmInfo | undefined>;
  list(): Promise<VmInfo[]>;
  pause(vmId: string): Promise<VmInfo>;
  resume(vmId: string): Promise<VmInfo>;
  /**
   * freezeStatus is the VM's current or latest filesystem freeze as the supervisor saw it
   * (vmm GetVmFreeze); undefined when the supervisor cannot tell (no "vmm.freeze-status.v1").
   */
  freezeStatus(vmId: string): Promise<VmFreezeInfo | undefined>;
  /**
   * armFreeze lets vmId's freeze port accept one freeze within windowMs (vmm ArmFreeze); false
   * when the supervisor has no arming (no "vmm.freeze-arm.v1": it accepts unarmed freezes).
   * Absent in ports without a freeze port (test fakes): nothing is armed.
   */
  armFreeze?(vmId: string, windowMs: number): Promise<boolean>;
  /** disarmFreeze ends vmId's unused arm (vmm DisarmFreeze). */
  disarmFreeze?(vmId: string): Promise<void>;
  /**
   * thawFreeze ends vmId's freeze named by token from the host (vmm ThawVmFreeze) and says how
   * it ended; undefined, with nothing asked, when the supervisor lacks "vmm.host-thaw.v1"
   * (thaw through podd then).
   */
  thawFreeze?(vmId: string, token: string): Promise<{ endedBy: string; frozenMs: number } | undefined>;
  /** delete removes the VM; keepNetwork keeps its network slot reserved for its owner (vmm DeleteVm keep_network). */
  delete(vmId: string, opts?: { keepNetwork?: boolean }): Promise<void>;
  /**
   * networkStatus is the node's network (vmm ListNetworkSlots), asked now; available false with
   * the reason when the supervisor lacks "vmm.network.v1" or says its network is off. Absent in
   * ports of test fakes without network: none.
   */
  networkStatus?(): Promise<NodeNetwork>;
  /** updateNetwork replaces the VM's egress policy (vmm UpdateVmNetwork, epoch-fenced). NOT_FOUND, FAILED_PRECONDITION (no network). */
  updateNetwork?(vmId: string, egress: EgressPolicyWire): Promise<VmNetworkInfo>;
  /** releaseNetworkSlot frees a slot reserved for owner (vmm ReleaseNetworkSlot); false when it was free or another owner's. */
  releaseNetworkSlot?(slot: number, owner: string): Promise<boolean>;
}

/** DeviceInfo is what the device manager reports of a device. */
export interface DeviceInfo {
  deviceId: string;
  path: string;
  backingFile: string;
  sizeBytes: number;
  attached: boolean;
}

/** ClonedDevice is a CloneDevice result: the clone and what the copy cost. */
export interface ClonedDevice extends DeviceInfo {
  /** time the image copy took, ms */
  cloneMs: number;
  /** the extents were shared (reflink) rather than copied */
  reflinked: boolean;
}

/** PeerVersion is a peer's GetVersion answer. */
export interface PeerVersion {
  version: string;
  features: string[];
}

/** DevicePort is the server's view of the ublk-manager. */
export interface DevicePort {
  createEmpty(deviceId: string, sizeBytes: number): Promise<DeviceInfo>;
  /**
   * clone makes deviceId a copy-on-write clone of sourceId (ublk CloneDevice); sourceQuiesced
   * says the caller holds the source frozen or paused; deadlineMs bounds the call with its
   * retries (a frozen parent's window). Needs feature "ublk.clone".
   */
  clone(deviceId: string, sourceId: string, sourceQuiesced: boolean, deadlineMs?: number): Promise<ClonedDevice>;
  /**
   * snapshot makes each item's deviceId a clone of its sourceId without attaching it (ublk
   * SnapshotDevices, feature "ublk.clone-snapshot.v1"; all or nothing), in item order, each
   * detached (path ""); clone() of the same ids attaches one afterwards. deadlineMs as clone's.
   */
  snapshot?(items: { deviceId: string; sourceId: string }[], sourceQuiesced: boolean, deadlineMs?: number): Promise<ClonedDevice[]>;
  /** version asks the ublk-manager now (never cached: a handover may have replaced it). */
  version(): Promise<PeerVersion>;
  get(deviceId: string): Promise<DeviceInfo | undefined>;
  list(): Promise<DeviceInfo[]>;
  delete(deviceId: string): Promise<void>;
}

/** One event of an exec stream. */
export type ExecEvent = { kind: 'started'; pid: number } | { kind: 'stdout'; data: Uint8Array } | { kind: 'stderr'; data: Uint8Array } | { kind: 'exit'; exitCode: number; signal: string };

export interface ExecArgs {
  argv: string[];
  env: Record<string, string>;
  cwd: string;
  stdin: Uint8Array;
  timeoutMs: number;
}

/** A freeze held by podd Quiesce. */
export interface PoddFreeze {
  token: string;
  /** the window after clamping, ms */
  maxFreezeMs: number;
  /** sync + syncfs time before the freeze, ms */
  syncMs: number;
  /** FIFREEZE time, ms */
  freezeMs: number;
}

/** How podd says a freeze ended. */
export interface PoddThaw {
  endedBy: 'caller' | 'watchdog' | 'unknown';
  /** the freeze window, ms */
  frozenMs: number;
}

/** PoddClient talks to the podd of one sandbox. */
export interface PoddClient {
  health(timeoutMs: number): Promise<boolean>;
  /** bulkTransfers: how many bulk-channel transfers podd serves now (Health bulk_transfers; 0 from an older podd); absent in fakes */
  bulkTransfers?(timeoutMs: number): Promise<number>;
  version(): Promise<PeerVersion>;
  /** quiesce freezes the sandbox's writable filesystems for at most maxFreezeMs (podd.quiesce). */
  quiesce(maxFreezeMs: number): Promise<PoddFreeze>;
  /** thaw ends the freeze named by token. */
  thaw(token: string): Promise<PoddThaw>;
  exec(args: ExecArgs, signal: AbortSignal): AsyncIterable<ExecEvent>;
  readFile(path: string, offset: number, length: number): Promise<{ data: Uint8Array; sizeBytes: number; eof: boolean }>;
  writeFile(path: string, data: Uint8Array, mode: number, append: boolean): Promise<{ sizeBytes: number }>;
  /** execStreams speaks podd's ExecStream / ListProcesses / SignalProcess (check podd.exec-stream.v1 first); absent in fakes without it */
  readonly execStreams?: PoddExecStreams;
  close(): void;
}

/** PoddConnector opens (and caches) podd clients by address. */
export interface PoddConnector {
  connect(address: string): PoddClient;
  forget(address: string): void;
}

import type { PoddExecStreams } from './exec-stream';

/** Template as the server knows it. */
export type { TemplateInfo } from '@sandnode/template-builder';
import type { TemplateInfo } from '@sandnode/template-builder';

/** TemplateCatalog resolves and builds templates. */
export interface TemplateCatalog {
  get(name: string): Promise<TemplateInfo | undefined>;
  list(): Promise<TemplateInfo[]>;
  build(name: string, replace: boolean): Promise<TemplateInfo>;
  /** delete removes a template no sandbox uses (see TemplateService.DeleteTemplate for the errors). */
  delete(name: string): Promise<TemplateInfo>;
}
