/**
 * The two small tmpfs mounts of a runc VM on the host, under `<runDir>/vm-tmpfs/<vmId>/`:
 *
 *   guest/    the guest run dir, bind-mounted rw at /run/sandnode (size config `guestRunDirBytes`):
 *             what a sandbox writes there is memory charged to its own memory cgroup and stops
 *             at ENOSPC, never the host's disk. `<podd_socket_dir>/guest` is a symlink to it,
 *             for host readers (podd.log).
 *   console/  console.log, the stdout and stderr of runc and of the VM's init (size config
 *             `consoleLogBytes`; the supervisor keeps its tail, see console-log.ts).
 *
 * Both live as long as the VM: a supervisor restart leaves them mounted (adoption), destroy
 * unmounts them. They are outside `<vmDir>` so that a 0.2.0 supervisor (a rollback), whose
 * destroy refuses any mount below `<vmDir>` it does not know, can still delete the VM; it then
 * leaves these two mounted, until a create of the same id or `sandnode down --purge` removes
 * them.
 */
import { mkdirSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import path from 'node:path';
import { InternalError } from '@sandnode/shared';
import { mount, mountsUnderIn, mountTable, unmountChains, type MountTable } from './mounts';

/** Dir of the per-VM tmpfs dirs inside the supervisor's runDir. */
export const VM_TMPFS_DIR = 'vm-tmpfs';
/** The guest run dir's mount (bind-mounted at /run/sandnode). */
export const GUEST_TMPFS = 'guest';
/** The console log's mount. */
export const CONSOLE_TMPFS = 'console';
/** Default size of the guest run dir, in bytes (config `guestRunDirBytes`): 16 MiB. */
export const DEFAULT_GUEST_RUN_DIR_BYTES = 16 * 1024 * 1024;

/**
 * GuestRunDirOwner is who owns the root of the guest run dir, as host ids. The one place to
 * change when sandboxes get a user namespace: root inside is then a host uid of its range, and
 * the dir must be that uid's for podd (root inside) to write its log there.
 */
export interface GuestRunDirOwner {
  uid: number;
  gid: number;
  /** mode of the tmpfs root (octal, e.g. 0o755) */
  mode: number;
}

/** The owner of the guest run dir of a sandbox without a user namespace: host root, 0755. */
export const GUEST_RUN_DIR_OWNER: GuestRunDirOwner = { uid: 0, gid: 0, mode: 0o755 };

/**
 * guestTmpfsOptions are the mount options of a guest run dir of sizeBytes: size, owner and
 * mode, and no setuid binary, device node or executable from it (nosuid, nodev, noexec). Pure.
 */
export function guestTmpfsOptions(sizeBytes: number, owner: GuestRunDirOwner = GUEST_RUN_DIR_OWNER): string[] {
  return [`size=${sizeBytes}`, `mode=${owner.mode.toString(8).padStart(4, '0')}`, `uid=${owner.uid}`, `gid=${owner.gid}`, 'nosuid', 'nodev', 'noexec'];
}

/** consoleTmpfsOptions are the mount options of a console log mount of sizeBytes (host root only). Pure. */
export function consoleTmpfsOptions(sizeBytes: number): string[] {
  return [`size=${sizeBytes}`, 'mode=0700', 'uid=0', 'gid=0', 'nosuid', 'nodev', 'noexec'];
}

/** VmTmpfs are the host paths of a VM's two tmpfs mounts. */
export interface VmTmpfs {
  /** `<runDir>/vm-tmpfs/<vmId>` */
  dir: string;
  /** the guest run dir (mount point) */
  guest: string;
  /** the console log's dir (mount point) */
  console: string;
}

/** vmTmpfsPaths names the tmpfs mounts of vmId below runDir (nothing is touched). */
export function vmTmpfsPaths(runDir: string, vmId: string): VmTmpfs {
  const dir = path.join(path.resolve(runDir), VM_TMPFS_DIR, vmId);
  return { dir, guest: path.join(dir, GUEST_TMPFS), console: path.join(dir, CONSOLE_TMPFS) };
}

/**
 * mountVmTmpfs mounts fresh, empty tmpfs at t.guest (guestBytes, guestTmpfsOptions) and
 * t.console (consoleBytes); what an earlier VM of the same id left there is unmounted first.
 * Throws InternalError (mount failed); undo with {@link removeVmTmpfs}.
 */
export async function mountVmTmpfs(t: VmTmpfs, sizes: { guestBytes: number; consoleBytes: number }, owner: GuestRunDirOwner = GUEST_RUN_DIR_OWNER): Promise<void> {
  await removeVmTmpfs(t);
  mkdirSync(t.guest, { recursive: true, mode: 0o700 });
  mkdirSync(t.console, { recursive: true, mode: 0o700 });
  // two mount processes at once (a create waits for both)
  await Promise.all([mount('tmpfs', t.guest, 'tmpfs', guestTmpfsOptions(sizes.guestBytes, owner)), mount('tmpfs', t.console, 'tmpfs', consoleTmpfsOptions(sizes.consoleBytes))]);
}

/** vmTmpfsChains are t's two mounts as unmount chains of their own (neither lies on the other: see unmountChains). */
export function vmTmpfsChains(t: VmTmpfs): string[][] {
  return [[t.guest], [t.console]];
}

/**
 * removeVmTmpfsDir removes t.dir once its mounts are gone, after (a table read after the
 * unmounts) says no mount is left below it. Throws InternalError naming a mount that stays
 * (busy, or a mount below them that sandnode did not make); nothing is removed then.
 */
export async function removeVmTmpfsDir(t: VmTmpfs, after: MountTable): Promise<void> {
  const left = mountsUnderIn(after, t.dir);
  if (left.length) throw new InternalError(`mounts left under ${t.dir}: ${left.join(', ')}`);
  await rm(t.dir, { recursive: true, force: true });
}

/**
 * removeVmTmpfs unmounts both mounts (when mounted; at once) and removes t.dir: two mountinfo
 * reads. Idempotent. Throws InternalError when a mount stays (busy, or a mount below them that
 * sandnode did not make).
 */
export async function removeVmTmpfs(t: VmTmpfs): Promise<void> {
  await unmountChains(vmTmpfsChains(t), mountTable());
  await removeVmTmpfsDir(t, mountTable());
}
