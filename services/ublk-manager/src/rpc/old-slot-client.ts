/**
 * grpcOldSlot: the OldSlot port of HandoverAll over gRPC (DeviceService of the old slot).
 * Every call carries the epoch of the HandoverAll call that started it (`sandnode-epoch`), so
 * the old slot fences it like any other call of the active server.
 */
import { Metadata } from 'nice-grpc-common';
import { createSandnodeChannel, createServiceClient, FailedPreconditionError, isCode, NotFoundError, PeerFeatures, requireFeature, Status, UBLK_FEATURES } from '@sandnode/shared';
import { DeviceServiceDefinition } from '@sandnode/shared/proto/ublk/v1/ublk';
import type { OldSlot } from '../core/handover';
import { deviceFromPb } from './convert';

/** The feature an old slot must list for HandoverAll to call its handover RPCs. */
export const HANDOVER_FEATURE = UBLK_FEATURES.handover;

/**
 * Attempts of each call to the old slot: 1 (no retry). HandoverAll's steps are bounded by the
 * per-device deadline, and a failed step goes to the abort path instead: a retried
 * ReleaseDevice would hand out a second token.
 */
export const OLD_SLOT_CALL_ATTEMPTS = 1;

/**
 * Metadata of HandoverAll's ListDevices on the old slot: the slot taking the devices over.
 * The old slot is retiring from then on (see DeviceManager.beginRetiring); an older build
 * ignores it.
 */
export const HANDOVER_TO_METADATA_KEY = 'sandnode-handover-to';

/**
 * connectOldSlot opens a channel to address and checks that the peer lists HANDOVER_FEATURE
 * (FailedPreconditionError naming the peer, its version and the feature when it does not).
 * signal (the HandoverAll call's) cancels the feature check. close() must be called when done.
 */
export async function connectOldSlot(address: string, epoch: number, selfSlot: string, signal?: AbortSignal): Promise<OldSlot & { close(): void }> {
  const channel = createSandnodeChannel(address);
  try {
    signal?.throwIfAborted();
    const version = await new PeerFeatures(channel, `ublk-manager at ${address}`).get();
    requireFeature(version, HANDOVER_FEATURE, `HandoverAll from ublk-manager at ${address}`);
  } catch (err) {
    channel.close();
    throw err;
  }
  const c = createServiceClient(DeviceServiceDefinition, channel, { epoch: () => epoch, retryAttempts: OLD_SLOT_CALL_ATTEMPTS });
  return {
    async list(timeoutMs, signal) {
      const metadata = Metadata({ [HANDOVER_TO_METADATA_KEY]: selfSlot });
      return (await c.listDevices({}, { deadline: timeoutMs, metadata, signal })).devices.map(deviceFromPb);
    },
    async quiesce(deviceId, holdMs, timeoutMs, signal) {
      try {
        await c.quiesceDevice({ deviceId, timeoutMs: holdMs }, { deadline: timeoutMs, signal });
      } catch (err) {
        // NOT_FOUND: the device is gone (deleted on the old slot); HandoverAll skips it.
        if (isCode(err, Status.NOT_FOUND)) throw new NotFoundError((err as Error & { details?: string }).details ?? (err as Error).message);
        throw err;
      }
    },
    async resume(deviceId, timeoutMs) {
      await c.resumeDevice({ deviceId }, { deadline: timeoutMs });
    },
    async release(deviceId, timeoutMs, signal) {
      let r;
      try {
        r = await c.releaseDevice({ deviceId }, { deadline: timeoutMs, signal });
      } catch (err) {
        // FAILED_PRECONDITION: refused, nothing changed (e.g. not quiesced yet); HandoverAll may send it again.
        if (isCode(err, Status.FAILED_PRECONDITION)) throw new FailedPreconditionError((err as Error & { details?: string }).details ?? (err as Error).message);
        throw err;
      }
      return { device: deviceFromPb(r.device ?? ({} as never)), token: r.handoverToken };
    },
    async abort(deviceId, token, timeoutMs) {
      await c.abortHandover({ deviceId, handoverToken: token }, { deadline: timeoutMs });
    },
    close: () => channel.close(),
  };
}
