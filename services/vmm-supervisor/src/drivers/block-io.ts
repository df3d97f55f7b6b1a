/**
 * I/O limits of a runc VM's drives (issue 10 §2): the OCI spec's linux.resources.blockIO for
 * the block devices the server passed as the VM's drives (CreateVm spec drives[].path, host
 * paths the sandbox never names). Throttles (bytes/s, IOPS, per drive and direction) are what a
 * cgroup v1 blkio hierarchy offers for any block device; a proportional weight only where the
 * hierarchy has a weight file (CFQ's blkio.weight or BFQ's blkio.bfq.weight; loop devices use
 * the "none" scheduler, which has neither). runc 1.1 fails a start whose weight it cannot write,
 * so a weight the host does not offer is left out of the spec.
 */
import { existsSync, statSync } from 'node:fs';
import path from 'node:path';

/** The blkio hierarchy of cgroup v1 where runc puts a container's blkio cgroup. */
export const BLKIO_ROOT = '/sys/fs/cgroup/blkio';
/** Weight files of a blkio hierarchy that offers a proportional weight (CFQ, then BFQ). */
export const BLKIO_WEIGHT_FILES = ['blkio.weight', 'blkio.bfq.weight'];

/** IoLimits per drive of each VM; 0 = no limit (config keys ioReadBps, ioWriteBps, ioReadIops, ioWriteIops, ioWeight). */
export interface IoLimits {
  /** bytes/s read from each drive; 0 = no limit */
  readBps: number;
  /** bytes/s written to each drive; 0 = no limit */
  writeBps: number;
  /** read operations/s on each drive; 0 = no limit */
  readIops: number;
  /** write operations/s on each drive; 0 = no limit */
  writeIops: number;
  /** proportional weight 10..1000 of the VM's cgroup; 0 = none */
  weight: number;
}

/** A block device number. */
export interface BlockDevice {
  major: number;
  minor: number;
}

/** One OCI throttle entry (linux.resources.blockIO.throttle*Device[]). */
export interface ThrottleDevice extends BlockDevice {
  rate: number;
}

/** The OCI linux.resources.blockIO object this driver writes. */
export interface BlockIo {
  weight?: number;
  throttleReadBpsDevice?: ThrottleDevice[];
  throttleWriteBpsDevice?: ThrottleDevice[];
  throttleReadIOPSDevice?: ThrottleDevice[];
  throttleWriteIOPSDevice?: ThrottleDevice[];
}

/** hasThrottle says whether any of the per-drive throttles is set. */
export function hasThrottle(l: IoLimits): boolean {
  return l.readBps > 0 || l.writeBps > 0 || l.readIops > 0 || l.writeIops > 0;
}

/** blkioWeightOffered says whether the blkio hierarchy at root has a weight file (blkio.weight or blkio.bfq.weight). */
export function blkioWeightOffered(root: string = BLKIO_ROOT): boolean {
  return BLKIO_WEIGHT_FILES.some((f) => existsSync(path.join(root, f)));
}

/**
 * blockDeviceOf returns the device number of the block device at p, or undefined when p is not
 * a block device (a regular file, a dir) or does not exist. p is a host path the server chose
 * (a drive's loop device); it is stat'ed, never opened.
 */
export function blockDeviceOf(p: string): BlockDevice | undefined {
  let st;
  try {
    st = statSync(p, { bigint: true });
  } catch {
    return undefined;
  }
  if (!st.isBlockDevice()) return undefined;
  return splitDev(st.rdev);
}

/** splitDev splits a Linux dev_t (glibc's encoding: 12+20 bit major, 20+12 bit minor) into major and minor. */
export function splitDev(dev: bigint): BlockDevice {
  const major = ((dev >> 8n) & 0xfffn) | ((dev >> 32n) & ~0xfffn);
  const minor = (dev & 0xffn) | ((dev >> 12n) & ~0xffn);
  return { major: Number(major & 0xffffffffn), minor: Number(minor & 0xffffffffn) };
}

/**
 * blockIoSpec returns linux.resources.blockIO for devices under limits: one entry per device in
 * each throttle that is set, `weight` only when weightOffered; undefined when nothing applies
 * (no limit set, or only throttles and no device). Devices are deduplicated. Pure.
 */
export function blockIoSpec(limits: IoLimits, devices: readonly BlockDevice[], weightOffered: boolean): BlockIo | undefined {
  const seen = new Set<string>();
  const devs = devices.filter((d) => {
    const k = `${d.major}:${d.minor}`;
    if (seen.has(k)) return false;
    seen.add(k);
    return true;
  });
  const out: BlockIo = {};
  if (limits.weight > 0 && weightOffered) out.weight = limits.weight;
  const each = (rate: number): ThrottleDevice[] | undefined => (rate > 0 && devs.length > 0 ? devs.map((d) => ({ major: d.major, minor: d.minor, rate })) : undefined);
  const throttles: [keyof BlockIo, number][] = [
    ['throttleReadBpsDevice', limits.readBps],
    ['throttleWriteBpsDevice', limits.writeBps],
    ['throttleReadIOPSDevice', limits.readIops],
    ['throttleWriteIOPSDevice', limits.writeIops],
  ];
  for (const [key, rate] of throttles) {
    const list = each(rate);
    if (list) (out as Record<string, unknown>)[key] = list;
  }
  return Object.keys(out).length > 0 ? out : undefined;
}

/** ioLimitsInEffect says whether limits set anything a VM can get here: a throttle, or a weight the host offers. */
export function ioLimitsInEffect(limits: IoLimits | undefined, weightOffered: boolean): boolean {
  return limits !== undefined && (hasThrottle(limits) || (limits.weight > 0 && weightOffered));
}

/**
 * driveBlockIo returns the blockIO of a VM whose drives are at drivePaths (host paths from the
 * server's CreateVm spec): each path that is a block device gets the throttles, one that is not
 * gets none; undefined when nothing applies (see {@link blockIoSpec}).
 */
export function driveBlockIo(limits: IoLimits | undefined, drivePaths: readonly string[], weightOffered: boolean): BlockIo | undefined {
  if (!ioLimitsInEffect(limits, weightOffered)) return undefined;
  const devices = drivePaths.map(blockDeviceOf).filter((d): d is BlockDevice => d !== undefined);
  return blockIoSpec(limits!, devices, weightOffered);
}
