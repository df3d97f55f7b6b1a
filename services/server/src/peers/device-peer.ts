/**
 * DevicePeer: the DevicePort over gRPC to the ublk-manager (ublk.v1.DeviceService). Every
 * call has the deadline `timeoutMs` (config `peerCallTimeoutMs`), idempotent ones are retried
 * `retryAttempts` times on UNAVAILABLE (`peerRetryAttempts`), and errors are mapped
 * (peer-errors.ts: the manager's INTERNAL text stays in the server log).
 */
import {
  createSandnodeChannel,
  createServiceClient,
  isCode,
  PeerFeatures,
  requireReachable,
  Status,
  UBLK_FEATURES,
  UnavailableError,
  type Logger,
  type PeerConnect,
  type ServiceClient,
} from '@sandnode/shared';
import { DeviceServiceDefinition, DeviceState, Filesystem, type Device } from '@sandnode/shared/proto/ublk/v1/ublk';
import type { Channel, ClientError } from 'nice-grpc';
import { DEFAULT_PEER_CALL_TIMEOUT_MS, DEFAULT_PEER_RETRY_ATTEMPTS } from '../config';
import type { ClonedDevice, DeviceInfo, DevicePort, PeerVersion } from '../core/types';
import { announceEpoch, EPOCH_PROBE_ID } from './epoch-announce';
import { withMappedErrors } from './peer-errors';

/** How a server calls a peer daemon (vmm-supervisor, ublk-manager). */
export interface PeerOptions {
  /** the server's current epoch, sent as `sandnode-epoch` on every call (default 0) */
  epoch?: () => number;
  /** deadline of a unary call, ms (default DEFAULT_PEER_CALL_TIMEOUT_MS) */
  timeoutMs?: number;
  /** retries of an idempotent call on UNAVAILABLE (default DEFAULT_PEER_RETRY_ATTEMPTS) */
  retryAttempts?: number;
  /** where the text of a peer's INTERNAL/UNKNOWN errors goes */
  log?: Logger;
  /**
   * how long a call waits for a restarting peer, ms (config `peerConnectWaitMs`, default
   * DEFAULT_PEER_CONNECT_WAIT_MS; 0: no wait): within min(deadline, this) a call that never left
   * is sent again whatever its RPC, after it UNAVAILABLE names the peer (shared peer-connect.ts)
   */
  connectWaitMs?: number;
}

/** peerConnect is what a peer client waits for (shared PeerConnect). */
export function peerConnect(name: string, address: string, o: PeerOptions): PeerConnect {
  return { name, address, ...(o.connectWaitMs !== undefined ? { waitMs: o.connectWaitMs } : {}) };
}

function toInfo(d: Device | undefined): DeviceInfo {
  if (!d) throw new Error('ublk-manager answered without a device');
  return { deviceId: d.deviceId, path: d.path, backingFile: d.backingFile, sizeBytes: d.sizeBytes, attached: d.state === DeviceState.DEVICE_STATE_ATTACHED };
}

export class DevicePeer implements DevicePort {
  readonly channel: Channel;
  readonly client: ServiceClient<typeof DeviceServiceDefinition>;
  readonly features: PeerFeatures;
  private readonly log: Logger | undefined;
  private readonly peer: PeerConnect;

  /** address is "unix:///abs/ublk-manager.sock". */
  constructor(address: string, o: PeerOptions = {}) {
    this.channel = createSandnodeChannel(address);
    this.peer = peerConnect('ublk-manager', address, o);
    const client = createServiceClient(DeviceServiceDefinition, this.channel, {
      timeoutMs: o.timeoutMs ?? DEFAULT_PEER_CALL_TIMEOUT_MS,
      epoch: o.epoch ?? (() => 0),
      retryAttempts: o.retryAttempts ?? DEFAULT_PEER_RETRY_ATTEMPTS,
      peer: this.peer,
    });
    this.client = withMappedErrors(client, 'ublk-manager', o.log);
    this.log = o.log;
    this.features = new PeerFeatures(this.channel, 'ublk-manager', this.peer);
  }

  /** reachable waits up to connectWaitMs for the ublk-manager's channel; UNAVAILABLE naming it and its socket when it stays away. */
  reachable(signal?: AbortSignal): Promise<void> {
    return requireReachable(this.channel, this.peer, signal);
  }
  /**
   * fenceEpoch raises the ublk-manager's epoch fence to epoch and says how: DeviceService.FenceEpoch
   * when it lists "ublk.fence-epoch.v1" (asked afresh), else the 0.2.0 announcement, a
   * DeleteDevice of an id no sandbox can have. ABORTED when a higher epoch exists.
   */
  async fenceEpoch(epoch: number): Promise<string> {
    return announceEpoch(this.features, UBLK_FEATURES.fenceEpoch, () => this.client.fenceEpoch({ epoch }), {
      name: 'DeleteDevice',
      call: () => this.client.deleteDevice({ deviceId: EPOCH_PROBE_ID }),
    });
  }

  async createEmpty(deviceId: string, sizeBytes: number): Promise<DeviceInfo> {
    const res = await this.client.createDevice({ deviceId, sizeBytes, sourceImage: '', filesystem: Filesystem.FILESYSTEM_EXT4, readOnly: false });
    return toInfo(res.device);
  }

  /**
   * clone is CloneDevice (retried on UNAVAILABLE) with deadlineMs (ms from now; default the
   * call timeout). A ublk-manager that is gone (killed mid-clone, not restarted) is
   * UnavailableError (UNAVAILABLE) naming it and its socket when the connect wait ends, just
   * before the deadline; with the wait off (connectWaitMs 0) retries that meet the deadline are
   * UnavailableError too (the last error goes to the log). The deadline's DEADLINE_EXCEEDED
   * stays for a manager that got the call and answered nothing in time.
   */
  clone(deviceId: string, sourceId: string, sourceQuiesced: boolean, deadlineMs?: number): Promise<ClonedDevice> {
    return this.untilDeadline('CloneDevice', deviceId, deadlineMs, async (o) => {
      const res = await this.client.cloneDevice({ deviceId, sourceDeviceId: sourceId, sourceQuiesced, readOnly: false }, o);
      return { ...toInfo(res.device), cloneMs: res.cloneMs, reflinked: res.reflinked };
    });
  }

  /**
   * snapshot is SnapshotDevices (retried on UNAVAILABLE, all or nothing on the manager) with
   * deadlineMs, its errors as clone's; answers in item order, each device detached.
   */
  snapshot(items: { deviceId: string; sourceId: string }[], sourceQuiesced: boolean, deadlineMs?: number): Promise<ClonedDevice[]> {
    return this.untilDeadline('SnapshotDevices', items.map((i) => i.deviceId).join(','), deadlineMs, async (o) => {
      const res = await this.client.snapshotDevices({ items: items.map((i) => ({ deviceId: i.deviceId, sourceDeviceId: i.sourceId })), sourceQuiesced }, o);
      return res.snapshots.map((r) => ({ ...toInfo(r.device), cloneMs: r.cloneMs, reflinked: r.reflinked }));
    });
  }

  /**
   * untilDeadline runs call with deadlineMs (ms from now; default the call timeout); retries
   * that found the manager UNAVAILABLE until that deadline become UnavailableError naming rpc.
   */
  private async untilDeadline<T>(
    rpc: string,
    deviceId: string,
    deadlineMs: number | undefined,
    call: (o: { deadline?: number; onRetryableError: (err: ClientError) => void }) => Promise<T>,
  ): Promise<T> {
    let unavailable: ClientError | undefined;
    const onRetryableError = (err: ClientError) => void (unavailable = err.code === Status.UNAVAILABLE ? err : undefined);
    try {
      return await call({ ...(deadlineMs ? { deadline: deadlineMs } : {}), onRetryableError });
    } catch (err) {
      if (unavailable && isCode(err, Status.DEADLINE_EXCEEDED)) {
        // the last error's text is grpc-js's (socket paths): for the log, not for a public caller
        this.log?.warn({ err: unavailable, device_id: deviceId }, `${rpc}: ublk-manager unavailable until the deadline`);
        throw new UnavailableError(`ublk-manager ${rpc}: UNAVAILABLE until the deadline (the manager is gone or restarting; the server log has the last error)`);
      }
      throw err;
    }
  }

  async version(): Promise<PeerVersion> {
    this.features.reset();
    const v = await this.features.get();
    return { version: v.version, features: v.features };
  }

  async get(deviceId: string): Promise<DeviceInfo | undefined> {
    try {
      return toInfo((await this.client.getDevice({ deviceId })).device);
    } catch (err) {
      if (isCode(err, Status.NOT_FOUND)) return undefined;
      throw err;
    }
  }

  async list(): Promise<DeviceInfo[]> {
    return (await this.client.listDevices({})).devices.map(toInfo);
  }

  async delete(deviceId: string): Promise<void> {
    await this.client.deleteDevice({ deviceId });
  }

  close(): void {
    this.channel.close();
  }
}
