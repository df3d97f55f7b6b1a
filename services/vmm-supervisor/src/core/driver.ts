/**
 * VmDriver is the backend that turns a VM row into host processes: runc (embedded) or
 * firecracker (production). The supervisor owns the table and the state machine; a driver
 * only acts on the host and reports what it sees.
 *
 * Binaries: at start the supervisor copies the configured driver binary into a versioned dir
 * and calls {@link VmDriver.useBinary}; new VMs start with that copy and every later call on a
 * VM uses the binary recorded for it ({@link VmRef.binary}), so upgrading the host package never
 * changes the binary that manages a running VM.
 */
import type { FreezeEnd, FreezeStatus } from './freeze';
import type { EffectiveResources, VmProcess, VmSpec } from './types';
import type { VmNetworkInfo } from '../network/manager';

/** LiveStatus is what the driver sees on the host for a VM. */
export type LiveStatus =
  /** The VM's init runs and is the process the table names. */
  | { state: 'running'; process: VmProcess }
  /** The VM's processes are frozen; the init is the process the table names. */
  | { state: 'paused'; process: VmProcess }
  /** The VM's processes are gone (or the pid now names another process). `detail` says why. */
  | { state: 'stopped'; detail: string };

/** VmRef is what the table knows about a VM that a driver call needs. */
export interface VmRef {
  vmId: string;
  /** The process the table names (pid 0 when not started or stopped). */
  process: VmProcess;
  /** The driver binary recorded for the VM; empty = the driver's current binary. */
  binary: string;
  /** The VMM API socket recorded for the VM (firecracker); empty for runc. */
  apiSocket: string;
}

/** StartedVm is what create reports about a started VM. */
export interface StartedVm {
  process: VmProcess;
  /** Host path of the VMM API socket; empty when the driver has none. */
  apiSocket: string;
  /**
   * The isolation the VM got, as VMM_FEATURES strings (runc: drivers/isolation.ts), recorded
   * with the VM; undefined = the driver names none.
   */
  isolation?: string[];
}

/** VmDriver is one VM backend. Every method may throw a SandnodeError (InternalError when a host command fails). */
export interface VmDriver {
  /** Driver name reported in Vm.driver: "runc" or "firecracker"; also the versioned bin dir prefix. */
  readonly name: string;
  /** Feature strings the driver adds to GetVersion, e.g. "vmm.runc". */
  readonly features: readonly string[];
  /** version returns the configured driver binary's version, e.g. "1.1.5+ds1". */
  version(): Promise<string>;
  /**
   * configuredBinary resolves the configured binary (a name is looked up in PATH) to an
   * absolute path. Throws ConfigError naming the config key when it cannot be found.
   */
  configuredBinary(): string;
  /** useBinary makes path (a versioned copy of the configured binary) the one new VMs start with. */
  useBinary(path: string): void;
  /** currentBinary is the binary new VMs start with (absolute path). */
  currentBinary(): string;
  /**
   * create sets up the host and starts the VM detached from the supervisor with the current
   * binary. On failure it undoes everything it did and throws an error naming the failed step.
   * net: the VM's network slot (join its netns at net.netnsPath; resolv.conf names net.gateway);
   * undefined = loopback only.
   */
  create(vmId: string, spec: VmSpec, resources: EffectiveResources, net?: VmNetworkInfo): Promise<StartedVm>;
  /**
   * inspect reports the live status of vm. A live process with other start ticks than
   * vm.process is reported `stopped` (never adopted).
   */
  inspect(vm: VmRef): Promise<LiveStatus>;
  /** pause freezes every process of a running VM. */
  pause(vm: VmRef): Promise<void>;
  /** resume thaws a paused VM. */
  resume(vm: VmRef): Promise<void>;
  /**
   * stop ends the VM's processes: a graceful request first, a kill of all after timeoutMs ms.
   * Works on a paused VM. Resolves once no process is left; no-op when already stopped.
   */
  stop(vm: VmRef, timeoutMs: number, signal?: AbortSignal): Promise<void>;
  /**
   * destroy removes everything the VM has on the host (runtime state, mounts, dirs), killing
   * what still runs. Idempotent: a VM with nothing left on the host is a no-op. Also undoes
   * a half-done create.
   */
  destroy(vm: VmRef): Promise<void>;
  /**
   * adopt (optional) runs at supervisor start for every VM in the table that is not being
   * created, after its live state was checked (live = running or paused): the driver re-attaches
   * what it serves for the VM (runc: the freeze port) and recovers what a dead supervisor left.
   */
  adopt?(vm: VmRef, live: boolean): Promise<void>;
  /**
   * freezeStatus (optional) is the VM's current or latest filesystem freeze as the driver saw
   * it (runc: the freeze port's record); undefined when the driver has no freeze port.
   */
  freezeStatus?(vmId: string): Promise<FreezeStatus | undefined>;
  /**
   * thawFreeze (optional) ends the VM's freeze named by token from the host, as its freeze
   * port's ThawFilesystems does; undefined when the driver has no freeze port for the VM.
   */
  thawFreeze?(vmId: string, token: string): Promise<{ endedBy: FreezeEnd; frozenMs: number } | undefined>;
  /** close (optional) stops what the driver serves in this process (daemon shutdown); VMs keep running. */
  close?(): Promise<void>;
}
