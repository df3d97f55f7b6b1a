/**
 * The supervisor's epoch fence: the shared {@link EpochFence} (the highest `sandnode-epoch`
 * seen, persisted in `<stateDir>/vmm-supervisor/epoch`; every mutating call is admitted by the
 * shared middleware, a stale one is ABORTED) plus VmService.FenceEpoch, the explicit
 * announcement of a new lease holder's epoch (feature "vmm.fence-epoch.v1").
 *
 * FenceEpoch checks its request before anything is persisted, so the middleware leaves that
 * one call to {@link VmmEpochFence.raise}: a FenceEpoch with a bad epoch changes nothing, and
 * one without metadata is judged by its request epoch, not as epoch 0.
 */
import { EpochFence, InvalidArgumentError } from '@sandnode/shared';

/** The gRPC path of VmService.FenceEpoch (checked against the generated definition in a test). */
export const FENCE_EPOCH_RPC = '/sandnode.vmm.v1.VmService/FenceEpoch';

/** VmmEpochFence is the EpochFence of the supervisor, with FenceEpoch admitted by its handler. */
export class VmmEpochFence extends EpochFence {
  /** admit (called by the shared middleware) admits epoch for every mutating rpc except FenceEpoch. */
  override admit(epoch: number, rpc: string): void {
    if (rpc === FENCE_EPOCH_RPC) return;
    super.admit(epoch, rpc);
  }

  /**
   * raise is FenceEpoch: epoch (>= 1) is persisted as the highest seen unless it is lower, and
   * the highest epoch seen afterwards is returned. metadataEpoch is the call's `sandnode-epoch`
   * (undefined when the call has none). Throws InvalidArgumentError (epoch 0 or not a safe
   * integer, or epoch != metadataEpoch) or AbortedError (epoch below the highest seen; the
   * message names both); either way nothing changed.
   */
  raise(epoch: number, metadataEpoch: number | undefined): number {
    if (!Number.isSafeInteger(epoch) || epoch < 1) throw new InvalidArgumentError(`epoch: ${epoch} is not an epoch (at least 1)`);
    if (metadataEpoch !== undefined && metadataEpoch !== epoch) {
      throw new InvalidArgumentError(`epoch: ${epoch} differs from the call's sandnode-epoch metadata ${metadataEpoch}`);
    }
    super.admit(epoch, FENCE_EPOCH_RPC);
    return this.current;
  }
}
