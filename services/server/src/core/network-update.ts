/**
 * UpdateSandboxNetwork: a networked sandbox's egress policy (and publicness) replaced live,
 * under the sandbox's lock and the handover gate like every other transition.
 */
import { FailedPreconditionError, requireSandboxId } from '@sandnode/shared';
import { failpoint } from '../handover/failpoints';
import type { CoreContext } from './context';
import { canonicalPolicy } from './network';
import type { EgressPolicyWire, SandboxRecord } from './types';

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
      if (rec.state !== 'DRAINED') {
        if (!c.vms.updateNetwork) throw new FailedPreconditionError(`sandbox ${id}: the vmm-supervisor cannot change a network`);
        await c.vms.updateNetwork(rec.vm?.vmId ?? id, egress);
        failpoint('network.after-vm-update');
      }
      n.egress = egress;
      if (args.public !== undefined) n.public = args.public;
      c.touch(rec);
      c.log.info({ sandbox_id: id, state: rec.state, public: n.public }, 'sandbox network updated');
      return rec;
    },
    signal,
  );
}
