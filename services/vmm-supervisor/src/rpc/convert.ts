/**
 * The one place where proto messages of sandnode.vmm.v1 and domain types meet.
 */
import { DriveRole as PbDriveRole, NetworkSlotState as PbSlotState, VmState as PbVmState } from '@sandnode/shared/proto/vmm/v1/vmm';
import type { Drive as PbDrive, NetworkSlot as PbNetworkSlot, Vm as PbVm, VmNetwork as PbVmNetwork, VmSpec as PbVmSpec } from '@sandnode/shared/proto/vmm/v1/vmm';
import type { DriveRole, DriveSpec, VmRecord, VmSpec, VmState } from '../core/types';
import type { VmNetworkInfo } from '../network/manager';
import type { SlotRow } from '../network/slot-store';
import type { SlotAddresses } from '@sandnode/shared';

/** driveRoleFromProto maps a wire role; UNSPECIFIED and unknown values become "unspecified" (rejected by validation). */
export function driveRoleFromProto(role: PbDriveRole): DriveRole {
  switch (role) {
    case PbDriveRole.DRIVE_ROLE_ROOTFS_UPPER:
      return 'rootfs-upper';
    case PbDriveRole.DRIVE_ROLE_WORKSPACE:
      return 'workspace';
    default:
      return 'unspecified';
  }
}

/** driveRoleToProto maps a domain role to the wire. */
export function driveRoleToProto(role: DriveRole): PbDriveRole {
  switch (role) {
    case 'rootfs-upper':
      return PbDriveRole.DRIVE_ROLE_ROOTFS_UPPER;
    case 'workspace':
      return PbDriveRole.DRIVE_ROLE_WORKSPACE;
    default:
      return PbDriveRole.DRIVE_ROLE_UNSPECIFIED;
  }
}

/** vmStateToProto maps a domain state to the wire enum. */
export function vmStateToProto(state: VmState): PbVmState {
  switch (state) {
    case 'creating':
      return PbVmState.VM_STATE_CREATING;
    case 'running':
      return PbVmState.VM_STATE_RUNNING;
    case 'paused':
      return PbVmState.VM_STATE_PAUSED;
    case 'stopped':
      return PbVmState.VM_STATE_STOPPED;
  }
}

/** vmSpecFromProto maps a request spec; undefined stays undefined (validation rejects it). */
export function vmSpecFromProto(spec: PbVmSpec | undefined): VmSpec | undefined {
  if (!spec) return undefined;
  return {
    templateRootfs: spec.templateRootfs,
    drives: spec.drives.map((d: PbDrive): DriveSpec => ({ driveId: d.driveId, path: d.path, role: driveRoleFromProto(d.role), readOnly: d.readOnly })),
    resources: {
      vcpus: spec.resources?.vcpus ?? 0,
      memoryMib: spec.resources?.memoryMib ?? 0,
      diskBytes: spec.resources?.diskBytes ?? 0,
      pids: spec.resources?.pids ?? 0,
    },
    poddSocketDir: spec.poddSocketDir,
    hostname: spec.hostname,
    env: { ...spec.env },
    machineId: spec.machineId,
    network: spec.network
      ? {
          owner: spec.network.owner,
          slot: spec.network.slot,
          egress: { allowOut: [...(spec.network.egress?.allowOut ?? [])], denyOut: [...(spec.network.egress?.denyOut ?? [])], blockAll: spec.network.egress?.blockAll ?? false },
        }
      : undefined,
  };
}

/** vmSpecToProto maps a stored spec back to the wire. */
export function vmSpecToProto(spec: VmSpec): PbVmSpec {
  return {
    templateRootfs: spec.templateRootfs,
    drives: spec.drives.map((d) => ({ driveId: d.driveId, path: d.path, role: driveRoleToProto(d.role), readOnly: d.readOnly })),
    resources: { vcpus: spec.resources.vcpus, memoryMib: spec.resources.memoryMib, diskBytes: spec.resources.diskBytes, pids: spec.resources.pids ?? 0 },
    poddSocketDir: spec.poddSocketDir,
    hostname: spec.hostname,
    env: { ...spec.env },
    machineId: spec.machineId ?? '',
    network: spec.network ? { owner: spec.network.owner, slot: spec.network.slot, egress: { ...spec.network.egress } } : undefined,
  };
}

/** vmNetworkToProto maps a VM's network; guestIfname is "eth0" (runc) or "tap0" (firecracker). */
export function vmNetworkToProto(n: VmNetworkInfo, guestIfname: string): PbVmNetwork {
  return { slot: n.slot, netnsPath: n.netnsPath, hostIfname: n.hostIfname, guestIfname, address: n.address, gateway: n.gateway, prefixLen: n.prefixLen, egress: { ...n.egress }, owner: n.owner };
}

/** networkSlotToProto maps a slot row with its addresses. */
export function networkSlotToProto(r: SlotRow, a: SlotAddresses): PbNetworkSlot {
  const state = r.state === 'spare' ? PbSlotState.NETWORK_SLOT_STATE_SPARE : r.state === 'in-use' ? PbSlotState.NETWORK_SLOT_STATE_IN_USE : PbSlotState.NETWORK_SLOT_STATE_RESERVED;
  return { slot: r.slot, state, owner: r.owner, vmId: r.vmId, address: a.address, gateway: a.gateway, hostIfname: a.hostIfname };
}

/** vmToProto maps a VM row (with its live state and its network, if any) to the wire. Stopped VMs report pid 0. */
export function vmToProto(rec: VmRecord, network?: PbVmNetwork): PbVm {
  const live = rec.state === 'running' || rec.state === 'paused';
  return {
    vmId: rec.vmId,
    state: vmStateToProto(rec.state),
    pid: live ? rec.pid : 0,
    startTimeTicks: live ? rec.startTimeTicks : 0,
    driver: rec.driver,
    driverVersion: rec.driverVersion,
    spec: vmSpecToProto(rec.spec),
    createdAtMs: rec.createdAtMs,
    apiSocket: rec.apiSocket,
    isolation: [...(rec.isolation ?? [])],
    network,
  };
}
