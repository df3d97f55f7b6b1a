/**
 * System calls a VM create and stop make in-process instead of starting a host program for each
 * (a process start costs ~8 ms of CPU; a drain's stops were nearly all that, and a create's
 * mount(8) runs took ~54 ms each): mount(2), umount2(2) and the
 * pidfd calls pidfd_open(2) / pidfd_send_signal(2), through libc (glibc >= 2.36) and the FFI
 * library koffi. mount2 and umount2 can block for as long as the filesystem's journal replay or
 * flush takes, so they run on a worker thread (koffi's async call) raced against a timeout; the
 * pidfd calls never block.
 */
import type * as Koffi from 'koffi' with { 'resolution-mode': 'import' };

// koffi's typings are an ES module; its `require` entry (index.cjs) is the same API.
const koffi = require('koffi') as typeof Koffi;

/** umount2 flag: do not follow a symlink at the target's last component. */
export const UMOUNT_NOFOLLOW = 8;
/** errno values the callers tell apart. */
export const ERRNO = { ENOENT: 2, ESRCH: 3, EBUSY: 16, EINVAL: 22, ENOSYS: 38 } as const;

type AsyncFn<A extends unknown[]> = ((...a: A) => number) & { async: (...a: [...A, (err: unknown, res: number) => void]) => void };

interface Libc {
  mount: AsyncFn<[string, string, string, number, string | null]>;
  umount2: AsyncFn<[string, number]>;
  pidfdOpen?: (pid: number, flags: number) => number;
  pidfdSendSignal?: (pidfd: number, sig: number, info: null, flags: number) => number;
  close: (fd: number) => number;
}
let libc: Libc | undefined;

/** lib is libc's functions, loaded once; the pidfd ones are undefined on a libc without them. */
function lib(): Libc {
  if (libc) return libc;
  const l = koffi.load('libc.so.6');
  const optional = <T>(decl: string): T | undefined => {
    try {
      return l.func(decl) as unknown as T;
    } catch {
      return undefined;
    }
  };
  libc = {
    mount: l.func('int mount(const char *source, const char *target, const char *fstype, unsigned long flags, const char *data)') as unknown as Libc['mount'],
    umount2: l.func('int umount2(const char *target, int flags)') as unknown as Libc['umount2'],
    pidfdOpen: optional('int pidfd_open(int pid, unsigned int flags)'),
    pidfdSendSignal: optional('int pidfd_send_signal(int pidfd, int sig, void *info, unsigned int flags)'),
    close: l.func('int close(int fd)') as unknown as Libc['close'],
  };
  return libc;
}

/** SyscallResult: success, or the errno. */
export type SyscallResult = { ok: true } | { ok: false; errno: number };

/** SyscallTimeoutError: the kernel did not answer within the timeout (the call still runs on its thread). */
export class SyscallTimeoutError extends Error {}

/**
 * umount2 unmounts the top mount at target (absolute; flags: UMOUNT_NOFOLLOW and the like) on a
 * worker thread. Resolves with the result (errno EBUSY: in use; EINVAL: not a mount point);
 * rejects with SyscallTimeoutError after timeoutMs (the thread stays until the kernel returns).
 */
export function umount2(target: string, flags: number, timeoutMs: number): Promise<SyscallResult> {
  return onWorker(`umount ${target}`, timeoutMs, (done) => lib().umount2.async(target, flags, done));
}

/**
 * mount2 is mount(2): mounts source (a block device path, or a name such as "tmpfs" /
 * "overlay") of filesystem type fstype at target (absolute; the kernel resolves it as mount(8)
 * would, following symlinks) with the MS_* flags and the filesystem's data string (null: none),
 * on a worker thread. Resolves with the result (errno e.g. ENOENT: no target or source, ENOTBLK:
 * source is no block device, ENODEV: unknown type, EBUSY: already mounted, EINVAL: bad data);
 * rejects with SyscallTimeoutError after timeoutMs (the thread stays until the kernel returns).
 */
export function mount2(source: string, target: string, fstype: string, flags: number, data: string | null, timeoutMs: number): Promise<SyscallResult> {
  return onWorker(`mount ${target}`, timeoutMs, (done) => lib().mount.async(source, target, fstype, flags, data, done));
}

/** onWorker starts a koffi async call (start gets its callback) and settles with its result, or rejects after timeoutMs. */
function onWorker(what: string, timeoutMs: number, start: (done: (err: unknown, res: number) => void) => void): Promise<SyscallResult> {
  return new Promise<SyscallResult>((resolve, reject) => {
    let settled = false;
    const timer = setTimeout(() => {
      settled = true;
      reject(new SyscallTimeoutError(`${what}: no answer from the kernel within ${timeoutMs} ms`));
    }, timeoutMs);
    start((err, res) => {
      const errno = koffi.errno();
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve(err ? { ok: false, errno: -1 } : res === 0 ? { ok: true } : { ok: false, errno });
    });
  });
}

/** How {@link signalVerified} ended: signalled, or why not. */
export type SignalOutcome = 'signalled' | 'gone' | 'not-verified';

/**
 * signalVerified sends signal sig (a number, e.g. 9) to pid only if verify(pid) holds for the
 * process pid names once it is pinned: pidfd_open pins it (a pid reused after that point names
 * another process the pidfd does not), verify checks it (its start time, its cgroup), and
 * pidfd_send_signal signals exactly the pinned one. 'gone': no such process (ESRCH, at either
 * step); 'not-verified': verify said no, nothing was sent. On a libc or kernel without pidfd,
 * verify runs just before kill(2). Throws the errno of a failure other than ESRCH.
 */
export function signalVerified(pid: number, sig: number, verify: (pid: number) => boolean): SignalOutcome {
  const l = lib();
  const fd = l.pidfdOpen ? l.pidfdOpen(pid, 0) : -1;
  if (fd < 0) {
    const errno = l.pidfdOpen ? koffi.errno() : ERRNO.ENOSYS;
    if (errno === ERRNO.ESRCH) return 'gone';
    if (errno !== ERRNO.ENOSYS) throw new Error(`pidfd_open ${pid}: errno ${errno}`);
    if (!verify(pid)) return 'not-verified';
    try {
      process.kill(pid, sig);
      return 'signalled';
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ESRCH') return 'gone';
      throw err;
    }
  }
  try {
    if (!verify(pid)) return 'not-verified';
    if (l.pidfdSendSignal!(fd, sig, null, 0) === 0) return 'signalled';
    const errno = koffi.errno();
    if (errno === ERRNO.ESRCH) return 'gone';
    throw new Error(`pidfd_send_signal ${pid} ${sig}: errno ${errno}`);
  } finally {
    l.close(fd);
  }
}
