/**
 * VmDriver is the backend that turns a VM row into host processes: runc (embedded) or
 * firecracker (production, a later release). The supervisor owns the table and the state
 * machine; a driver only acts on the host and reports what it sees.
 */
import type { EffectiveResources, VmProcess, VmSpec } from './types';

/** LiveStatus is what the driver sees on the host for a VM. */
export type LiveStatus =
  /** The VM's init runs and is the process the table names. */
  | { state: 'running'; process: VmProcess }
  /** The VM's processes are frozen; the init is the process the table names. */
  | { state: 'paused'; process: VmProcess }
  /** The VM's processes are gone (or the pid now names another process). `detail` says why. */
  | { state: 'stopped'; detail: string };

/** VmDriver is one VM backend. Every method may throw a SandnodeError (InternalError when a host command fails). */
export interface VmDriver {
  /** Driver name reported in Vm.driver: "runc" or "firecracker". */
  readonly name: string;
  /** Feature strings the driver adds to GetVersion, e.g. "vmm.runc". */
  readonly features: readonly string[];
  /** version returns the driver binary's version, e.g. "1.1.5". */
  version(): Promise<string>;
  /**
   * create sets up the host (mounts, bundle) and starts the VM detached from the supervisor.
   * On failure it undoes everything it did and throws an error naming the failed step.
   */
  create(vmId: string, spec: VmSpec, resources: EffectiveResources): Promise<VmProcess>;
  /**
   * inspect reports the live status of vmId. `expected` is the process the table names: a
   * live process with other start ticks is reported `stopped` (never adopted).
   */
  inspect(vmId: string, expected: VmProcess): Promise<LiveStatus>;
  /** pause freezes every process of a running VM. */
  pause(vmId: string): Promise<void>;
  /** resume thaws a paused VM. */
  resume(vmId: string): Promise<void>;
  /**
   * stop ends the VM's processes: SIGTERM to init, SIGKILL to all after timeoutMs ms. Works on
   * a paused VM (kill, then thaw). Resolves once no process is left; no-op when already stopped.
   */
  stop(vmId: string, timeoutMs: number): Promise<void>;
  /**
   * destroy removes everything the VM has on the host (runtime state, mounts, dirs), killing
   * what still runs. Idempotent: a VM with nothing left on the host is a no-op. Also undoes
   * a half-done create.
   */
  destroy(vmId: string): Promise<void>;
}
