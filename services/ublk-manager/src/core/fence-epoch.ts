/**
 * FenceEpoch in domain terms: the explicit announcement of the active server's epoch (before
 * it, 0.2.0 servers announced it with a DeleteDevice of an unknown id). Validates the request
 * and raises the node's epoch fence (shared by both slots). No proto imports.
 */
import { InvalidArgumentError } from '@sandnode/shared';

/** The node's epoch fence as FenceEpoch needs it (store/shared-epoch-fence.ts). */
export interface EpochFencePort {
  /**
   * raise admits epoch: AbortedError (ABORTED, naming epoch and the highest) when it is lower
   * than the highest seen; a higher one is persisted (fsync) first. Returns the highest epoch
   * seen after the call.
   */
  raise(epoch: number, rpc: string): number;
}

/** A FenceEpoch request in domain terms. */
export interface FenceEpochInput {
  /** The epoch to raise the fence to (FenceEpochRequest.epoch). */
  epoch: number;
  /** The call's `sandnode-epoch` metadata; undefined when the call carries none. */
  metadataEpoch: number | undefined;
}

/**
 * fenceEpoch raises fence to input.epoch and returns the highest epoch seen after the call
 * (persisted before it returns). Errors (nothing changed): InvalidArgumentError (epoch 0 or
 * not a safe integer; epoch differs from the metadata epoch when that is present),
 * AbortedError (epoch lower than the highest seen; the message names both).
 */
export function fenceEpoch(fence: EpochFencePort, input: FenceEpochInput): number {
  const { epoch, metadataEpoch } = input;
  if (!Number.isSafeInteger(epoch) || epoch < 0) throw new InvalidArgumentError(`epoch: ${epoch} is not an epoch (1..${Number.MAX_SAFE_INTEGER})`);
  if (epoch === 0) throw new InvalidArgumentError('epoch: must be >= 1 (0 is "no epoch"); nothing changed');
  if (metadataEpoch !== undefined && metadataEpoch !== epoch) {
    throw new InvalidArgumentError(`epoch: ${epoch} differs from the call's sandnode-epoch metadata ${metadataEpoch}; nothing changed`);
  }
  return fence.raise(epoch, 'FenceEpoch');
}
