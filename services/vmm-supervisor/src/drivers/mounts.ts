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

/** mountPoints returns every mount point of this mount namespace (field 5 of mountinfo). */
export function mountPoints(): string[] {
  const text = readFileSync('/proc/self/mountinfo', 'utf8');
  const out: string[] = [];
  for (const line of text.split('\n')) {
    const f = line.split(' ');
    if (f[4]) out.push(unescapeMountinfo(f[4]));
  }
  return out;
}

/**
 * mountOptions returns the per-mount options (field 6 of mountinfo, e.g. ["rw", "noatime"]) of
 * the top mount at dir (absolute), or [] when dir is not a mount point.
 */
export function mountOptions(dir: string): string[] {
  const d = path.resolve(dir);
  let opts: string[] = [];
  for (const line of readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    const f = line.split(' ');
    if (f[4] && unescapeMountinfo(f[4]) === d) opts = (f[5] ?? '').split(',');
  }
  return opts;
}

/** isMountPoint says whether dir (absolute) is a mount point. */
export function isMountPoint(dir: string): boolean {
  const d = path.resolve(dir);
  return mountPoints().includes(d);
}

/** mountsUnder lists the mount points at or below dir. */
export function mountsUnder(dir: string): string[] {
  const d = path.resolve(dir);
  return mountPoints().filter((m) => m === d || m.startsWith(`${d}/`));
}

/** mount runs `mount -t type [-o options] source target`. */
export async function mount(source: string, target: string, type: string, options: string[] = []): Promise<void> {
  const args = ['-t', type];
  if (options.length) args.push('-o', options.join(','));
  await run('mount', [...args, source, target]);
}

/**
 * unmountIfMounted unmounts dir (every layer stacked on it) when it is a mount point, retrying
 * while the kernel says it is busy (umount2(2), never following a symlink at dir; each call
 * bounded by DEFAULT_COMMAND_TIMEOUT_MS, as the umount process it replaces). Throws
 * InternalError when it stays busy, fails (naming the errno) or the kernel does not answer.
 */
export async function unmountIfMounted(dir: string): Promise<void> {
  const d = path.resolve(dir);
  for (let attempt = 0; isMountPoint(d); attempt++) {
    const r = await umount2(d, UMOUNT_NOFOLLOW, DEFAULT_COMMAND_TIMEOUT_MS).catch((err: unknown) => {
      throw new InternalError((err as Error).message);
    });
    if (r.ok) continue;
    if (r.errno === ERRNO.EINVAL && !isMountPoint(d)) return; // unmounted meanwhile
    if (r.errno !== ERRNO.EBUSY) throw new InternalError(`umount ${d}: errno ${r.errno}${r.errno === ERRNO.EINVAL ? ' (EINVAL: not a mount point, or a symlink)' : ''}`);
    if (attempt >= DEFAULT_UMOUNT_RETRIES) throw new InternalError(`umount ${d}: still busy after ${DEFAULT_UMOUNT_RETRIES} tries`);
    await new Promise((r) => setTimeout(r, UMOUNT_RETRY_DELAY_MS));
  }
}

/**
 * unmountAllIfMounted unmounts the dirs that are mount points, one after the other in the order
 * given (a mount stacked on a later one first), each through {@link unmountIfMounted} (in-process,
 * with its retries). Throws InternalError when one stays mounted.
 */
export async function unmountAllIfMounted(dirs: string[]): Promise<void> {
  const mounted = new Set(mountPoints());
  for (const d of dirs.map((x) => path.resolve(x)).filter((x) => mounted.has(x))) await unmountIfMounted(d);
}
