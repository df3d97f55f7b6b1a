/**
 * Peer credentials of a unix socket connection, from the kernel: getsockopt(SOL_SOCKET,
 * SO_PEERCRED) gives the pid, uid and gid of the process that connected (as they were at
 * connect(2)), SO_PEERGROUPS its supplementary groups (Linux >= 4.13). Node has neither, so
 * they are called through the FFI library koffi (loaded on first use; a load failure is an Error
 * naming it, and callers treat it as "not allowed": auth fails closed).
 *
 * The uid and gids are those of the caller's user namespace as seen from ours: a process in a
 * user namespace shows up with its mapped host ids, never as 0 unless it is host root.
 */
import type net from 'node:net';

/** Who is at the other end of a unix socket. */
export interface PeerCred {
  pid: number;
  uid: number;
  gid: number;
  /** supplementary groups (empty when the kernel has no SO_PEERGROUPS) */
  groups: number[];
}

// Linux, asm-generic/socket.h (x86_64, arm64, riscv64 ...)
const SOL_SOCKET = 1;
const SO_PEERCRED = 17;
const SO_PEERGROUPS = 59;
const ERANGE = 34;

/** getsockopt(2) through koffi: returns 0 or -1 (then errno()); `len` is in/out, bytes. */
export type GetSockOpt = (fd: number, level: number, name: number, val: Buffer, len: number[]) => number;
let native: { getsockopt: GetSockOpt; errno: () => number } | undefined;

/**
 * libcSockopt is libc's getsockopt and errno, loaded once per process through koffi (also used
 * by the server's egress proxy for SO_ORIGINAL_DST). Throws an Error naming koffi/libc when it
 * does not load.
 */
export function libcSockopt(): { getsockopt: GetSockOpt; errno: () => number } {
  return lib();
}

function lib(): { getsockopt: GetSockOpt; errno: () => number } {
  if (native) return native;
  try {
    const koffi = require('koffi') as { load(lib: string): { func(decl: string): unknown }; errno(): number };
    const libc = koffi.load('libc.so.6');
    const getsockopt = libc.func('int getsockopt(int fd, int level, int name, _Out_ uint8_t *val, _Inout_ uint32_t *len)') as GetSockOpt;
    native = { getsockopt, errno: () => koffi.errno() };
    return native;
  } catch (err) {
    throw new Error(`peer credentials: could not load koffi/libc getsockopt (${(err as Error).message})`, { cause: err });
  }
}

let dupFn: ((fd: number) => number) | undefined;

/** libcDup is dup(2) through koffi: a new fd of the same open file (an Error when it fails or koffi does not load). */
export function libcDup(fd: number): number {
  if (!dupFn) {
    const koffi = require('koffi') as { load(lib: string): { func(decl: string): unknown } };
    dupFn = koffi.load('libc.so.6').func('int dup(int fd)') as (fd: number) => number;
  }
  const d = dupFn(fd);
  if (d < 0) throw new Error(`dup(${fd}) failed`);
  return d;
}

/** fdOfSocket: the fd of a connected net.Socket (its libuv handle); an Error when it has none (closed, or not a plain socket). */
export function fdOfSocket(socket: net.Socket): number {
  const fd = (socket as unknown as { _handle?: { fd?: number } })._handle?.fd;
  if (typeof fd !== 'number' || fd < 0) throw new Error('peer credentials: the socket has no fd (closed?)');
  return fd;
}

/**
 * peerCredOfFd reads the peer credentials of the connected unix socket fd. Errors: an Error
 * naming errno when getsockopt fails (ENOTSOCK, EBADF; a TCP socket answers uid/gid -1 →
 * an Error too), or koffi does not load.
 */
export function peerCredOfFd(fd: number): PeerCred {
  const { getsockopt, errno } = lib();
  const buf = Buffer.alloc(12); // struct ucred { pid_t pid; uid_t uid; gid_t gid; }
  const len = [buf.length];
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, buf, len) !== 0) throw new Error(`peer credentials: getsockopt(SO_PEERCRED) on fd ${fd} failed, errno ${errno()}`);
  const pid = buf.readInt32LE(0);
  const uid = buf.readUInt32LE(4);
  const gid = buf.readUInt32LE(8);
  if (uid === 0xffffffff) throw new Error(`peer credentials: fd ${fd} has no peer credentials (not a unix socket?)`);
  return { pid, uid, gid, groups: peerGroupsOfFd(fd, getsockopt, errno) };
}

function peerGroupsOfFd(fd: number, getsockopt: GetSockOpt, errno: () => number): number[] {
  let size = 64 * 4;
  for (let attempt = 0; attempt < 3; attempt++) {
    const buf = Buffer.alloc(size);
    const len = [size];
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, buf, len) === 0) {
      const n = Math.floor((len[0] ?? 0) / 4);
      return Array.from({ length: n }, (_, i) => buf.readUInt32LE(i * 4));
    }
    if (errno() !== ERANGE) return [];
    size = Math.max(len[0] ?? 0, size * 2);
  }
  return [];
}

/** peerCred reads the peer credentials of a connected unix net.Socket (errors: those of fdOfSocket and peerCredOfFd). */
export function peerCred(socket: net.Socket): PeerCred {
  return peerCredOfFd(fdOfSocket(socket));
}
