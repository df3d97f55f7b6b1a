/**
 * FICLONE (ioctl_ficlone(2)): make one file share all the extents of another, O(1) in the
 * data size, on file systems with reflink (XFS `reflink=1`, btrfs, bcachefs). Called through
 * the FFI library koffi (already used by @sandnode/shared and the vmm-supervisor) on a worker
 * thread (koffi's async call): on a busy file system the kernel may take a while to lock the
 * source's extents, and the event loop must not wait for it. No host process is started.
 */
import { closeSync, constants as fsc, openSync, rmSync, writeSync } from 'node:fs';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import type * as Koffi from 'koffi' with { 'resolution-mode': 'import' };

// koffi's typings are an ES module; its `require` entry (index.cjs) is the same API.
const koffi = require('koffi') as typeof Koffi;

/** _IOW(0x94, 9, int): linux/fs.h FICLONE. */
export const FICLONE = 0x40049409;

/** errno values FICLONE fails with when the file system (or the pair of files) cannot share extents. */
const NO_REFLINK_ERRNOS: Record<number, string> = { 95: 'EOPNOTSUPP', 18: 'EXDEV', 22: 'EINVAL', 25: 'ENOTTY', 1: 'EPERM' };
/** errno names of the other failures worth naming in a message. */
const OTHER_ERRNOS: Record<number, string> = { 28: 'ENOSPC', 122: 'EDQUOT', 5: 'EIO', 9: 'EBADF', 26: 'ETXTBSY', 21: 'EISDIR' };

type IoctlIntFn = ((fd: number, req: number, arg: number) => number) & {
  async: (fd: number, req: number, arg: number, cb: (err: unknown, res: number) => void) => void;
};
let ioctlFn: IoctlIntFn | undefined;

function ioctl(): IoctlIntFn {
  ioctlFn ??= koffi.load('libc.so.6').func('int ioctl(int fd, unsigned long req, int arg)') as unknown as IoctlIntFn;
  return ioctlFn;
}

/** The outcome of one FICLONE: ok, or the errno with its name and whether it means "no reflink here". */
export type FicloneResult = { ok: true } | { ok: false; errno: number; name: string; unsupported: boolean };

function failure(errno: number): FicloneResult {
  const unsupported = errno in NO_REFLINK_ERRNOS;
  return { ok: false, errno, unsupported, name: NO_REFLINK_ERRNOS[errno] ?? OTHER_ERRNOS[errno] ?? `errno ${errno}` };
}

/**
 * ficlone runs ioctl(dstFd, FICLONE, srcFd) on a worker thread: afterwards dst has src's
 * size and shares every extent with it (copy-on-write). Both fds stay open (the caller closes
 * them). Resolves with the result; never rejects for a kernel error.
 */
export function ficlone(dstFd: number, srcFd: number): Promise<FicloneResult> {
  return new Promise((resolve) => {
    ioctl().async(dstFd, FICLONE, srcFd, (err, res) => {
      const errno = koffi.errno();
      resolve(err ? failure(-1) : res === 0 ? { ok: true } : failure(errno));
    });
  });
}

/**
 * probeReflink asks the kernel whether dir's file system shares extents: it writes 4 KiB into
 * a temp file in dir, FICLONEs it into a second temp file and removes both. Resolves with the
 * FicloneResult (ok: reflink works there). Errors: the open/write error of the temp files.
 */
export async function probeReflink(dir: string): Promise<FicloneResult> {
  const base = path.join(dir, `.reflink-probe-${randomBytes(4).toString('hex')}`);
  const flags = fsc.O_RDWR | fsc.O_CREAT | fsc.O_EXCL | fsc.O_NOFOLLOW;
  const src = openSync(`${base}.a`, flags, 0o600);
  let dst: number | undefined;
  try {
    writeSync(src, Buffer.alloc(4096, 0x5a), 0, 4096, 0);
    dst = openSync(`${base}.b`, flags, 0o600);
    return await ficlone(dst, src);
  } finally {
    closeSync(src);
    if (dst !== undefined) closeSync(dst);
    rmSync(`${base}.a`, { force: true });
    rmSync(`${base}.b`, { force: true });
  }
}
