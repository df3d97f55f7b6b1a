/** Types of the parts of fs-ext 2.1.1 (flock(2) from Node) that the ublk-manager uses. */
declare module 'fs-ext' {
  /** flockSync: flags 'sh' | 'ex' | 'un', with 'nb' appended for non-blocking; throws with code EAGAIN/EWOULDBLOCK when held. */
  export function flockSync(fd: number, flags: 'sh' | 'ex' | 'un' | 'shnb' | 'exnb'): void;
  /** flock: the same in the libuv thread pool. */
  export function flock(fd: number, flags: 'sh' | 'ex' | 'un' | 'shnb' | 'exnb', cb: (err: NodeJS.ErrnoException | null) => void): void;
}
