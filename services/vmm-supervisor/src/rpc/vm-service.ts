/**
 * Thin nice-grpc handlers of sandnode.vmm.v1.VmService: convert -> call the Supervisor ->
 * convert. Domain errors thrown by the core are mapped to gRPC codes by the shared middleware.
 */
import { FailedPreconditionError, InvalidArgumentError, metadataEpoch, readEpochFile, requireResourceId, type EpochFence, type SandnodeCallContext } from '@sandnode/shared';
import type { VmServiceImplementation } from '@sandnode/shared/proto/vmm/v1/vmm';
import type { FreezeGate } from '../core/freeze-gate';
import type { Supervisor } from '../core/supervisor';
import { networkSlotToProto, vmNetworkToProto, vmSpecFromProto, vmToProto } from './convert';
import type { VmRecord } from '../core/types';
import { freezeEndToProto } from './freeze-port-service';

/** How many quarantined rows ListVms reports at most (the newest; keys cut to 128 and reasons to 600 characters), far below the 4 MiB message limit. */
export const MAX_LISTED_QUARANTINED = 1000;

/**
 * createVmService returns the VmService implementation backed by supervisor; FenceEpoch raises
 * fence (INVALID_ARGUMENT for epoch 0 or a metadata mismatch, ABORTED below the highest seen)
 * and, with require_freeze_arm, makes gate require arming from that epoch on. ArmFreeze /
 * DisarmFreeze act on gate (without one: FAILED_PRECONDITION, nothing to arm).
 */
export function createVmService(
  supervisor: Supervisor,
  fence: EpochFence,
  /** The VM-table rows set aside as unreadable (ListVms reports them); none when absent. */
  quarantined: () => { vmId: string; reason: string; quarantinedAtMs: number }[] = () => [],
  /** The freeze ports' gate (runc driver); undefined: no freeze port to arm. */
  gate?: FreezeGate,
  /** Node-wide network ports the supervisor's table redirects to (ListNetworkSlots). */
  netPorts: { dnsPort: number; egressProxyPort: number; proxiedPorts: number[]; alwaysDenied: string[] } = { dnsPort: 0, egressProxyPort: 0, proxiedPorts: [], alwaysDenied: [] },
): VmServiceImplementation<SandnodeCallContext> {
  const guestIf = supervisor.driverName === 'firecracker' ? 'tap0' : 'eth0';
  const out = (rec: VmRecord) => {
    const n = supervisor.networkOf(rec.vmId);
    return vmToProto(rec, n && vmNetworkToProto(n, guestIf));
  };
  return {
    async createVm(req, ctx) {
      ctx.log.debug({ vm_id: req.vmId }, 'CreateVm');
      return { vm: out(await supervisor.create(req.vmId, vmSpecFromProto(req.spec))) };
    },
    async getVm(req) {
      return { vm: out(await supervisor.get(req.vmId)) };
    },
    async listVms() {
      return {
        vms: (await supervisor.list()).map(out),
        quarantined: quarantined()
          .slice(-MAX_LISTED_QUARANTINED)
          .map((q) => ({ key: q.vmId.slice(0, 128), reason: q.reason.slice(0, 600), quarantinedAtMs: q.quarantinedAtMs })),
        fenceEpoch: Math.max(fence.current, readEpochFile(fence.epochFile)),
      };
    },
    async pauseVm(req) {
      return { vm: out(await supervisor.pause(req.vmId)) };
    },
    async resumeVm(req) {
      return { vm: out(await supervisor.resume(req.vmId)) };
    },
    async stopVm(req, ctx) {
      return { vm: out(await supervisor.stop(req.vmId, req.timeoutMs, ctx.signal)) };
    },
    async deleteVm(req) {
      return { existed: await supervisor.delete(req.vmId, req.keepNetwork) };
    },
    async fenceEpoch(req, ctx) {
      const before = fence.current;
      const epoch = fence.fenceEpoch(req.epoch, metadataEpoch(ctx.metadata));
      if (epoch !== before) ctx.log.info({ epoch, was: before }, 'FenceEpoch: epoch fence raised');
      if (req.requireFreezeArm && gate && !gate.required) ctx.log.info({ epoch }, 'FenceEpoch: the lease holder arms its freezes; unarmed freezes are refused from now on');
      if (req.requireFreezeArm) gate?.requireArming(epoch);
      return { epoch };
    },
    async armFreeze(req, ctx) {
      supervisor.requireArmable(req.vmId, gate !== undefined);
      const a = gate!.arm(req.vmId, req.windowMs);
      ctx.log.debug({ vm_id: req.vmId, window_ms: a.windowMs }, 'ArmFreeze');
      return { windowMs: a.windowMs, expiresAtUnixMs: Math.round(Date.now() + (a.expiresAtMs - performance.now())) };
    },
    async disarmFreeze(req) {
      requireResourceId('vm_id', req.vmId);
      return { wasArmed: gate?.disarm(req.vmId) ?? false };
    },
    async thawVmFreeze(req) {
      const r = await supervisor.thawFreeze(req.vmId, req.freezeToken);
      return { endedBy: freezeEndToProto(r.endedBy), frozenMs: r.frozenMs };
    },
    async getVmFreeze(req) {
      const s = await supervisor.freezeStatus(req.vmId);
      return {
        freezeToken: s.token,
        frozen: s.frozen,
        frozenAtUnixMs: s.frozenAtMs,
        endedAtUnixMs: s.frozen || !s.endedBy ? 0 : s.frozenAtMs + s.frozenMs,
        endedBy: freezeEndToProto(s.endedBy),
        maxFreezeMs: s.maxFreezeMs,
      };
    },

    async updateVmNetwork(req) {
      const n = await supervisor.updateNetwork(req.vmId, req.egress);
      return { network: vmNetworkToProto(n, guestIf) };
    },

    async listNetworkSlots() {
      const net = supervisor.net;
      const st = net?.status() ?? { enabled: false, disabledReason: 'network is not configured', pool: '', table: '', spareTarget: 0 };
      return {
        slots: (net?.slots() ?? []).map((r) => networkSlotToProto(r, net!.addresses(r.slot))),
        enabled: st.enabled,
        disabledReason: st.disabledReason,
        pool: st.pool,
        table: st.table,
        dnsPort: netPorts.dnsPort,
        egressProxyPort: netPorts.egressProxyPort,
        proxiedPorts: [...netPorts.proxiedPorts],
        alwaysDenied: [...netPorts.alwaysDenied],
        spareTarget: st.spareTarget,
        quarantined: (net?.quarantined() ?? []).slice(-MAX_LISTED_QUARANTINED).map((q) => ({ key: String(q.slot), reason: q.reason.slice(0, 600), quarantinedAtMs: q.quarantinedAtMs })),
      };
    },

    async releaseNetworkSlot(req) {
      if (!Number.isInteger(req.slot) || req.slot < 0) throw new InvalidArgumentError(`slot: ${req.slot} is not a slot number`);
      requireResourceId('owner', req.owner);
      const net = supervisor.net;
      if (!net) throw new FailedPreconditionError('network is not configured');
      return { released: await net.releaseReserved(req.slot, req.owner, (vmId) => supervisor.hasVm(vmId)) };
    },
  };
}
