/**
 * How the server announces its epoch to a peer (vmm-supervisor, ublk-manager) when it becomes
 * active: the explicit FenceEpoch RPC when the peer lists its feature, else the 0.2.0 way, a
 * no-op delete of an id no sandbox can have, which carries `sandnode-epoch` like every
 * mutating call. The peer is asked for its features afresh: a restarted or rolled-back peer
 * may have others than the connection learned.
 */
import type { PeerFeatures } from '@sandnode/shared';

/** The VM and device id the 0.2.0 announcement deletes (a no-op: sandbox ids are sb-...). */
export const EPOCH_PROBE_ID = 'epoch-fence-probe';

/**
 * announceEpoch runs fence() when the peer lists feature, else legacy(); returns how it was
 * announced (for the log). Errors: the call's own (ABORTED when a higher epoch exists).
 */
export async function announceEpoch(features: PeerFeatures, feature: string, fence: () => Promise<unknown>, legacy: { name: string; call: () => Promise<unknown> }): Promise<string> {
  features.reset();
  if (await features.has(feature)) {
    await fence();
    return 'FenceEpoch';
  }
  await legacy.call();
  return `${legacy.name} of "${EPOCH_PROBE_ID}" (the peer lacks "${feature}")`;
}
