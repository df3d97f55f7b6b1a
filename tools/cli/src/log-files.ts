/**
 * Reading the node's log files for `sandnode logs` and `sandnode sandbox logs`: which file a
 * running daemon writes (its fd 2, as /proc shows it: after `upgrade server` the active server
 * writes `logs/server-<slot>.log`, not `logs/server.log`), `--since` and `--tail`, following a
 * file as it grows, and making text a sandbox wrote safe for a terminal.
 *
 * Daemon logs are pino JSON lines (`time` ISO 8601, `pid`); a line that is not JSON (a crash's
 * stack, a runtime warning) belongs to the JSON line before it for `--since`.
 */
import { closeSync, constants, fstatSync, openSync, readlinkSync, readSync } from 'node:fs';
import { InvalidArgumentError } from 'commander';

/** Largest piece of a file read at once, bytes. */
export const READ_CHUNK_BYTES = 256 * 1024;
/** How much of a file's end a switch to a new daemon's file scans for that daemon's lines, bytes. */
export const SWITCH_SCAN_BYTES = 1024 * 1024;

/** Units `--since` takes after a number, in ms. */
const UNIT_MS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/**
 * parseSince reads a `--since` value: a duration back from now (`90s`, `10m`, `2h`, `1d`,
 * `500ms`) or an ISO 8601 time; returns epoch ms. Anything else is a usage error (exit 2).
 */
export function parseSince(v: string, now = Date.now()): number {
  const m = /^(\d+)(ms|s|m|h|d)$/.exec(v);
  if (m) return now - Number(m[1]) * (UNIT_MS[m[2]!] ?? 1);
  if (/^\d{4}-\d{2}-\d{2}/.test(v)) {
    const t = Date.parse(v);
    if (Number.isFinite(t)) return t;
  }
  throw new InvalidArgumentError('expected a duration (30s, 10m, 2h, 1d) or an ISO 8601 time (2026-12-02T04:00:00Z)');
}

/** lineTime is a pino line's `time` as epoch ms (ISO string or number), undefined for a line that is not such JSON. */
export function lineTime(line: string): number | undefined {
  if (!line.startsWith('{')) return undefined;
  try {
    const t = (JSON.parse(line) as { time?: unknown }).time;
    if (typeof t === 'number') return t;
    if (typeof t === 'string') {
      const ms = Date.parse(t);
      return Number.isFinite(ms) ? ms : undefined;
    }
  } catch {
    // not JSON
  }
  return undefined;
}

/** linePid is a pino line's `pid`, undefined for a line without one. */
export function linePid(line: string): number | undefined {
  if (!line.startsWith('{')) return undefined;
  try {
    const p = (JSON.parse(line) as { pid?: unknown }).pid;
    return typeof p === 'number' ? p : undefined;
  } catch {
    return undefined;
  }
}

/**
 * sinceFilter makes a line filter for `--since` (epoch ms; undefined: every line): a JSON line
 * is kept when its time is at or after since, a line without a time goes with the line before.
 */
export function sinceFilter(since: number | undefined): (line: string) => boolean {
  if (since === undefined) return () => true;
  let keep = false;
  return (line) => {
    const t = lineTime(line);
    if (t !== undefined) keep = t >= since;
    return keep;
  };
}

/**
 * safeForTerminal shows the control characters of text (ESC, CR, backspace, C1 ...; not
 * newline or tab) as `\xNN`, so that a sandbox's output cannot move the cursor, retitle the
 * window or hide lines on the terminal that prints it: the CLI's one escaper, terminal-safe.ts.
 */
export { terminalSafe as safeForTerminal } from './terminal-safe';

/**
 * daemonLogFile is the file pid writes its stderr to (pino writes to fd 2), read from
 * /proc/<pid>/fd/2; undefined when that is no file (a pipe, a socket, /dev/null, a deleted
 * file) or cannot be read.
 */
export function daemonLogFile(pid: number): string | undefined {
  let target: string;
  try {
    target = readlinkSync(`/proc/${pid}/fd/2`);
  } catch {
    return undefined;
  }
  if (!target.startsWith('/') || target.endsWith(' (deleted)') || target.startsWith('/dev/')) return undefined;
  return target;
}

/** An open log file: its fd, identity and the position read up to. */
export interface OpenLog {
  fd: number;
  path: string;
  dev: number;
  ino: number;
  pos: number;
}

/**
 * openLog opens path read-only without following a symlink at its last component and only if it
 * is a regular file (a sandbox's console is written by the sandbox); undefined when it does not
 * exist. Other errors (a symlink, a dir, a FIFO) throw Error naming the path.
 */
export function openLog(path: string): OpenLog | undefined {
  let fd: number;
  try {
    fd = openSync(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') return undefined;
    if (code === 'ELOOP') throw new Error(`${path} is a symlink: not read`, { cause: err });
    throw new Error(`${path}: ${code ?? (err as Error).message}`, { cause: err });
  }
  const st = fstatSync(fd);
  if (!st.isFile()) {
    closeSync(fd);
    throw new Error(`${path} is not a regular file: not read`);
  }
  return { fd, path, dev: st.dev, ino: st.ino, pos: 0 };
}

/**
 * readNew reads what the file holds past log.pos (at most maxBytes per call, moving pos), as
 * text; a file that shrank (truncated or trimmed to its cap) is read again from its start.
 */
export function readNew(log: OpenLog, maxBytes = READ_CHUNK_BYTES): string {
  const size = fstatSync(log.fd).size;
  if (size < log.pos) log.pos = 0;
  if (size === log.pos) return '';
  const buf = Buffer.alloc(Math.min(maxBytes, size - log.pos));
  const n = readSync(log.fd, buf, 0, buf.length, log.pos);
  log.pos += n;
  return buf.subarray(0, n).toString('utf8');
}

/** Splits text read in pieces into whole lines, keeping a partial last line for the next piece. */
export class LineSplitter {
  private rest = '';
  /** push returns the whole lines of rest + text (without their newlines). */
  push(text: string): string[] {
    const parts = (this.rest + text).split('\n');
    this.rest = parts.pop() ?? '';
    return parts;
  }
  /** flush returns the partial last line, if any (a file that ends without a newline). */
  flush(): string[] {
    const r = this.rest;
    this.rest = '';
    return r ? [r] : [];
  }
}

/** readAllLines reads log from its position to its end as lines (the partial last line included). */
export function readAllLines(log: OpenLog): string[] {
  const split = new LineSplitter();
  const out: string[] = [];
  for (let t = readNew(log); t; t = readNew(log)) out.push(...split.push(t));
  out.push(...split.flush());
  return out;
}

/** lastLines keeps the last n of lines (n undefined: all). */
export function lastLines(lines: string[], n: number | undefined): string[] {
  return n === undefined ? lines : lines.slice(Math.max(0, lines.length - n));
}
