/**
 * DevicePeer: the DevicePort over gRPC to the ublk-manager (ublk.v1.DeviceService).
 */
import { createSandnodeChannel, createServiceClient, isCode, PeerFeatures, Status, type ServiceClient } from '@sandnode/shared';
import { DeviceServiceDefinition, DeviceState, Filesystem, type Device } from '@sandnode/shared/proto/ublk/v1/ublk';
import type { Channel } from 'nice-grpc';
import type { ClonedDevice, DeviceInfo, DevicePort, PeerVersion } from '../core/types';

function toInfo(d: Device | undefined): DeviceInfo {
  if (!d) throw new Error('ublk-manager answered without a device');
  return { deviceId: d.deviceId, path: d.path, backingFile: d.backingFile, sizeBytes: d.sizeBytes, attached: d.state === DeviceState.DEVICE_STATE_ATTACHED };
}

export class DevicePeer implements DevicePort {
  readonly channel: Channel;
  readonly client: ServiceClient<typeof DeviceServiceDefinition>;
  readonly features: PeerFeatures;

  /** address is "unix:///abs/ublk-manager.sock". */
  /** epoch is the server's current epoch, sent as `sandnode-epoch` on every call. */
  constructor(address: string, epoch: () => number = () => 0) {
    this.channel = createSandnodeChannel(address);
    this.client = createServiceClient(DeviceServiceDefinition, this.channel, { timeoutMs: 60_000, epoch, retryAttempts: 8 });
    this.features = new PeerFeatures(this.channel, 'ublk-manager');
  }

  async createEmpty(deviceId: string, sizeBytes: number): Promise<DeviceInfo> {
    const res = await this.client.createDevice({ deviceId, sizeBytes, sourceImage: '', filesystem: Filesystem.FILESYSTEM_EXT4, readOnly: false });
    return toInfo(res.device);
  }

  async clone(deviceId: string, sourceId: string, sourceQuiesced: boolean, deadlineMs?: number): Promise<ClonedDevice> {
    const res = await this.client.cloneDevice({ deviceId, sourceDeviceId: sourceId, sourceQuiesced, readOnly: false }, deadlineMs ? { deadline: deadlineMs } : {});
    return { ...toInfo(res.device), cloneMs: res.cloneMs, reflinked: res.reflinked };
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
