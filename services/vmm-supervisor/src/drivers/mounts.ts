/**
 * Host mount helpers: mount through the host command (run in a command helper, see
 * command-runner.ts), unmount in-process with umount2(2) (syscalls.ts: no process start), mount
 * points read from /proc/self/mountinfo.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { DEFAULT_COMMAND_TIMEOUT_MS, InternalError } from '@sandnode/shared';
import { runCommand as run } from './command-runner';
import { ERRNO, umount2, UMOUNT_NOFOLLOW } from './syscalls';

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

/** mount runs `mount -t type [-o options] source target`. */
export async function mount(source: string, target: string, type: string, options: string[] = []): Promise<void> {
  const args = ['-t', type];
  if (options.length) args.push('-o', options.join(','));
  await run('mount', [...args, source, target]);
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
