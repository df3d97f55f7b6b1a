/**
 * Conversions between the sandnode.ublk.v1 contract and the domain types, in one place.
 * An unknown enum value in a request is an InvalidArgumentError naming the field.
 */
import { InvalidArgumentError } from '@sandnode/shared';
import {
  Capability,
  DeviceState,
  Filesystem,
  HandoverResult,
  type DeviceHandover,
  type CloneDeviceRequest,
  type CloneDeviceResponse,
  type CreateDeviceRequest,
  type Device as PbDevice,
  type GetCapabilitiesResponse,
} from '@sandnode/shared/proto/ublk/v1/ublk';
import type { CloneInput, CloneOutcome, ManagerCapabilities } from '../core/device-manager';
import type { DeviceHandoverResult } from '../core/handover';
import type { Device, DriverCapability, FilesystemKind, LiveState } from '../core/types';
import type { CreateDeviceInput } from '../core/validate';

/** filesystemFromPb: UNSPECIFIED and EXT4 -> 'ext4', NONE -> 'none'; other -> INVALID_ARGUMENT. */
export function filesystemFromPb(fs: Filesystem): 'ext4' | 'none' {
  switch (fs) {
    case Filesystem.FILESYSTEM_UNSPECIFIED:
    case Filesystem.FILESYSTEM_EXT4:
      return 'ext4';
    case Filesystem.FILESYSTEM_NONE:
      return 'none';
    default:
      throw new InvalidArgumentError(`filesystem: unknown value ${String(fs)}`);
  }
}

/** filesystemToPb: 'inherited' (clones) -> UNSPECIFIED. */
export function filesystemToPb(fs: FilesystemKind): Filesystem {
  switch (fs) {
    case 'ext4':
      return Filesystem.FILESYSTEM_EXT4;
    case 'none':
      return Filesystem.FILESYSTEM_NONE;
    default:
      return Filesystem.FILESYSTEM_UNSPECIFIED;
  }
}

/** stateToPb: 'missing' (image gone) -> UNSPECIFIED. */
export function stateToPb(s: LiveState): DeviceState {
  switch (s) {
    case 'attached':
      return DeviceState.DEVICE_STATE_ATTACHED;
    case 'detached':
      return DeviceState.DEVICE_STATE_DETACHED;
    default:
      return DeviceState.DEVICE_STATE_UNSPECIFIED;
  }
}

const CAPABILITIES: Record<DriverCapability, Capability> = {
  quiesce: Capability.CAPABILITY_QUIESCE,
  'user-recovery': Capability.CAPABILITY_USER_RECOVERY,
  reissue: Capability.CAPABILITY_REISSUE,
};

/** createInputFromPb maps a CreateDeviceRequest to the domain input (validated by core). */
export function createInputFromPb(req: CreateDeviceRequest): CreateDeviceInput {
  return {
    deviceId: req.deviceId,
    sizeBytes: req.sizeBytes,
    sourceImage: req.sourceImage,
    filesystem: filesystemFromPb(req.filesystem),
    readOnly: req.readOnly,
  };
}

/** cloneInputFromPb maps a CloneDeviceRequest to the domain input (validated by core). */
export function cloneInputFromPb(req: CloneDeviceRequest): CloneInput {
  return { deviceId: req.deviceId, sourceDeviceId: req.sourceDeviceId, sourceQuiesced: req.sourceQuiesced, readOnly: req.readOnly };
}

/**
 * cloneToPb maps a clone outcome to CloneDeviceResponse: clone_ms is the copy time rounded up
 * to whole ms (a copy that happened is never reported as 0; an existing clone is 0).
 */
export function cloneToPb(r: CloneOutcome): CloneDeviceResponse {
  return {
    device: deviceToPb(r.device),
    cloneMs: r.created ? Math.max(1, Math.ceil(r.cloneMs)) : 0,
    reflinked: r.reflinked,
    copiedBytes: r.copiedBytes,
    cloneMethod: r.cloneMethod,
    copyReason: r.copyReason,
  };
}

/** deviceToPb maps a domain Device to the contract's Device. */
export function deviceToPb(d: Device): PbDevice {
  return {
    deviceId: d.deviceId,
    path: d.path,
    sizeBytes: d.sizeBytes,
    backingFile: d.backingFile,
    readOnly: d.readOnly,
    filesystem: filesystemToPb(d.filesystem),
    state: stateToPb(d.state),
    driver: d.driver,
    flags: [...d.flags],
    createdAtMs: d.createdAtMs,
    sourceImage: d.sourceImage,
    clonedFrom: d.clonedFrom,
  };
}

/** capabilitiesToPb maps the manager's capabilities to GetCapabilitiesResponse. */
export function capabilitiesToPb(c: ManagerCapabilities): GetCapabilitiesResponse {
  return { driver: c.driver, capabilities: c.capabilities.map((x) => CAPABILITIES[x]), maxDeviceSizeBytes: c.maxDeviceSizeBytes };
}

/** deviceFromPb maps a contract Device back to the domain (RecoverDevice, HandoverAll). */
export function deviceFromPb(d: PbDevice): Device {
  const fs: FilesystemKind = d.filesystem === Filesystem.FILESYSTEM_EXT4 ? 'ext4' : d.filesystem === Filesystem.FILESYSTEM_NONE ? 'none' : 'inherited';
  const state: LiveState = d.state === DeviceState.DEVICE_STATE_ATTACHED ? 'attached' : d.state === DeviceState.DEVICE_STATE_DETACHED ? 'detached' : 'missing';
  return {
    deviceId: d.deviceId ?? '',
    path: d.path ?? '',
    sizeBytes: d.sizeBytes ?? 0,
    backingFile: d.backingFile ?? '',
    readOnly: d.readOnly ?? false,
    filesystem: fs,
    state,
    driver: d.driver === 'ublk' ? 'ublk' : 'loop',
    flags: [...(d.flags ?? [])],
    createdAtMs: d.createdAtMs ?? 0,
    sourceImage: d.sourceImage ?? '',
    clonedFrom: d.clonedFrom ?? '',
  };
}

const RESULTS: Record<DeviceHandoverResult['result'], HandoverResult> = {
  moved: HandoverResult.HANDOVER_RESULT_MOVED,
  aborted: HandoverResult.HANDOVER_RESULT_ABORTED,
  failed: HandoverResult.HANDOVER_RESULT_FAILED,
};

/** handoverToPb maps one device's handover result. */
export function handoverToPb(r: DeviceHandoverResult): DeviceHandover {
  return { deviceId: r.deviceId, result: RESULTS[r.result], stallMs: r.stallMs, error: r.error };
}
