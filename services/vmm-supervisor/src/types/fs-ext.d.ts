/** Minimal typings of fs-ext 2.1.1 (flock(2) from Node); only what vmm-supervisor uses. */
declare module 'fs-ext' {
  /** flockSync runs flock(2) on fd; flags: 'sh' | 'ex' | 'un', with 'nb' appended for non-blocking. Throws on error (EAGAIN/EWOULDBLOCK when held). */
  export function flockSync(fd: number, flags: 'sh' | 'ex' | 'shnb' | 'exnb' | 'un'): void;
}
