/**
 * VmPeer: the VmPort over gRPC to the vmm-supervisor (vmm.v1.VmService). Deadlines, retries
 * and error mapping as for DevicePeer (PeerOptions). Optional RPCs are used only when the
 * supervisor lists their feature (GetVersion, asked once per connection).
 */
import { createSandnodeChannel, createServiceClient, isCode, missingFeature, PeerFeatures, requireReachable, Status, VMM_FEATURES, type PeerConnect, type ServiceClient } from '@sandnode/shared';
import { DriveRole, FreezeEndedBy, NetworkSlotState, VmServiceDefinition, VmState, type Vm, type VmNetwork } from '@sandnode/shared/proto/vmm/v1/vmm';
import type { Channel } from 'nice-grpc';
import { DEFAULT_PEER_CALL_TIMEOUT_MS, DEFAULT_PEER_RETRY_ATTEMPTS } from '../config';
import type { EgressPolicyWire, NetworkSlotInfo, NodeNetwork, VmFreezeInfo, VmInfo, VmNetworkInfo, VmPort } from '../core/types';
import { peerConnect, type PeerOptions } from './device-peer';
import { announceEpoch, EPOCH_PROBE_ID } from './epoch-announce';
import { withMappedErrors } from './peer-errors';

function toInfo(vm: Vm | undefined): VmInfo {
  if (!vm) throw new Error('vmm-supervisor answered without a vm');
  const state =
    vm.state === VmState.VM_STATE_RUNNING
      ? 'RUNNING'
      : vm.state === VmState.VM_STATE_PAUSED
        ? 'PAUSED'
        : vm.state === VmState.VM_STATE_STOPPED
          ? 'STOPPED'
          : vm.state === VmState.VM_STATE_CREATING
            ? 'CREATING'
            : 'UNKNOWN';
  return {
    vmId: vm.vmId,
    state,
    pid: vm.pid,
    startTimeTicks: vm.startTimeTicks,
    driver: vm.driver,
    driverVersion: vm.driverVersion,
    apiSocket: vm.apiSocket,
    isolation: [...vm.isolation],
    ...(vm.network ? { network: networkInfo(vm.network) } : {}),
  };
}

function networkInfo(n: VmNetwork): VmNetworkInfo {
  const e = n.egress;
  return {
    slot: n.slot,
    address: n.address,
    gateway: n.gateway,
    hostIfname: n.hostIfname,
    owner: n.owner,
    egress: { allowOut: [...(e?.allowOut ?? [])], denyOut: [...(e?.denyOut ?? [])], blockAll: e?.blockAll ?? false },
  };
}

const SLOT_STATES: Record<number, NetworkSlotInfo['state']> = {
  [NetworkSlotState.NETWORK_SLOT_STATE_SPARE]: 'SPARE',
  [NetworkSlotState.NETWORK_SLOT_STATE_IN_USE]: 'IN_USE',
  [NetworkSlotState.NETWORK_SLOT_STATE_RESERVED]: 'RESERVED',
};

function egressToPb(e: EgressPolicyWire): EgressPolicyWire {
  return { allowOut: [...e.allowOut], denyOut: [...e.denyOut], blockAll: e.blockAll };
}

export class VmPeer implements VmPort {
  readonly channel: Channel;
  readonly client: ServiceClient<typeof VmServiceDefinition>;
  readonly features: PeerFeatures;
  private readonly peer: PeerConnect;
  private readonly log: PeerOptions['log'];

  /** address is "unix:///abs/vmm-supervisor.sock". */
  constructor(address: string, o: PeerOptions = {}) {
    this.channel = createSandnodeChannel(address);
    this.peer = peerConnect('vmm-supervisor', address, o);
    const client = createServiceClient(VmServiceDefinition, this.channel, {
      timeoutMs: o.timeoutMs ?? DEFAULT_PEER_CALL_TIMEOUT_MS,
      epoch: o.epoch ?? (() => 0),
      retryAttempts: o.retryAttempts ?? DEFAULT_PEER_RETRY_ATTEMPTS,
      peer: this.peer,
    });
    this.client = withMappedErrors(client, 'vmm-supervisor', o.log);
    this.log = o.log;
    this.features = new PeerFeatures(this.channel, 'vmm-supervisor', this.peer);
  }

  /** reachable waits up to connectWaitMs for the supervisor's channel; UNAVAILABLE naming it and its socket when it stays away (nothing is sent). */
  reachable(signal?: AbortSignal): Promise<void> {
    return requireReachable(this.channel, this.peer, signal);
  }

  /**
   * fenceEpoch raises the supervisor's epoch fence to epoch and says how: VmService.FenceEpoch
   * when the supervisor lists "vmm.fence-epoch.v1" (asked afresh: a restarted or rolled-back
   * supervisor may have other features), else the 0.2.0 announcement, a DeleteVm of an id no
   * sandbox can have, which carries the epoch like every mutating call. ABORTED when a higher
   * epoch exists. The FenceEpoch says that this server arms every freeze it needs
   * (require_freeze_arm; a supervisor without "vmm.freeze-arm.v1" ignores the field).
   */
  async fenceEpoch(epoch: number): Promise<string> {
    return announceEpoch(this.features, VMM_FEATURES.fenceEpoch, () => this.client.fenceEpoch({ epoch, requireFreezeArm: true }), {
      name: 'DeleteVm',
      call: () => this.client.deleteVm({ vmId: EPOCH_PROBE_ID }),
    });
  }

  /**
   * armFreeze lets vmId's freeze port accept one freeze within windowMs (VmService.ArmFreeze);
   * false, with nothing asked, when the supervisor lacks "vmm.freeze-arm.v1" (before it, freeze
   * ports accept every freeze). NOT_FOUND, FAILED_PRECONDITION (the VM is not running).
   */
  async armFreeze(vmId: string, windowMs: number): Promise<boolean> {
    if (!(await this.features.has(VMM_FEATURES.freezeArm))) return false;
    try {
      await this.client.armFreeze({ vmId, windowMs });
    } catch (err) {
      // the supervisor was replaced by one without the call since its features were read (a rollback to 0.2.0): it does not gate freezes
      if (!isCode(err, Status.UNIMPLEMENTED)) throw err;
      this.features.reset();
      return false;
    }
    return true;
  }

  /** disarmFreeze ends vmId's unused arm (VmService.DisarmFreeze; call it only after armFreeze said true); a supervisor without the call (rolled back meanwhile) has no arm to end. */
  async disarmFreeze(vmId: string): Promise<void> {
    try {
      await this.client.disarmFreeze({ vmId });
    } catch (err) {
      if (!isCode(err, Status.UNIMPLEMENTED)) throw err;
      this.features.reset();
    }
  }

  async create(a: Parameters<VmPort['create']>[0]): Promise<VmInfo> {
    const res = await this.client.createVm({
      vmId: a.vmId,
      spec: {
        templateRootfs: a.templateRootfs,
        drives: [
          { driveId: 'upper', path: a.upperPath, role: DriveRole.DRIVE_ROLE_ROOTFS_UPPER, readOnly: false },
          { driveId: 'workspace', path: a.workspacePath, role: DriveRole.DRIVE_ROLE_WORKSPACE, readOnly: false },
        ],
        resources: { vcpus: a.resources.vcpus, memoryMib: a.resources.memoryMib, diskBytes: a.resources.diskBytes, pids: a.resources.pids },
        poddSocketDir: a.poddSocketDir,
        hostname: a.hostname,
        env: a.env,
        machineId: a.machineId,
        network: a.network ? { owner: a.network.owner, slot: a.network.slot, egress: egressToPb(a.network.egress) } : undefined,
      },
    });
    return toInfo(res.vm);
  }

  /**
   * networkStatus: unavailable, naming the supervisor's version, without "vmm.network.v1"
   * (features as read once per connection; read again before a "lacks" answer, for a
   * supervisor upgraded since, and after a ListNetworkSlots answered UNIMPLEMENTED, by a
   * supervisor rolled back since); else ListNetworkSlots (enabled, why not, slots and settings).
   */
  async networkStatus(): Promise<NodeNetwork> {
    const none = { slots: [], pool: '', dnsPort: 0, egressProxyPort: 0, proxiedPorts: [], alwaysDenied: [] };
    let v = await this.features.get();
    const lacks = () => ({ available: false, reason: missingFeature({ component: 'vmm-supervisor', version: v.version, features: v.features }, VMM_FEATURES.network), ...none });
    if (!v.features.includes(VMM_FEATURES.network)) {
      // the supervisor may have been upgraded (restarted at 0.3.0) since its features were read: ask again before saying it lacks the feature
      this.features.reset();
      v = await this.features.get();
    }
    if (!v.features.includes(VMM_FEATURES.network)) return lacks();
    let r;
    try {
      r = await this.client.listNetworkSlots({});
    } catch (err) {
      if (!isCode(err, Status.UNIMPLEMENTED)) throw err;
      this.features.reset();
      v = await this.features.get();
      return lacks();
    }
    return {
      available: r.enabled,
      reason: r.enabled ? '' : `the vmm-supervisor ${v.version}'s network is off: ${r.disabledReason || 'no reason given'}`,
      slots: r.slots.map((s) => ({ slot: s.slot, state: SLOT_STATES[s.state] ?? 'UNKNOWN', owner: s.owner, vmId: s.vmId, address: s.address })),
      pool: r.pool,
      dnsPort: r.dnsPort,
      egressProxyPort: r.egressProxyPort,
      proxiedPorts: [...r.proxiedPorts],
      alwaysDenied: [...r.alwaysDenied],
    };
  }

  /** updateNetwork: VmService.UpdateVmNetwork (carries the epoch). NOT_FOUND, FAILED_PRECONDITION (no network), INVALID_ARGUMENT. */
  async updateNetwork(vmId: string, egress: EgressPolicyWire): Promise<VmNetworkInfo> {
    const r = await this.client.updateVmNetwork({ vmId, egress: egressToPb(egress) });
    if (!r.network) throw new Error('vmm-supervisor answered UpdateVmNetwork without a network');
    return networkInfo(r.network);
  }

  /** releaseNetworkSlot: VmService.ReleaseNetworkSlot (carries the epoch); false when the slot was free or another owner's. */
  async releaseNetworkSlot(slot: number, owner: string): Promise<boolean> {
    return (await this.client.releaseNetworkSlot({ slot, owner })).released;
  }

  /**
   * thawFreeze is ThawVmFreeze; undefined when the supervisor lacks "vmm.host-thaw.v1" (also
   * when it was replaced by one without the call since its features were read: UNIMPLEMENTED).
   */
  async thawFreeze(vmId: string, token: string): Promise<{ endedBy: string; frozenMs: number } | undefined> {
    if (!(await this.features.has(VMM_FEATURES.hostThaw))) return undefined;
    try {
      const r = await this.client.thawVmFreeze({ vmId, freezeToken: token });
      const endedBy = r.endedBy === FreezeEndedBy.FREEZE_ENDED_BY_CALLER ? 'caller' : r.endedBy === FreezeEndedBy.FREEZE_ENDED_BY_WATCHDOG ? 'watchdog' : 'unknown';
      return { endedBy, frozenMs: r.frozenMs };
    } catch (err) {
      if (!isCode(err, Status.UNIMPLEMENTED)) throw err;
      this.features.reset();
      return undefined;
    }
  }

  /** freezeStatus: undefined when the supervisor lacks feature vmm.freeze-status.v1 (GetVmFreeze). */
  async freezeStatus(vmId: string): Promise<VmFreezeInfo | undefined> {
    if (!(await this.features.has(VMM_FEATURES.freezeStatus))) return undefined;
    const r = await this.client.getVmFreeze({ vmId });
    const endedBy = r.endedBy === FreezeEndedBy.FREEZE_ENDED_BY_CALLER ? 'caller' : r.endedBy === FreezeEndedBy.FREEZE_ENDED_BY_WATCHDOG ? 'watchdog' : 'unknown';
    return { token: r.freezeToken, frozen: r.frozen, frozenAtMs: r.frozenAtUnixMs, endedAtMs: r.endedAtUnixMs, endedBy };
  }

  async get(vmId: string): Promise<VmInfo | undefined> {
    try {
      return toInfo((await this.client.getVm({ vmId })).vm);
    } catch (err) {
      if (isCode(err, Status.NOT_FOUND)) return undefined;
      throw err;
    }
  }

  async list(): Promise<VmInfo[]> {
    return (await this.client.listVms({})).vms.map(toInfo);
  }

  /** pause: PauseVm (not retried), answered by the VM's state when its answer was lost ({@link orReached}). */
  async pause(vmId: string): Promise<VmInfo> {
    return this.orReached(vmId, 'PAUSED', async () => toInfo((await this.client.pauseVm({ vmId })).vm));
  }

  /** resume: ResumeVm (not retried), answered by the VM's state when its answer was lost ({@link orReached}). */
  async resume(vmId: string): Promise<VmInfo> {
    return this.orReached(vmId, 'RUNNING', async () => toInfo((await this.client.resumeVm({ vmId })).vm));
  }

  /**
   * orReached runs call (PauseVm/ResumeVm: not idempotent, never sent twice); when it ends
   * UNAVAILABLE (the supervisor died under it: the VM may have changed, the answer is lost) it
   * asks GetVm once the supervisor is back (within the connect wait) and answers the VM when it
   * is in state `want`, so the record follows the VM; else the UNAVAILABLE stays.
   */
  private async orReached(vmId: string, want: VmInfo['state'], call: () => Promise<VmInfo>): Promise<VmInfo> {
    try {
      return await call();
    } catch (err) {
      if (!isCode(err, Status.UNAVAILABLE)) throw err;
      const vm = await this.get(vmId).catch(() => undefined);
      if (vm?.state !== want) throw err;
      this.log?.warn({ vm_id: vmId, state: want, err }, 'the supervisor went away before it answered; the VM is in the state asked for');
      return vm;
    }
  }

  async delete(vmId: string, opts: { keepNetwork?: boolean } = {}): Promise<void> {
    await this.client.deleteVm({ vmId, keepNetwork: opts.keepNetwork ?? false });
  }

  close(): void {
    this.channel.close();
  }
}
