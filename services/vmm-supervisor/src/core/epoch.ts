/**
 * The supervisor's epoch fence is the shared EpochFence (the highest `sandnode-epoch` seen,
 * persisted in `<stateDir>/vmm-supervisor/epoch`; every mutating call is admitted by the shared
 * middleware, a stale one is ABORTED), with VmService.FenceEpoch handler-fenced: the explicit
 * announcement of a new lease holder's epoch (feature "vmm.fence-epoch.v1") is validated by
 * EpochFence.fenceEpoch before anything is persisted.
 */
import { EpochFence, serverLeasePath } from '@sandnode/shared';

/** The gRPC path of VmService.FenceEpoch (checked against the generated definition in a test). */
export const FENCE_EPOCH_RPC = '/sandnode.vmm.v1.VmService/FenceEpoch';

/**
 * vmmEpochFence is the supervisor's fence on dir, FenceEpoch admitted by its handler; with
 * stateDir, no epoch above the one the node's server lease (`<stateDir>/server.lease`) names
 * is accepted (FAILED_PRECONDITION, nothing changed).
 */
export function vmmEpochFence(dir: string, stateDir?: string): EpochFence {
  return new EpochFence(dir, { handlerFenced: [FENCE_EPOCH_RPC], ...(stateDir === undefined ? {} : { leaseFile: serverLeasePath(stateDir) }) });
}
