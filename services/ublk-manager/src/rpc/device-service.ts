/**
 * DeviceService handlers: thin. Map the request (convert.ts), call the DeviceManager, map
 * the result. Errors are the typed domain errors of core; the shared server middleware maps
 * them to gRPC status codes.
 */
import type { SandnodeCallContext } from '@sandnode/shared';
import type { DeviceServiceImplementation } from '@sandnode/shared/proto/ublk/v1/ublk';
import type { DeviceManager } from '../core/device-manager';
import { capabilitiesToPb, createInputFromPb, deviceToPb } from './convert';

/** deviceService implements sandnode.ublk.v1.DeviceService on a DeviceManager. */
export function deviceService(manager: DeviceManager): DeviceServiceImplementation<SandnodeCallContext> {
  return {
    async getCapabilities() {
      return capabilitiesToPb(manager.capabilities());
    },
    async createDevice(req) {
      return { device: deviceToPb(await manager.create(createInputFromPb(req))) };
    },
    async getDevice(req) {
      return { device: deviceToPb(await manager.get(req.deviceId)) };
    },
    async listDevices() {
      return { devices: (await manager.list()).map(deviceToPb) };
    },
    async deleteDevice(req) {
      return { existed: await manager.delete(req.deviceId) };
    },
  };
}
