/**
 * FlockLease: the node's server lease, an exclusive flock(2) on `<stateDir>/server.lease`.
 * The kernel releases it when the holder dies (kill -9 included), so a crashed server never
 * blocks its successor. `<lease file>.json` names the holder (pid, admin socket, slot,
 * version, epoch) for standbys and the CLI; the lock, not that record, is the truth.
 */
import { closeSync, ftruncateSync, openSync, readFileSync, renameSync, writeSync, fsyncSync } from 'node:fs';

const fsExt = require('fs-ext') as { flockSync(fd: number, flags: 'ex' | 'exnb' | 'un'): void };

/**
 * tryFlock opens file (created 0600) and takes an exclusive flock(2) on it without waiting:
 * the open fd when taken (the lock lives as long as the fd, and the kernel drops it when the
 * process dies), undefined when another process holds it. Other errors are thrown.
 */
export function tryFlock(file: string): number | undefined {
  const fd = openSync(file, 'a+', 0o600);
  try {
    fsExt.flockSync(fd, 'exnb');
    return fd;
  } catch (err) {
    closeSync(fd);
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'EAGAIN' || code === 'EWOULDBLOCK') return undefined;
    throw err;
  }
}

/** releaseFlock unlocks and closes an fd tryFlock returned (closing alone would drop the lock too; unlocking first says so). */
export function releaseFlock(fd: number): void {
  try {
    fsExt.flockSync(fd, 'un');
  } finally {
    closeSync(fd);
  }
}

/** What the lease file says about its holder. */
export interface LeaseHolder {
  pid: number;
  admin: string;
  slot: string;
  version: string;
  epoch: number;
  sinceMs: number;
}

export class FlockLease {
  private fd: number | undefined;

  constructor(readonly file: string) {}

  /** held says whether this process holds the lease. */
  get held(): boolean {
    return this.fd !== undefined;
  }

  /** tryAcquire takes the lease if it is free (non-blocking); true when taken. */
  tryAcquire(): boolean {
    if (this.fd !== undefined) return true;
    this.fd = tryFlock(this.file);
    return this.fd !== undefined;
  }

  /** acquire polls tryAcquire every pollMs until timeoutMs; true when taken. */
  async acquire(timeoutMs: number, pollMs = 10): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      if (this.tryAcquire()) return true;
      if (Date.now() >= deadline) return false;
      await new Promise((r) => setTimeout(r, pollMs));
    }
  }

  /**
   * describe writes the holder record (only while held) to `<lease file>.json`, atomically
   * (temp file, fsync, rename): a reader never sees a half-written record. The lock stays on
   * the lease file itself, whose inode never changes.
   */
  describe(h: LeaseHolder): void {
    if (this.fd === undefined) throw new Error('lease not held');
    // 0.1.0 reads the holder from the lease file itself: keep writing it there too
    // (make-before-break; readers of this version prefer the .json, which is never torn).
    ftruncateSync(this.fd, 0);
    writeSync(this.fd, JSON.stringify(h), 0);
    fsyncSync(this.fd);
    const tmp = `${this.file}.json.${process.pid}.tmp`;
    const fd = openSync(tmp, 'w', 0o600);
    try {
      writeSync(fd, JSON.stringify(h));
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    renameSync(tmp, `${this.file}.json`);
  }

  /** release unlocks (the kernel does the same if the process dies). */
  release(): void {
    if (this.fd === undefined) return;
    const fd = this.fd;
    this.fd = undefined;
    releaseFlock(fd);
  }

  /** readHolder returns what the lease file says (it may name a dead holder). */
  static readHolder(file: string): LeaseHolder | undefined {
    // The .json (this version, never torn) and the lease file's own content (what 0.1.0
    // writes): a 0.1.0 server that took over after this version leaves a stale .json behind,
    // so the record with the higher epoch wins.
    let best: LeaseHolder | undefined;
    for (const f of [`${file}.json`, file]) {
      try {
        const h = JSON.parse(readFileSync(f, 'utf8')) as LeaseHolder;
        if (!best || (h.epoch ?? 0) > (best.epoch ?? 0)) best = h;
      } catch {
        /* missing or torn */
      }
    }
    return best;
  }

  /** isHeld says whether some process holds the lease now (tries and releases at once). */
  static isHeld(file: string): boolean {
    const probe = new FlockLease(file);
    if (!probe.tryAcquire()) return true;
    probe.release();
    return false;
  }
}
