/**
 * UpdateSandboxNetwork: a networked sandbox's egress policy (and publicness) replaced live,
 * under the sandbox's lock and the handover gate like every other transition.
 */
import { Status } from 'nice-grpc-common';
import { FailedPreconditionError, requireSandboxId } from '@sandnode/shared';
import { failpoint } from '../handover/failpoints';
import type { CoreContext } from './context';
import { canonicalPolicy, checkAllowsReachable, nodeNetwork } from './network';
import type { EgressPolicyWire, SandboxRecord } from './types';

/** Codes after which the supervisor surely did not change the policy (it refused before storing). */
const DEFINITE = new Set<number>([Status.INVALID_ARGUMENT, Status.NOT_FOUND, Status.FAILED_PRECONDITION, Status.ABORTED, Status.UNIMPLEMENTED, Status.PERMISSION_DENIED, Status.UNAUTHENTICATED]);

export interface UpdateNetworkArgs {
  sandboxId: string;
  egress: EgressPolicyWire | undefined;
  /** undefined: unchanged */
  public?: boolean;
}

/**
 * updateNetwork replaces a networked sandbox's egress policy (and, when given, whether its
 * ingress is public): a RUNNING or PAUSED one's VM first (vmm UpdateVmNetwork, carrying the
 * epoch: a server that lost the lease changes nothing), then the record, then the directory
 * (touch); a DRAINED one's record only (its resume applies it). Idempotent. signal stops the
 * wait to enter the handover gate. Errors: INVALID_ARGUMENT (bad id or policy; nothing
 * changed), NOT_FOUND, FAILED_PRECONDITION (no network, another state, a supervisor without
 * network), and the supervisor's (the record is unchanged).
 */
export async function updateNetwork(c: CoreContext, args: UpdateNetworkArgs, signal?: AbortSignal): Promise<SandboxRecord> {
  requireSandboxId('sandbox_id', args.sandboxId);
  const egress = canonicalPolicy(args.egress, 'egress');
  const id = args.sandboxId;
  c.get(id);
  return c.gated(
    id,
    async () => {
      const rec = c.requireState(id, 'UpdateSandboxNetwork');
      const n = rec.network;
      if (!n) throw new FailedPreconditionError(`sandbox ${id} has no network (created with network disabled, on a node without network, or by an older server)`);
      if (egress.allowOut.length > 0) {
        const node = await nodeNetwork(c.vms);
        if (node.available) checkAllowsReachable(egress, node.alwaysDenied, 'egress');
      }
      if (rec.state !== 'DRAINED') await setVmEgress(c, rec, egress);
      n.egress = egress;
      if (args.public !== undefined) n.public = args.public;
      c.touch(rec);
      c.log.info({ sandbox_id: id, state: rec.state, public: n.public }, 'sandbox network updated');
      return rec;
    },
    signal,
  );
}

/**
 * setVmEgress replaces the egress policy of rec's VM (vmm UpdateVmNetwork, epoch-fenced); the
 * caller holds the sandbox's lock and updates the record after. A call without a definite
 * answer puts the sandbox in c.unsurePolicies (the reaper sets the record's policy back).
 * Errors: FAILED_PRECONDITION (a supervisor without network), the supervisor's.
 */
export async function setVmEgress(c: CoreContext, rec: SandboxRecord, egress: EgressPolicyWire): Promise<void> {
  const id = rec.sandboxId;
  if (!c.vms.updateNetwork) throw new FailedPreconditionError(`sandbox ${id}: the vmm-supervisor cannot change a network`);
  try {
    await c.vms.updateNetwork(rec.vm?.vmId ?? id, egress);
  } catch (err) {
    // no definite answer: the supervisor may have stored (and, after a restart, applied) the
    // new policy while the record keeps the old one; the reaper sets the record's back
    if (!DEFINITE.has((err as { code?: number }).code ?? -1)) c.unsurePolicies.add(id);
    throw err;
  }
  c.unsurePolicies.delete(id);
  failpoint('network.after-vm-update');
}

/**
 * reapplyPolicies sets the record's egress policy on the VM of every sandbox in
 * c.unsurePolicies (an UpdateVmNetwork without a definite answer), under the sandbox's lock;
 * one that succeeds (or no longer needs it: deleted, drained, without network) leaves the set,
 * one that fails stays for the next round. Returns the ids set back.
 */
export async function reapplyPolicies(c: CoreContext): Promise<string[]> {
  const done: string[] = [];
  for (const id of [...c.unsurePolicies]) {
    if (c.locks.busy(id)) continue;
    await c.locks.run(id, async () => {
      const rec = c.store.get(id);
      if (!rec?.network || !rec.vm || rec.state === 'DRAINED' || rec.state === 'DELETING' || !c.vms.updateNetwork) {
        c.unsurePolicies.delete(id);
        return;
      }
      try {
        await c.vms.updateNetwork(rec.vm.vmId, rec.network.egress);
        c.unsurePolicies.delete(id);
        done.push(id);
        c.log.warn({ sandbox_id: id }, 'egress policy set back to the record after an UpdateVmNetwork without an answer');
      } catch (err) {
        c.log.debug({ sandbox_id: id, err }, 'egress policy not set back yet');
      }
    });
  }
  return done;
}
