/**
 * The console log of a runc VM: the stdout and stderr of runc and of the VM's init, a file
 * `console.log` on a tmpfs of its own (vm-tmpfs.ts, size config `consoleLogBytes`) that the
 * supervisor keeps bounded:
 *
 * - the kernel bounds it: the tmpfs is the cap, so a flood through /proc/1/fd/1 stops at ENOSPC
 *   (the writer gets an error, never a signal and never a block) and the host's disk is never
 *   written;
 * - the supervisor keeps the latest output: when the file passes 3/4 of the cap it is cut to
 *   its last half (on inotify, at most every CONSOLE_TRIM_GAP_MS, and every CONSOLE_CHECK_MS),
 *   so a flood leaves (roughly) its tail;
 * - nothing needs a reader: unlike a pipe, a file whose supervisor was killed gives its writers
 *   no SIGPIPE and no full buffer. While no supervisor runs, the log fills up to the cap and
 *   later writes fail with ENOSPC; the next supervisor (adoption) cuts it again.
 *
 * A sandbox can truncate or rewrite its own console output (it holds the fd); it cannot make
 * the host keep more than the cap, nor reach any other file through it.
 */
import { closeSync, constants, fstatSync, ftruncateSync, openSync, readSync, watch, writeSync, type FSWatcher } from 'node:fs';
import type { Logger } from '@sandnode/shared';

/** File name of the console log in its tmpfs. */
export const CONSOLE_LOG_FILE = 'console.log';
/** Default cap of a VM's console log, in bytes (config `consoleLogBytes`): 1 MiB. */
export const DEFAULT_CONSOLE_LOG_BYTES = 1024 * 1024;
/** How often a watched console log is checked besides its inotify events, in ms. */
export const CONSOLE_CHECK_MS = 1000;
/** Least time between two trims of one console log prompted by its writes, in ms. */
export const CONSOLE_TRIM_GAP_MS = 50;
/** Most bytes read from the end of a console log to quote its last lines. */
export const CONSOLE_TAIL_BYTES = 64 * 1024;

/**
 * trimConsole cuts file to its last half of capBytes when it is longer than 3/4 of capBytes
 * (apparent size: a writer that seeked far is cut too). Returns the bytes dropped (0: nothing
 * to do or no such file). Writes that race the cut may be lost; appends after it land after
 * the kept tail.
 */
export function trimConsole(file: string, capBytes: number): number {
  let fd: number;
  try {
    fd = openSync(file, constants.O_RDWR | constants.O_APPEND | constants.O_NOFOLLOW);
  } catch {
    return 0;
  }
  try {
    const size = fstatSync(fd).size;
    if (size <= Math.floor((capBytes * 3) / 4)) return 0;
    const keep = Math.floor(capBytes / 2);
    const buf = Buffer.alloc(keep);
    const n = readSync(fd, buf, 0, keep, size - keep);
    ftruncateSync(fd, 0);
    writeSync(fd, buf, 0, n);
    return size - n;
  } finally {
    closeSync(fd);
  }
}

/**
 * consoleTail returns the last n lines of file joined by " | " (read from at most its last
 * CONSOLE_TAIL_BYTES), or "(no console.log)" when it cannot be read.
 */
export function consoleTail(file: string, n: number): string {
  let fd: number;
  try {
    fd = openSync(file, constants.O_RDONLY | constants.O_NOFOLLOW);
  } catch {
    return '(no console.log)';
  }
  try {
    const size = fstatSync(fd).size;
    const len = Math.min(size, CONSOLE_TAIL_BYTES);
    const buf = Buffer.alloc(len);
    const got = readSync(fd, buf, 0, len, size - len);
    return buf.subarray(0, got).toString('utf8').replace(/\0+/g, '').trim().split('\n').slice(-n).join(' | ');
  } finally {
    closeSync(fd);
  }
}

/**
 * ConsoleWatch keeps one VM's console log under its cap while this supervisor runs. The first
 * inotify event of the file closes the watch and schedules a trim CONSOLE_TRIM_GAP_MS after
 * the previous one; the trim arms a new watch. A flood of writes thus costs the supervisor at
 * most one event and one trim per gap, never one callback per write. A timer checks every
 * CONSOLE_CHECK_MS as well (a missed event, a failed watch).
 */
export class ConsoleWatch {
  private watcher: FSWatcher | undefined;
  private readonly timer: NodeJS.Timeout;
  private pending: NodeJS.Timeout | undefined;
  private lastCheckMs = 0;
  private closed = false;
  /** Bytes dropped so far by this watch. */
  dropped = 0;

  constructor(
    private readonly file: string,
    private readonly capBytes: number,
    private readonly log: Logger,
  ) {
    this.timer = setInterval(() => this.check(), CONSOLE_CHECK_MS);
    this.timer.unref();
    this.check();
  }

  /** close stops watching (the file stays). */
  close(): void {
    this.closed = true;
    clearInterval(this.timer);
    if (this.pending) clearTimeout(this.pending);
    this.watcher?.close();
    this.watcher = undefined;
  }

  private arm(): void {
    if (this.closed || this.watcher) return;
    try {
      this.watcher = watch(this.file, { persistent: false }, () => this.onEvent());
      this.watcher.on('error', () => this.disarm());
    } catch (err) {
      this.log.debug({ err, file: this.file }, 'console log: no inotify watch now; the timer checks it');
    }
  }

  private disarm(): void {
    this.watcher?.close();
    this.watcher = undefined;
  }

  private onEvent(): void {
    this.disarm();
    if (this.pending || this.closed) return;
    const wait = Math.max(0, this.lastCheckMs + CONSOLE_TRIM_GAP_MS - Date.now());
    this.pending = setTimeout(() => {
      this.pending = undefined;
      this.check();
    }, wait);
    this.pending.unref();
  }

  private check(): void {
    if (this.closed) return;
    this.lastCheckMs = Date.now();
    try {
      this.dropped += trimConsole(this.file, this.capBytes);
    } catch (err) {
      this.log.warn({ err, file: this.file }, 'console log: trim failed');
    }
    this.arm();
  }
}
