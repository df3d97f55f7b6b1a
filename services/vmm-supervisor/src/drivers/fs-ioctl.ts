/**
 * FIFREEZE / FITHAW of one mounted filesystem, in-process (Linux
 * Documentation/filesystems/vfs.rst freeze_fs/unfreeze_fs; the calls util-linux fsfreeze(8)
 * makes): ioctl(2) on an O_RDONLY fd of the mount point, through the FFI library koffi. No
 * host process is started. FIFREEZE syncs the filesystem first and can block for as long as
 * its device takes, so both calls run on a worker thread (koffi's async call) and are raced
 * against a timeout: the event loop never waits for the kernel. A call that times out keeps
 * its thread until the kernel returns; a FIFREEZE that succeeds after its caller gave up is
 * thawed at once.
 */
import { closeSync, constants, openSync } from 'node:fs';
import type * as Koffi from 'koffi' with { 'resolution-mode': 'import' };

// koffi's typings are an ES module; its `require` entry (index.cjs) is the same API.
const koffi = require('koffi') as typeof Koffi;

/** _IOWR('X', 119, int): freeze a filesystem (linux/fs.h). */
export const FIFREEZE = 0xc0045877;
/** _IOWR('X', 120, int): thaw it. */
export const FITHAW = 0xc0045878;
/** errno of FITHAW on a filesystem that is not frozen, and of FIFREEZE on a non-freezable one. */
export const EINVAL = 22;
/** errno of FIFREEZE on a filesystem that is frozen already. */
export const EBUSY = 16;

type IoctlFn = ((fd: number, req: number, arg: null) => number) & {
  async: (fd: number, req: number, arg: null, cb: (err: unknown, res: number) => void) => void;
};
let ioctlFn: IoctlFn | undefined;

/** ioctl is libc's ioctl(2), loaded once. */
function ioctl(): IoctlFn {
  ioctlFn ??= koffi.load('libc.so.6').func('int ioctl(int fd, unsigned long req, void *arg)') as unknown as IoctlFn;
  return ioctlFn;
}

type SyncfsFn = ((fd: number) => number) & { async: (fd: number, cb: (err: unknown, res: number) => void) => void };
let syncfsFn: SyncfsFn | undefined;

/** syncfsCall is libc's syncfs(2), loaded once. */
function syncfsCall(): SyncfsFn {
  syncfsFn ??= koffi.load('libc.so.6').func('int syncfs(int fd)') as unknown as SyncfsFn;
  return syncfsFn;
}

/**
 * fsSyncfs runs syncfs(2) on the filesystem of mountPoint on a worker thread (writes its dirty
 * data and commits its journal, without freezing anything) and resolves with its result, or
 * with `{ ok: false, errno: -1 }` after timeoutMs
 * (the call keeps its thread until the kernel returns). Rejects with the open(2) error.
 */
export function fsSyncfs(mountPoint: string, timeoutMs: number): Promise<IoctlResult> {
  const fd = openSync(mountPoint, constants.O_RDONLY | constants.O_DIRECTORY);
  return new Promise<IoctlResult>((resolve) => {
    let settled = false;
    const timer = setTimeout(() => {
      settled = true;
      resolve({ ok: false, errno: -1 });
    }, timeoutMs);
    syncfsCall().async(fd, (err, res) => {
      const errno = koffi.errno();
      closeSync(fd);
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve(err ? { ok: false, errno: -1 } : res === 0 ? { ok: true } : { ok: false, errno });
    });
  });
}

/** IoctlResult: 0 on success, else the errno. */
export type IoctlResult = { ok: true } | { ok: false; errno: number };

/** IoctlTimeoutError: the kernel did not answer within the timeout (the call still runs on its thread). */
export class IoctlTimeoutError extends Error {}

/**
 * fsIoctl runs ioctl(fd of mountPoint, req) on a worker thread and resolves with its result;
 * rejects with IoctlTimeoutError after timeoutMs (late: called with the result when the call
 * returns after all), or with the open(2) error.
 */
export function fsIoctl(mountPoint: string, req: number, timeoutMs: number, late?: (r: IoctlResult) => void): Promise<IoctlResult> {
  const fd = openSync(mountPoint, constants.O_RDONLY | constants.O_DIRECTORY);
  return new Promise<IoctlResult>((resolve, reject) => {
    let settled = false;
    const timer = setTimeout(() => {
      settled = true;
      reject(new IoctlTimeoutError(`ioctl 0x${req.toString(16)} on ${mountPoint}: no answer from the kernel within ${timeoutMs} ms`));
    }, timeoutMs);
    ioctl().async(fd, req, null, (err, res) => {
      const errno = koffi.errno();
      closeSync(fd);
      const r: IoctlResult = err ? { ok: false, errno: -1 } : res === 0 ? { ok: true } : { ok: false, errno };
      if (settled) {
        late?.(r);
        return;
      }
      settled = true;
      clearTimeout(timer);
      resolve(r);
    });
  });
}

/**
 * fsIoctlSync runs ioctl(fd of mountPoint, req) on the calling thread (the watchdog process,
 * which has nothing else to do). Returns the result; throws the open(2) error.
 */
export function fsIoctlSync(mountPoint: string, req: number): IoctlResult {
  const fd = openSync(mountPoint, constants.O_RDONLY | constants.O_DIRECTORY);
  try {
    const res = ioctl()(fd, req, null);
    return res === 0 ? { ok: true } : { ok: false, errno: koffi.errno() };
  } finally {
    closeSync(fd);
  }
}
