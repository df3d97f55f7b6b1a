/**
 * Validation of CreateDevice input. Every failure is an InvalidArgumentError (gRPC
 * INVALID_ARGUMENT) whose message names the field; nothing has been changed when it throws.
 * Checks that need the file system (does source_image exist?) are in the DeviceManager.
 */
import path from 'node:path';
import { InvalidArgumentError, requireResourceId } from '@sandnode/shared';
import { MIN_DEVICE_SIZE_BYTES, SECTOR_BYTES, type DeviceSpec, type FilesystemKind } from './types';

/** CreateDeviceInput is a CreateDevice request in domain terms, before validation. */
export interface CreateDeviceInput {
  deviceId: string;
  /** Size of an empty device in bytes; must be 0 when sourceImage is set. */
  sizeBytes: number;
  /** Absolute path of an image to clone, or ''. */
  sourceImage: string;
  /** Filesystem of an empty device: 'ext4' or 'none' (ignored for clones). */
  filesystem: 'ext4' | 'none';
  readOnly: boolean;
}

/** Limits that depend on config. */
export interface DeviceLimits {
  /** Largest device in bytes. */
  maxDeviceSizeBytes: number;
}

/** validateDeviceId checks a device id (RESOURCE_ID_RE) and names field in the error. */
export function validateDeviceId(deviceId: string, field = 'device_id'): string {
  return requireResourceId(field, deviceId);
}

/**
 * validateSize checks the size of an empty device: a multiple of 512 bytes, at least 1 MiB,
 * at most limits.maxDeviceSizeBytes. Throws InvalidArgumentError naming `size_bytes`.
 */
export function validateSize(sizeBytes: number, limits: DeviceLimits): void {
  if (!Number.isSafeInteger(sizeBytes) || sizeBytes <= 0) {
    throw new InvalidArgumentError(`size_bytes: must be set (> 0) for an empty device, got ${sizeBytes}`);
  }
  if (sizeBytes % SECTOR_BYTES !== 0) {
    throw new InvalidArgumentError(`size_bytes: ${sizeBytes} is not a multiple of ${SECTOR_BYTES}`);
  }
  if (sizeBytes < MIN_DEVICE_SIZE_BYTES) {
    throw new InvalidArgumentError(`size_bytes: ${sizeBytes} is below the minimum of ${MIN_DEVICE_SIZE_BYTES} (1 MiB)`);
  }
  if (sizeBytes > limits.maxDeviceSizeBytes) {
    throw new InvalidArgumentError(`size_bytes: ${sizeBytes} is above the maximum of ${limits.maxDeviceSizeBytes} (max_device_size_bytes)`);
  }
}

/**
 * validateCreateInput turns a CreateDevice input into a DeviceSpec: checks the id, that
 * exactly one of size_bytes / source_image is set, the size limits of an empty device and
 * that source_image is an absolute, normalised path. Throws InvalidArgumentError naming the
 * field. Clones get filesystem 'inherited' (the request's filesystem is ignored for them).
 */
export function validateCreateInput(input: CreateDeviceInput, limits: DeviceLimits): DeviceSpec {
  const deviceId = validateDeviceId(input.deviceId);
  if (input.sourceImage !== '') {
    if (input.sizeBytes !== 0) {
      throw new InvalidArgumentError(`size_bytes: must be 0 when source_image is set (a clone has the source's size), got ${input.sizeBytes}`);
    }
    if (input.sourceImage.includes('\0')) {
      throw new InvalidArgumentError('source_image: contains a NUL byte');
    }
    if (!path.isAbsolute(input.sourceImage)) {
      throw new InvalidArgumentError(`source_image: ${JSON.stringify(input.sourceImage)} is not an absolute path`);
    }
    return { deviceId, sizeBytes: 0, sourceImage: path.normalize(input.sourceImage), filesystem: 'inherited', readOnly: input.readOnly };
  }
  validateSize(input.sizeBytes, limits);
  const filesystem: FilesystemKind = input.filesystem;
  return { deviceId, sizeBytes: input.sizeBytes, sourceImage: '', filesystem, readOnly: input.readOnly };
}

/**
 * validateCloneSize checks the size of a source image: a multiple of 512 bytes, not empty,
 * at most the maximum. Throws InvalidArgumentError naming `source_image`.
 */
export function validateCloneSize(sourceImage: string, sizeBytes: number, limits: DeviceLimits): void {
  if (sizeBytes <= 0) throw new InvalidArgumentError(`source_image: ${sourceImage} is empty`);
  if (sizeBytes % SECTOR_BYTES !== 0) {
    throw new InvalidArgumentError(`source_image: ${sourceImage} is ${sizeBytes} bytes, not a multiple of ${SECTOR_BYTES}`);
  }
  if (sizeBytes > limits.maxDeviceSizeBytes) {
    throw new InvalidArgumentError(`source_image: ${sourceImage} is ${sizeBytes} bytes, above the maximum of ${limits.maxDeviceSizeBytes}`);
  }
}

/**
 * sameSpec says whether an existing row was made from spec (CreateDevice idempotency): for an
 * empty device size, filesystem and read_only must match; for a clone source and read_only. A
 * CloneDevice clone (clonedFrom set) never matches.
 */
export function sameSpec(existing: { sizeBytes: number; sourceImage: string; filesystem: FilesystemKind; readOnly: boolean; clonedFrom?: string }, spec: DeviceSpec): boolean {
  if ((existing.clonedFrom ?? '') !== '') return false; // a CloneDevice clone is never what CreateDevice asks for
  if (existing.readOnly !== spec.readOnly || existing.sourceImage !== spec.sourceImage) return false;
  if (spec.sourceImage !== '') return true;
  return existing.sizeBytes === spec.sizeBytes && existing.filesystem === spec.filesystem;
}

/** describeSpec renders the parts of a spec that idempotency compares, for error messages. */
export function describeSpec(s: { sizeBytes: number; sourceImage: string; filesystem: FilesystemKind; readOnly: boolean; clonedFrom?: string }): string {
  if (s.clonedFrom) return `a CloneDevice clone of "${s.clonedFrom}" read_only=${s.readOnly}`;
  const what = s.sourceImage !== '' ? `source_image=${s.sourceImage}` : `size_bytes=${s.sizeBytes} filesystem=${s.filesystem}`;
  return `${what} read_only=${s.readOnly}`;
}
