/**
 * The backend interfaces the DeviceManager drives: a BlockDriver turns image files into
 * device nodes (loop today, ublk later), ImageOps makes and removes the image files.
 */
import type { AttachedDevice, DriverCapability, DriverName } from './types';

/** Options of {@link BlockDriver.attach}. */
/** How busyReason words an exclusive claim with no mount or holder behind it (the loop driver's O_EXCL probe). */
export const EXCLUSIVE_USE = 'in exclusive use';

export interface AttachOptions {
  /** Attach read-only. */
  readOnly: boolean;
}

/** BlockDriver attaches image files as block devices and reports what the kernel has. */
export interface BlockDriver {
  /** The driver's name as reported by GetCapabilities and in Device.driver. */
  readonly name: DriverName;
  /** Device-handover capabilities on this kernel (none for loop). */
  capabilities(): DriverCapability[];
  /**
   * checkAvailable resolves when the driver can run on this host; otherwise it rejects with an
   * error whose message names what is missing (a device node, a command, a kernel module).
   */
  checkAvailable(): Promise<void>;
  /**
   * attach makes a device node for backingFile. Rejects with ResourceExhaustedError when no
   * device node is free, with a CommandError (INTERNAL) for other failures.
   */
  attach(backingFile: string, opts: AttachOptions): Promise<AttachedDevice>;
  /** detach removes the device node; a node that is already gone is not an error. */
  detach(path: string): Promise<void>;
  /**
   * listAttached returns every attached device whose backing file lies directly in dir (an
   * absolute, symlink-free path), ordered by device path. Devices backed elsewhere are never
   * reported, so the manager can never touch them.
   */
  listAttached(dir: string): Promise<AttachedDevice[]>;
  /**
   * lookup returns the device attached at devPath now (one device node read directly, no
   * scan), or undefined when devPath is not a device of this driver or is not bound. Optional:
   * without it the manager finds a device by scanning {@link listAttached}.
   */
  lookup?(devPath: string): Promise<AttachedDevice | undefined>;
  /**
   * busyReason says why the device node must not be detached now ("mounted at /mnt/x",
   * "held by dm-0", ...), or undefined when it is free.
   */
  busyReason(path: string): Promise<string | undefined>;
  /**
   * quiesce lets in-flight I/O of the device complete and makes what was written durable
   * (loop: fsync of the device node, then fdatasync of the backing image; ublk: the kernel QUIESCE
   * command where the kernel has it). Rejects with a CommandError (INTERNAL) when it fails.
   */
  quiesce(dev: AttachedDevice): Promise<void>;
  /** resume ends a quiesce (loop: nothing to do). */
  resume(dev: AttachedDevice): Promise<void>;
  /**
   * release stops this process from serving the device; the kernel device stays (loop: nothing
   * to do, the kernel serves I/O; ublk: the server of the device stops, the device waits in
   * recovery).
   */
  release(dev: AttachedDevice): Promise<void>;
  /**
   * recover takes over a device released by another slot and returns it as attached now.
   * Loop: verifies that dev.path is still attached to dev.backingFile (or finds where the
   * backing file is attached). ublk: runs user recovery. FailedPreconditionError when the
   * device is not attached / not in recovery.
   */
  recover(dev: AttachedDevice): Promise<AttachedDevice>;
}

/** What {@link ImageOps.inspectSource} learns about an image to clone. */
export interface SourceImageInfo {
  /** Size in bytes. */
  sizeBytes: number;
}

/** What {@link ImageOps.clone} did. */
export interface CloneResult {
  /**
   * True when the clone shares the source's extents: `cp --reflink=always` (the FICLONE ioctl,
   * ioctl_ficlone(2)) succeeded. False when the data was copied (the file system of the images
   * dir has no reflink, e.g. ext4: cp(1) then copies the allocated ranges, holes stay holes).
   */
  reflinked: boolean;
  /** Why the data was copied rather than shared ('' when reflinked), e.g. "the images file system has no reflink (FICLONE: EOPNOTSUPP)". */
  copyReason: string;
  /** Time cp(1) took, in ms (performance.now()): the window in which the source is read. */
  copyMs: number;
  /** Time the fsync of the copy, the rename and the directory fsync took, in ms. */
  syncMs: number;
  /** Allocated bytes of the source image before the copy (st_blocks * 512). */
  sourceAllocatedBytes: number;
}

/** ImageOps makes, clones and removes the image files behind devices. */
export interface ImageOps {
  /** The images directory (absolute, symlinks resolved). */
  readonly dir: string;
  /** imagePath is `<dir>/<deviceId>.img`. */
  imagePath(deviceId: string): string;
  /** exists says whether the file exists. */
  exists(file: string): Promise<boolean>;
  /**
   * inspectSource checks an image to clone: NotFoundError when it does not exist,
   * InvalidArgumentError naming source_image when it is not a regular file.
   */
  inspectSource(file: string): Promise<SourceImageInfo>;
  /** createEmpty makes a sparse file of sizeBytes (must not exist yet) and fsyncs it. */
  createEmpty(file: string, sizeBytes: number): Promise<void>;
  /** formatExt4 runs mkfs.ext4 on the file. */
  formatExt4(file: string): Promise<void>;
  /**
   * clone copies src to dst (must not exist) copy-on-write where the file system can
   * (FICLONE), else sparse (holes stay holes): the copy is written to
   * a temp name in dst's dir (`.<name>.clone-<hex>.tmp`), fsynced, renamed to dst and the
   * directory fsynced, so dst never exists half-written. src is only read (never fsynced). On failure the temp file is
   * removed; ResourceExhaustedError when the disk is full. opts.signal (the caller's) cancels
   * the copy (the copy command is killed, the temp file removed).
   */
  clone(src: string, dst: string, opts?: { signal?: AbortSignal; confined?: boolean }): Promise<CloneResult>;
  /**
   * createExt4 makes file (must not exist) an empty ext4 image of sizeBytes: a FICLONE of the
   * pre-formatted empty image of that size where the images file system has reflink, else
   * (or when that fails) a sparse file formatted by mkfs.ext4. Returns how ("template" or
   * "mkfs") and, for mkfs, why. Optional: without it the manager runs createEmpty + formatExt4.
   */
  createExt4?(file: string, sizeBytes: number): Promise<{ method: 'template' | 'mkfs'; reason: string }>;
  /**
   * cloneTemps lists the temp files of clones in the images dir (left by a crash mid-clone,
   * or written right now by a running clone) with the image each was going to become.
   */
  cloneTemps(): Promise<{ file: string; target: string }[]>;
  /** remove deletes the file; resolves false when it did not exist. */
  remove(file: string): Promise<boolean>;
}
