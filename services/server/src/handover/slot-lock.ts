/**
 * One server per slot: a server of slot "a" or "b" holds an exclusive flock(2) on
 * `<runDir>/server-<slot>.lock` before it binds its admin socket (`server-<slot>-admin.sock`)
 * and keeps it until it retires or stops; the kernel releases it when the process dies. A
 * second server of the same slot (two `sandnode upgrade server` at once) gets SlotBusyError and
 * never touches the socket. The lock file holds the holder's pid, for messages only; the lock
 * is the truth.
 *
 * removeStaleAdminSockets removes the admin sockets of servers that are gone (killed servers
 * leave theirs behind), never a live one.
 */
import { ftruncateSync, lstatSync, readdirSync, readFileSync, rmSync, writeSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { ADMIN_SOCKET_RE, processState, type Logger } from '@sandnode/shared';
import { releaseFlock, tryFlock } from '../store/flock-lease';

/** How long a server of a slot retries a busy slot lock before it gives up, ms (another server's stale-socket probe holds it for microseconds). */
export const SLOT_LOCK_RETRY_MS = 300;
/** How long the stale-socket probe waits for a connect, ms. */
const PROBE_CONNECT_MS = 500;

/** Another live process holds the slot. holderPid: what the lock file says (0 when it says nothing). */
export class SlotBusyError extends Error {
  constructor(
    readonly slot: string,
    readonly holderPid: number,
  ) {
    super(`slot ${slot} is held by another server${holderPid ? ` (pid ${holderPid})` : ''}: another standby of this slot is starting or taking over`);
    this.name = 'SlotBusyError';
  }
}

/** slotLockFile is the lock file of slot in runDir. */
export function slotLockFile(runDir: string, slot: string): string {
  return path.join(runDir, `server-${slot}.lock`);
}

/** readSlotHolder is the pid the lock file names (0 when none; it may be dead). */
export function readSlotHolder(file: string): number {
  try {
    const pid = Number(readFileSync(file, 'utf8').trim());
    return Number.isInteger(pid) && pid > 0 ? pid : 0;
  } catch {
    return 0;
  }
}

export class SlotLock {
  private fd: number | undefined;

  constructor(readonly file: string) {}

  get held(): boolean {
    return this.fd !== undefined;
  }

  /** tryAcquire takes the lock if it is free (non-blocking); true when taken. writePid: record this process as the holder. */
  tryAcquire(writePid = true): boolean {
    if (this.fd !== undefined) return true;
    const fd = tryFlock(this.file);
    if (fd === undefined) return false;
    this.fd = fd;
    if (writePid) {
      ftruncateSync(fd, 0);
      writeSync(fd, `${process.pid}\n`, 0);
    }
    return true;
  }

  /** acquire retries tryAcquire for SLOT_LOCK_RETRY_MS, ms. Throws SlotBusyError(slot, holder pid) when it stays busy. */
  async acquire(slot: string): Promise<void> {
    const deadline = Date.now() + SLOT_LOCK_RETRY_MS;
    while (!this.tryAcquire()) {
      if (Date.now() >= deadline) throw new SlotBusyError(slot, readSlotHolder(this.file));
      await new Promise((r) => setTimeout(r, 20));
    }
  }

  /** release unlocks (the file stays: its inode is the lock). */
  release(): void {
    if (this.fd === undefined) return;
    const fd = this.fd;
    this.fd = undefined;
    releaseFlock(fd);
  }
}

/** connectRefused says whether a unix socket path refuses connections (nobody listens); false when it accepts or for any other error. */
export function connectRefused(p: string): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect(p);
    const done = (v: boolean) => {
      clearTimeout(t);
      s.destroy();
      resolve(v);
    };
    const t = setTimeout(() => done(false), PROBE_CONNECT_MS);
    s.once('connect', () => done(false));
    s.once('error', (err: NodeJS.ErrnoException) => done(err.code === 'ECONNREFUSED'));
  });
}

function alive(pid: number): boolean {
  const st = processState(pid);
  return st !== undefined && st !== 'Z';
}

/**
 * removeStaleAdminSockets removes every `server-<slot or pid>-admin.sock` in runDir (except
 * keep, this server's own name) whose owner is gone: the socket refuses connections AND (pid
 * name) that pid is dead, or (slot name) no process holds the slot lock (probed by taking it for
 * the removal, never recording a holder). A socket is removed only if it is still the inode that
 * refused. Returns the names removed.
 */
export async function removeStaleAdminSockets(runDir: string, keep: string, log: Logger): Promise<string[]> {
  let names: string[];
  try {
    names = readdirSync(runDir).filter((n) => ADMIN_SOCKET_RE.test(n) && n !== keep);
  } catch {
    return [];
  }
  const removed: string[] = [];
  for (const name of names) {
    const p = path.join(runDir, name);
    const st = lstatSync(p, { throwIfNoEntry: false });
    if (!st?.isSocket() || !(await connectRefused(p))) continue;
    const owner = name.slice('server-'.length, -'-admin.sock'.length);
    const sameInode = () => lstatSync(p, { throwIfNoEntry: false })?.ino === st.ino;
    if (/^\d+$/.test(owner)) {
      if (alive(Number(owner)) || !sameInode()) continue;
      rmSync(p, { force: true });
    } else {
      const probe = new SlotLock(slotLockFile(runDir, owner));
      if (!probe.tryAcquire(false)) continue;
      try {
        if (!sameInode()) continue;
        rmSync(p, { force: true });
      } finally {
        probe.release();
      }
    }
    removed.push(name);
  }
  if (removed.length) log.info({ removed }, 'removed the admin sockets of servers that are gone');
  return removed;
}
