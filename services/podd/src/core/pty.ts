/**
 * Pseudo-terminals for podd's ExecStream (pty mode). Node has no pty API, so the few libc calls
 * go through the FFI library koffi (already a dependency of shared, well kept, prebuilt for
 * linux x64): posix_openpt + grantpt + unlockpt + ptsname_r make a master/slave pair, and
 * ioctl(TIOCSWINSZ) on the master sets the window size (the kernel then sends SIGWINCH to the
 * terminal's foreground process group). The command gets the slave as stdin/stdout/stderr and
 * becomes its session leader with the slave as controlling terminal through `setsid -c`
 * (busybox in templates, util-linux on hosts: setsid(2) then ioctl(0, TIOCSCTTY)), so job
 * control and Ctrl-C (the line discipline turns \x03 into SIGINT for the foreground group) work
 * as in a terminal. node-pty was not taken: it needs a compiler at install and a matching
 * native build inside every template; koffi's prebuilt module is one file.
 *
 * In a template the native module is /opt/sandnode/koffi.node beside the podd bundle (the
 * template builder copies it with its shared libraries); elsewhere `require('koffi')`.
 */
import { closeSync, existsSync, openSync, constants as fsConstants } from 'node:fs';
import path from 'node:path';
import { FailedPreconditionError, InvalidArgumentError } from '@sandnode/shared';

/** Largest rows or cols of a window size (struct winsize holds unsigned short). */
export const MAX_WINDOW_CELLS = 65535;
/** Window size a pty starts with when the caller gives none: 24 rows x 80 columns. */
export const DEFAULT_WINDOW = { rows: 24, cols: 80 } as const;

// Linux x86_64/arm64 (asm-generic/ioctls.h, fcntl.h)
const TIOCSWINSZ = 0x5414;
const O_RDWR = 0o2;
const O_NOCTTY = 0o400;
const O_CLOEXEC = 0o2000000;

interface Libc {
  posixOpenpt: (flags: number) => number;
  grantpt: (fd: number) => number;
  unlockpt: (fd: number) => number;
  ptsnameR: (fd: number, buf: Buffer, len: number) => number;
  ioctl: (fd: number, req: number, arg: Buffer) => number;
  errno: () => number;
}

let libc: Libc | undefined;
let loadError: Error | undefined;

/** koffiModule loads koffi: the native module beside the bundle in a template, else the package. */
function koffiModule(): { load(lib: string): { func(decl: string): unknown }; errno(): number } {
  const beside = path.join(__dirname, 'koffi.node');
  // a dynamic require of a path (left alone by the bundler) in a template; the package elsewhere
  if (existsSync(beside)) return require(beside) as ReturnType<typeof koffiModule>;
  return require('koffi') as ReturnType<typeof koffiModule>;
}

function lib(): Libc {
  if (libc) return libc;
  if (loadError) throw loadError;
  try {
    const koffi = koffiModule();
    const c = koffi.load('libc.so.6');
    libc = {
      posixOpenpt: c.func('int posix_openpt(int flags)') as Libc['posixOpenpt'],
      grantpt: c.func('int grantpt(int fd)') as Libc['grantpt'],
      unlockpt: c.func('int unlockpt(int fd)') as Libc['unlockpt'],
      ptsnameR: c.func('int ptsname_r(int fd, _Out_ uint8_t *buf, size_t len)') as Libc['ptsnameR'],
      ioctl: c.func('int ioctl(int fd, unsigned long req, uint8_t *arg)') as Libc['ioctl'],
      errno: () => koffi.errno(),
    };
    return libc;
  } catch (err) {
    loadError = new FailedPreconditionError(`pty: this podd cannot allocate pseudo-terminals (koffi did not load: ${(err as Error).message}); rebuild the template with this release`);
    throw loadError;
  }
}

/** ptyAvailable says whether pseudo-terminals can be made here (koffi loads and /dev/ptmx exists). */
export function ptyAvailable(): boolean {
  try {
    lib();
    return existsSync('/dev/ptmx');
  } catch {
    return false;
  }
}

/** WindowSize is a terminal size in cells. */
export interface WindowSize {
  rows: number;
  cols: number;
}

/** checkWindowSize: rows and cols integers in 1..MAX_WINDOW_CELLS, else InvalidArgumentError naming `field`. */
export function checkWindowSize(field: string, s: WindowSize): void {
  for (const [k, v] of [
    ['rows', s.rows],
    ['cols', s.cols],
  ] as const) {
    if (!Number.isInteger(v) || v < 1 || v > MAX_WINDOW_CELLS) throw new InvalidArgumentError(`${field}.${k}: ${v} is not in 1..${MAX_WINDOW_CELLS}`);
  }
}

/** Pty is an open master with the path and an fd of its slave. */
export interface Pty {
  /** master fd (close-on-exec); podd reads the terminal's output from it and writes input to it */
  master: number;
  /** slave fd for the child's stdio (close-on-exec: the child gets dup2'd copies); close it after spawn */
  slave: number;
  /** /dev/pts/N */
  slavePath: string;
}

/** openPty makes a pty pair of size; FailedPreconditionError when koffi or /dev/ptmx is missing or the kernel refuses (errno named). */
export function openPty(size: WindowSize): Pty {
  const c = lib();
  const master = c.posixOpenpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master < 0) throw new FailedPreconditionError(`pty: posix_openpt failed (errno ${c.errno()})`);
  const fail = (what: string): never => {
    const e = c.errno();
    closeFd(master);
    throw new FailedPreconditionError(`pty: ${what} failed (errno ${e})`);
  };
  if (c.grantpt(master) !== 0) fail('grantpt');
  if (c.unlockpt(master) !== 0) fail('unlockpt');
  const buf = Buffer.alloc(128);
  if (c.ptsnameR(master, buf, buf.length) !== 0) fail('ptsname_r');
  const slavePath = buf.subarray(0, buf.indexOf(0)).toString();
  setWindowSize(master, size);
  let slave: number;
  try {
    slave = openSync(slavePath, fsConstants.O_RDWR | fsConstants.O_NOCTTY);
  } catch (err) {
    closeFd(master);
    throw new FailedPreconditionError(`pty: open ${slavePath}: ${(err as NodeJS.ErrnoException).code}`);
  }
  return { master, slave, slavePath };
}

/** setWindowSize sets the terminal's size (TIOCSWINSZ on the master); false when the ioctl failed (the pty is gone). */
export function setWindowSize(master: number, s: WindowSize): boolean {
  const ws = Buffer.alloc(8);
  ws.writeUInt16LE(s.rows, 0);
  ws.writeUInt16LE(s.cols, 2);
  return lib().ioctl(master, TIOCSWINSZ, ws) === 0;
}

function closeFd(fd: number): void {
  try {
    closeSync(fd);
  } catch {
    // already closed
  }
}

/** setsidPath finds `setsid` (busybox applet in templates, util-linux on hosts); FailedPreconditionError when none. */
export function setsidPath(): string {
  for (const p of ['/bin/setsid', '/usr/bin/setsid', '/sbin/setsid', '/usr/sbin/setsid']) if (existsSync(p)) return p;
  throw new FailedPreconditionError('pty: no setsid binary (busybox applet or util-linux) to give the command its controlling terminal');
}
