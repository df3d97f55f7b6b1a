/**
 * grpcOldSlot: the OldSlot port of HandoverAll over gRPC (DeviceService of the old slot).
 * Every call carries the epoch of the HandoverAll call that started it (`sandnode-epoch`), so
 * the old slot fences it like any other call of the active server.
 */
import { Metadata } from 'nice-grpc-common';
import { createSandnodeChannel, createServiceClient, isCode, NotFoundError, PeerFeatures, Status } from '@sandnode/shared';
import { DeviceServiceDefinition } from '@sandnode/shared/proto/ublk/v1/ublk';
import type { OldSlot } from '../core/handover';
import { deviceFromPb } from './convert';

/** The feature an old slot must list for HandoverAll to call its handover RPCs. */
export const HANDOVER_FEATURE = 'ublk.handover.v1';

/**
 * Metadata of HandoverAll's ListDevices on the old slot: the slot taking the devices over.
 * The old slot is retiring from then on (see DeviceManager.beginRetiring); an older build
 * ignores it.
 */
export const HANDOVER_TO_METADATA_KEY = 'sandnode-handover-to';

/**
 * connectOldSlot opens a channel to address and checks that the peer lists HANDOVER_FEATURE
 * (FailedPreconditionError naming the peer, its version and the feature when it does not).
 * close() must be called when done.
 */
export async function connectOldSlot(address: string, epoch: number, selfSlot: string): Promise<OldSlot & { close(): void }> {
  const channel = createSandnodeChannel(address);
  try {
    await new PeerFeatures(channel, `ublk-manager at ${address}`).require(HANDOVER_FEATURE);
  } catch (err) {
    channel.close();
    throw err;
  }
  const c = createServiceClient(DeviceServiceDefinition, channel, { epoch: () => epoch, retryAttempts: 1 });
  return {
    async list(timeoutMs) {
      const metadata = Metadata({ [HANDOVER_TO_METADATA_KEY]: selfSlot });
      return (await c.listDevices({}, { deadline: timeoutMs, metadata })).devices.map(deviceFromPb);
    },
    async quiesce(deviceId, holdMs, timeoutMs) {
      try {
        await c.quiesceDevice({ deviceId, timeoutMs: holdMs }, { deadline: timeoutMs });
      } catch (err) {
        // NOT_FOUND: the device is gone (deleted on the old slot); HandoverAll skips it.
        if (isCode(err, Status.NOT_FOUND)) throw new NotFoundError((err as Error & { details?: string }).details ?? (err as Error).message);
        throw err;
      }
    },
    async resume(deviceId, timeoutMs) {
      await c.resumeDevice({ deviceId }, { deadline: timeoutMs });
    },
    async release(deviceId, timeoutMs) {
      const r = await c.releaseDevice({ deviceId }, { deadline: timeoutMs });
      return { device: deviceFromPb(r.device ?? ({} as never)), token: r.handoverToken };
    },
    async abort(deviceId, token, timeoutMs) {
      await c.abortHandover({ deviceId, handoverToken: token }, { deadline: timeoutMs });
    },
    close: () => channel.close(),
  };
}
