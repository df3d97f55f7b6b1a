/**
 * The isolation a runc VM gets, named by the feature strings of VMM_FEATURES: computed here and
 * nowhere else, so that GetVersion's features and each VM's recorded `isolation` (Vm.isolation,
 * kept with its row from its create on) never disagree.
 */
import { VMM_FEATURES } from '@sandnode/shared';

/** What the runc driver was configured to apply to a new VM. */
export interface RuncIsolationInput {
  /** a seccomp profile is set (config seccompProfile is not "unconfined") */
  seccomp: boolean;
  /** a user namespace range is set (config usernsRange is not "") */
  userns: boolean;
  /** the VM got an I/O limit (a blockIO throttle or weight, block-io.ts) */
  ioLimits?: boolean;
}

/**
 * runcIsolation lists the isolation feature strings a VM created now gets, sorted:
 * vmm.cgroup-ns.v1, vmm.console-cap.v1, vmm.guest-tmpfs.v1, vmm.pids-limit.v1, and
 * vmm.seccomp.v1 when a profile is used, vmm.userns.v1 when a user namespace range is,
 * vmm.io-limits.v1 when the VM got an I/O limit. Pure.
 */
export function runcIsolation(input: RuncIsolationInput): string[] {
  const out: string[] = [VMM_FEATURES.cgroupNamespace, VMM_FEATURES.pidsLimit, VMM_FEATURES.guestTmpfs, VMM_FEATURES.consoleCap];
  if (input.seccomp) out.push(VMM_FEATURES.seccomp);
  if (input.userns) out.push(VMM_FEATURES.userns);
  if (input.ioLimits) out.push(VMM_FEATURES.ioLimits);
  return out.sort();
}
