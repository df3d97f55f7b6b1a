/**
 * Domain types of the vmm-supervisor: what a VM is, what it is made of and which states it
 * goes through. No proto imports: `rpc/convert.ts` maps these to and from the wire.
 */

/**
 * VmState is the lifecycle state of a VM as the supervisor sees it.
 * - `creating`: the row is persisted, the host is being set up; not started yet.
 * - `running`: the VM's processes run.
 * - `paused`: the VM's processes are frozen (cgroup freezer), pids kept.
 * - `stopped`: the processes are gone; mounts, disks and the table row remain.
 */
export type VmState = 'creating' | 'running' | 'paused' | 'stopped';

/** DriveRole says what a drive is for; `unspecified` is what an unknown wire value maps to. */
export type DriveRole = 'unspecified' | 'rootfs-upper' | 'workspace';

/** DriveSpec is one host block device handed to the VM. */
export interface DriveSpec {
  /** Name of the drive within the VM: [a-z0-9-], 1..32 chars. */
  driveId: string;
  /** Absolute host path of the block device, e.g. "/dev/loop3". */
  path: string;
  role: DriveRole;
  /** Mount the drive read-only (not allowed for the rootfs upper). */
  readOnly: boolean;
}

/** VmResources are the VM's limits as requested; 0 means the node default. */
export interface VmResources {
  /** Virtual CPUs, 0..64 (runc: CPU quota of vcpus * 100 ms per 100 ms period). */
  vcpus: number;
  /** Memory limit in MiB: 0 or 32..65536. */
  memoryMib: number;
  /** Size of the workspace device in bytes (informational here; the device manager sizes it). */
  diskBytes: number;
  /** Most tasks in the VM: 0 / undefined (rows of older releases) or 16..1000000; 0 = node default. */
  pids?: number;
}

/** VmSpec is everything needed to start a VM. It never changes after CreateVm. */
export interface VmSpec {
  /** Absolute host path of the template's read-only root filesystem (runc: overlay lower dir). */
  templateRootfs: string;
  /** Exactly one `rootfs-upper` drive and at most one `workspace` drive. */
  drives: DriveSpec[];
  resources: VmResources;
  /**
   * Absolute host dir of the VM's podd socket. The supervisor binds `<dir>/podd.sock` on the
   * host and hands the listening fd to the VM (runc: fd 3, env SANDNODE_PODD_LISTEN_FD=3);
   * `<dir>/guest/` is the only part the VM sees (runc: rw at /run/sandnode).
   */
  poddSocketDir: string;
  /** Hostname of the VM; empty means the vm id. */
  hostname: string;
  /** Added to the environment of the VM's init. */
  env: Record<string, string>;
  /**
   * The VM's /etc/machine-id (machine-id(5)): empty/undefined = the template's; else 32
   * lowercase hex digits. Undefined in rows written before this field existed.
   */
  machineId?: string;
  /**
   * The VM's network (NetworkSpec): owner, slot (-1: any) and egress policy in canonical wire
   * form as first asked (UpdateVmNetwork changes the slot table's policy, not the spec).
   * Undefined: loopback only (and in rows written before this field existed).
   */
  network?: VmNetworkSpec;
}

/** VmNetworkSpec is a VmSpec's NetworkSpec. */
export interface VmNetworkSpec {
  /** The slot's owner, the sandbox id. */
  owner: string;
  /** The slot asked for; -1 = any free one. */
  slot: number;
  /** Canonical wire form of the egress policy. */
  egress: { allowOut: string[]; denyOut: string[]; blockAll: boolean };
}

/** EffectiveResources are the limits a VM actually gets once defaults are applied. */
export interface EffectiveResources {
  vcpus: number;
  memoryMib: number;
  /** cgroup pids.max of the VM. */
  pids: number;
}

/** VmProcess identifies the VM's init process across pid reuse. */
export interface VmProcess {
  /** Host pid of the VM's init (runc) or VMM process. */
  pid: number;
  /** Field 22 of /proc/<pid>/stat: clock ticks after boot. */
  startTimeTicks: number;
}

/** The record schema this release writes (bumped only for changes an older reader cannot ignore). */
export const VM_RECORD_SCHEMA = 1;

/**
 * VmRecord is one row of the supervisor's VM table, persisted before every transition is
 * acknowledged so that a restarted supervisor re-adopts its VMs.
 */
export interface VmRecord {
  /** Record schema; see {@link VM_RECORD_SCHEMA}. */
  schema: number;
  /** Caller-chosen id ([a-z0-9][a-z0-9-]{0,62}); also the runc container id. */
  vmId: string;
  state: VmState;
  /** Host pid of the VM's init; 0 when not started or stopped. */
  pid: number;
  /** Start ticks of pid; 0 when pid is 0. */
  startTimeTicks: number;
  /** "runc" or "firecracker". */
  driver: string;
  /** Version of the driver binary the VM was started with, e.g. "1.1.5". */
  driverVersion: string;
  spec: VmSpec;
  /** Creation time, Unix epoch ms. */
  createdAtMs: number;
  /** Host path of the VMM API socket (firecracker); empty for runc. */
  apiSocket: string;
  /**
   * Absolute path of the driver binary that manages this VM: the versioned copy
   * `<stateDir>/vmm-supervisor/bin/<driver>-<version>/<binary>` it was started with. Empty in
   * rows written before this field existed (the driver's current binary is used for them).
   */
  driverBinary: string;
  /**
   * The isolation the VM got at its create, as VMM_FEATURES strings (e.g. "vmm.seccomp.v1"),
   * sorted. Absent in rows written before this field existed: unknown, reported as none.
   */
  isolation?: string[];
}
