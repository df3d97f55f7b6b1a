/**
 * Host mount helpers: mount and unmount in-process with mount(2) and umount2(2) (syscalls.ts: no
 * process start; a mount(8) run cost ~54 ms, the call ~0.4 ms), mount points read from
 * /proc/self/mountinfo.
 */
import { readFileSync } from 'node:fs';
import { constants } from 'node:os';
import path from 'node:path';
import { DEFAULT_COMMAND_TIMEOUT_MS, InternalError } from '@sandnode/shared';
import { ERRNO, mount2, umount2, UMOUNT_NOFOLLOW } from './syscalls';

/** How many times an EBUSY unmount is retried, and the pause between tries in ms. */
export const DEFAULT_UMOUNT_RETRIES = 20;
export const UMOUNT_RETRY_DELAY_MS = 100;

function unescapeMountinfo(s: string): string {
  return s.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));
}

let mountinfoReads = 0;

/** mountinfoReadCount is how many times this process read /proc/self/mountinfo (tests count a destroy's reads with it). */
export function mountinfoReadCount(): number {
  return mountinfoReads;
}

/**
 * MountTable is one read of mountinfo: each mount point of this mount namespace (absolute) and
 * how many mounts are stacked on it. Read once and handed to {@link unmountChains} and
 * {@link mountsUnderIn}, it spares a destroy a mountinfo read per check (a host with many
 * sandboxes has thousands of lines in it).
 */
export type MountTable = ReadonlyMap<string, number>;

/** mountTable reads mountinfo once (field 5 of each line, unescaped). */
export function mountTable(): MountTable {
  mountinfoReads++;
  const text = readFileSync('/proc/self/mountinfo', 'utf8');
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    const f = line.split(' ');
    if (f[4]) {
      const m = unescapeMountinfo(f[4]);
      out.set(m, (out.get(m) ?? 0) + 1);
    }
  }
  return out;
}

/** mountPoints returns every mount point of this mount namespace (field 5 of mountinfo). */
export function mountPoints(): string[] {
  return [...mountTable().keys()];
}

/**
 * mountOptions returns the per-mount options (field 6 of mountinfo, e.g. ["rw", "noatime"]) of
 * the top mount at dir (absolute), or [] when dir is not a mount point.
 */
export function mountOptions(dir: string): string[] {
  const d = path.resolve(dir);
  let opts: string[] = [];
  mountinfoReads++;
  for (const line of readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    const f = line.split(' ');
    if (f[4] && unescapeMountinfo(f[4]) === d) opts = (f[5] ?? '').split(',');
  }
  return opts;
}

/** isMountPoint says whether dir (absolute) is a mount point. */
export function isMountPoint(dir: string): boolean {
  return mountTable().has(path.resolve(dir));
}

/** mountsUnderIn lists the mount points of table at or below dir. Pure. */
export function mountsUnderIn(table: MountTable, dir: string): string[] {
  const d = path.resolve(dir);
  return [...table.keys()].filter((m) => m === d || m.startsWith(`${d}/`));
}

/** mountsUnder lists the mount points at or below dir. */
export function mountsUnder(dir: string): string[] {
  return mountsUnderIn(mountTable(), dir);
}

/**
 * The mount options mount(8) turns into mount(2) flags (util-linux libmount's table, the subset
 * with a flag of its own; `rw`, `suid`, `dev`, `exec`, `atime` clear theirs), as MS_* values.
 */
const MOUNT_FLAGS: Record<string, { set?: number; clear?: number }> = {
  ro: { set: 1 },
  rw: { clear: 1 },
  nosuid: { set: 2 },
  suid: { clear: 2 },
  nodev: { set: 4 },
  dev: { clear: 4 },
  noexec: { set: 8 },
  exec: { clear: 8 },
  sync: { set: 16 },
  async: { clear: 16 },
  dirsync: { set: 128 },
  nosymfollow: { set: 256 },
  noatime: { set: 1024 },
  atime: { clear: 1024 },
  nodiratime: { set: 2048 },
  diratime: { clear: 2048 },
  relatime: { set: 1 << 21 },
  norelatime: { clear: 1 << 21 },
  strictatime: { set: 1 << 24 },
  lazytime: { set: 1 << 25 },
  nolazytime: { clear: 1 << 25 },
};

/**
 * mountArgs splits options as mount(8) does: the ones of {@link MOUNT_FLAGS} become MS_* flags,
 * the rest (in order, e.g. `size=1m`, `lowerdir=...`) the filesystem's data string (null when
 * none). Pure.
 */
export function mountArgs(options: string[]): { flags: number; data: string | null } {
  let flags = 0;
  const data: string[] = [];
  for (const o of options) {
    const f = MOUNT_FLAGS[o];
    if (!f) data.push(o);
    else if (f.set) flags |= f.set;
    else flags &= ~(f.clear ?? 0);
  }
  return { flags, data: data.length ? data.join(',') : null };
}

/** errnoName is the symbolic name of errno (e.g. "ENOENT"; Node's table lacks ENOTBLK), or "errno N". */
function errnoName(errno: number): string {
  if (errno === 15) return 'ENOTBLK';
  return Object.entries(constants.errno).find(([, v]) => v === errno)?.[0] ?? `errno ${errno}`;
}

/**
 * mount mounts source (a block device, or "tmpfs" / "overlay") of type at target with options as
 * `mount -t type [-o options] source target` would (same flags and data, see {@link mountArgs}),
 * in-process with mount(2), bounded by DEFAULT_COMMAND_TIMEOUT_MS. Throws InternalError naming
 * the target and the errno (e.g. "ENOENT", "ENOTBLK", "ENODEV", "EINVAL") when the kernel
 * refuses, or when it does not answer in time.
 */
export async function mount(source: string, target: string, type: string, options: string[] = []): Promise<void> {
  const { flags, data } = mountArgs(options);
  const r = await mount2(source, target, type, flags, data, DEFAULT_COMMAND_TIMEOUT_MS).catch((err: unknown) => {
    throw new InternalError((err as Error).message);
  });
  if (!r.ok) throw new InternalError(`mount -t ${type} ${source} ${target}: ${errnoName(r.errno)}`);
}

/**
 * unmountLayers unmounts the top mount at d (absolute) `layers` times (the mounts a table said
 * are stacked there), in-process with umount2(2) (never following a symlink at d; each call
 * bounded by DEFAULT_COMMAND_TIMEOUT_MS, as the umount process it replaces), retrying while the
 * kernel says it is busy. mountinfo is read again only when the kernel says d is no mount point
 * (EINVAL: unmounted meanwhile, or a symlink). Throws InternalError when it stays busy, fails
 * (naming the errno) or the kernel does not answer.
 */
async function unmountLayers(d: string, layers: number): Promise<void> {
  for (let left = layers, busy = 0; left > 0;) {
    const r = await umount2(d, UMOUNT_NOFOLLOW, DEFAULT_COMMAND_TIMEOUT_MS).catch((err: unknown) => {
      throw new InternalError((err as Error).message);
    });
    if (r.ok) {
      left--;
      continue;
    }
    if (r.errno === ERRNO.EINVAL && !isMountPoint(d)) return; // unmounted meanwhile
    if (r.errno !== ERRNO.EBUSY) throw new InternalError(`umount ${d}: errno ${r.errno}${r.errno === ERRNO.EINVAL ? ' (EINVAL: not a mount point, or a symlink)' : ''}`);
    if (busy++ >= DEFAULT_UMOUNT_RETRIES) throw new InternalError(`umount ${d}: still busy after ${DEFAULT_UMOUNT_RETRIES} tries`);
    await new Promise((res) => setTimeout(res, UMOUNT_RETRY_DELAY_MS));
  }
}

/**
 * unmountChains unmounts the dirs of chains that table (one read of mountinfo by the caller)
 * says are mount points, every layer stacked on each: the chains at once, the dirs of one
 * chain one after the other in the order given (a mount that another one's filesystem lies on,
 * e.g. an overlay's upper dir, after it). Each dir through umount2(2) in-process, with its
 * retries (a busy mount of one chain holds only its chain). mountinfo is not read again (the
 * caller checks what is left with one read of its own). Waits for every chain, then throws the
 * first chain's InternalError (a mount that stays busy, an errno, no answer from the kernel).
 * Source of the idea: a drain's unmount flushes of one sandbox ran one after the other.
 */
export async function unmountChains(chains: string[][], table: MountTable): Promise<void> {
  const runs = chains.map(async (chain) => {
    for (const d of chain.map((x) => path.resolve(x))) await unmountLayers(d, table.get(d) ?? 0);
  });
  const failed = (await Promise.allSettled(runs)).find((r) => r.status === 'rejected');
  if (failed) throw failed.reason;
}

/**
 * unmountIfMounted unmounts dir (every layer stacked on it) when it is a mount point (see
 * {@link unmountChains}). Throws InternalError when it stays busy, fails (naming the errno) or
 * the kernel does not answer.
 */
export async function unmountIfMounted(dir: string): Promise<void> {
  await unmountAllIfMounted([dir]);
}

/**
 * unmountAllIfMounted unmounts the dirs that are mount points, one after the other in the order
 * given (a mount stacked on a later one first), every layer of each, after one read of
 * mountinfo (see {@link unmountChains}). Throws InternalError when one stays mounted.
 */
export async function unmountAllIfMounted(dirs: string[]): Promise<void> {
  await unmountChains([dirs], mountTable());
}
