/**
 * Domain types of the ublk-manager: devices as the manager records them and as the kernel
 * reports them. No proto imports here; `rpc/convert.ts` maps these to and from the contract.
 */

/** One KiB, MiB, GiB, TiB in bytes. */
export const KIB = 1024;
export const MIB = 1024 * KIB;
export const GIB = 1024 * MIB;
export const TIB = 1024 * GIB;

/** Sector size in bytes: every device size is a multiple of it. */
export const SECTOR_BYTES = 512;
/** Smallest empty device CreateDevice makes, in bytes (1 MiB). */
export const MIN_DEVICE_SIZE_BYTES = MIB;
/** Default largest device, in bytes (1 TiB); config key `maxDeviceSizeBytes`. */
export const DEFAULT_MAX_DEVICE_SIZE_BYTES = TIB;

/**
 * What an empty device is formatted with. `ext4` runs mkfs.ext4, `none` leaves zeroes.
 * `inherited` is recorded for clones: the manager did not format them, they carry whatever
 * the source image holds.
 */
export type FilesystemKind = 'ext4' | 'none' | 'inherited';

/**
 * Life of a row in the device table. `creating` is written before the image is made and
 * `deleting` before it is removed, so that a crash at any step leaves a row that the next
 * start cleans up. Only `ready` rows are devices that callers see. `released` means this slot
 * gave the device up during a handover (ReleaseDevice) and no longer owns it: the row keeps
 * the handover token until the new slot owns the device (then the row is dropped) or the
 * device comes back (AbortHandover, or the crash-convergence rule at start).
 */
export type RecordState = 'creating' | 'ready' | 'deleting' | 'released';

/**
 * Live state checked against the kernel: `attached` (a device node serves the image),
 * `detached` (the image exists, no device node), `missing` (the image file is gone).
 */
export type LiveState = 'attached' | 'detached' | 'missing';

/** Names of the backends. */
export type DriverName = 'loop' | 'ublk';

/** Device-handover capabilities a driver may have (kernel ublk feature flags). */
export type DriverCapability = 'quiesce' | 'user-recovery' | 'reissue';

/** A validated request to make a device (see `validateCreateInput`). */
export interface DeviceSpec {
  /** Caller-chosen id, RESOURCE_ID_RE. */
  deviceId: string;
  /** Size of an empty device in bytes; 0 for a clone (it gets the source's size). */
  sizeBytes: number;
  /** Absolute host path of the image to clone; '' for an empty device. */
  sourceImage: string;
  /** Filesystem of an empty device; 'inherited' for clones. */
  filesystem: FilesystemKind;
  /** Attach the device read-only. */
  readOnly: boolean;
}

/** A row of the device table. */
export interface DeviceRecord {
  deviceId: string;
  state: RecordState;
  /** Device size in bytes (for clones: the source's size at clone time). */
  sizeBytes: number;
  /** '' for an empty device. */
  sourceImage: string;
  filesystem: FilesystemKind;
  readOnly: boolean;
  /** Absolute path of the image file (`<imagesDir>/<id>.img`). */
  backingFile: string;
  /** Device node last seen attached ('' when none); the live state is always re-checked. */
  path: string;
  /** Unix epoch ms of creation. */
  createdAtMs: number;
  /** Unix epoch ms of the last change of the row. */
  updatedAtMs: number;
  /** Token of the last ReleaseDevice ('' when never released). */
  handoverToken: string;
  /** Id of the device this one is a CloneDevice clone of; '' otherwise. */
  clonedFrom: string;
  /**
   * Columns of the row this version does not know (a newer release's, e.g. a device role),
   * by column name, as read: written back as they are when the row is re-inserted.
   */
  extra?: Readonly<Record<string, unknown>>;
}

/** A device as reported to callers: the row plus its live state. */
export interface Device {
  deviceId: string;
  /** Device node, e.g. "/dev/loop3"; '' unless attached. */
  path: string;
  sizeBytes: number;
  backingFile: string;
  readOnly: boolean;
  filesystem: FilesystemKind;
  state: LiveState;
  driver: DriverName;
  /** Driver flags in effect, e.g. "direct-io". */
  flags: string[];
  createdAtMs: number;
  sourceImage: string;
  /** Id of the device this one is a CloneDevice clone of; '' otherwise. */
  clonedFrom: string;
}

/** What a driver reports about one attached device node. */
export interface AttachedDevice {
  /** Device node, e.g. "/dev/loop3". */
  path: string;
  /** Absolute path of the file behind it. */
  backingFile: string;
  readOnly: boolean;
  /** Driver flags in effect, e.g. "direct-io". */
  flags: string[];
}
