/**
 * The node's freeze watchdog process: `node freeze-watchdog-main.js <dir>` (protocol in
 * freeze-watchdog.ts). Loads Node, fs-ext and koffi only. Exits when another watchdog holds
 * the dir's lock, or when the dir is gone (the run dir was removed).
 */
import { setPriority } from 'node:os';
import { closeSync, constants, existsSync, openSync, readdirSync, readFileSync, renameSync, rmSync, watch, writeFileSync } from 'node:fs';
import path from 'node:path';
import { flockSync } from 'fs-ext';
import { DEADLINE_SUFFIX, WATCHDOG_LOCK_FILE, WATCHDOG_NICE, WATCHDOG_PID_FILE, WATCHDOG_RESCAN_MS, WATCHDOG_SCHEMA, type DeadlineFile } from './freeze-watchdog-files';
import { FITHAW, fsIoctlSync } from './fs-ioctl';

const dir = process.argv[2];
if (!dir) process.exit(2);

/** A pending thaw, by deadline file name. */
const pending = new Map<string, { token: string; timer: NodeJS.Timeout }>();

function readDeadline(file: string): DeadlineFile | undefined {
  try {
    const d = JSON.parse(readFileSync(file, 'utf8')) as DeadlineFile;
    if (d.schema !== WATCHDOG_SCHEMA || typeof d.token !== 'string' || typeof d.deadlineMs !== 'number' || !Array.isArray(d.mounts) || typeof d.endFile !== 'string') return undefined;
    return d;
  } catch {
    return undefined;
  }
}

function writeAtomic(file: string, data: string): void {
  const tmp = `${file}.tmp-${process.pid}`;
  writeFileSync(tmp, data, { mode: 0o600 });
  renameSync(tmp, file);
}

/** thaw ends the freeze of name if its file still names token: FITHAW each mount, record the time, drop the file. */
function thaw(name: string, token: string): void {
  pending.delete(name);
  const file = path.join(dir!, name);
  const d = readDeadline(file);
  if (!d || d.token !== token) return; // taken back by the supervisor, or replaced
  for (const m of d.mounts) {
    try {
      fsIoctlSync(m, FITHAW); // "not frozen" (EINVAL) is fine
    } catch {
      /* the mount point is gone: nothing to thaw */
    }
  }
  try {
    writeAtomic(d.endFile, `${Date.now()}\n`);
  } catch {
    /* the VM dir is gone */
  }
  if (readDeadline(file)?.token === token) rmSync(file, { force: true });
}

function scan(): void {
  let names: string[];
  try {
    names = readdirSync(dir!).filter((n) => n.endsWith(DEADLINE_SUFFIX));
  } catch {
    process.exit(0); // the dir is gone: nothing to guard any more
  }
  for (const [name, p] of pending) {
    if (!names.includes(name)) {
      clearTimeout(p.timer);
      pending.delete(name);
    }
  }
  for (const name of names) {
    const d = readDeadline(path.join(dir!, name));
    if (!d) continue;
    const p = pending.get(name);
    if (p?.token === d.token) continue;
    if (p) clearTimeout(p.timer);
    const token = d.token;
    pending.set(name, { token, timer: setTimeout(() => thaw(name, token), Math.max(0, d.deadlineMs - Date.now())) });
  }
}

function startTicks(): number {
  const stat = readFileSync('/proc/self/stat', 'utf8');
  return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19]);
}

// The watchdog is the bound of every freeze: it runs ahead of the node's other work (nice -10, as
// root) so that a loaded machine does not hold a VM's filesystems frozen past the deadline (CI: a
// thaw 104 ms late on 2 busy cores). Not root: it stays at its nice value.
try {
  setPriority(WATCHDOG_NICE);
} catch {
  /* not permitted */
}
const lockFd = openSync(path.join(dir, WATCHDOG_LOCK_FILE), constants.O_RDWR | constants.O_CREAT, 0o600);
try {
  flockSync(lockFd, 'exnb');
} catch {
  closeSync(lockFd);
  process.exit(0); // another watchdog guards this dir
}
watch(dir, () => scan()).on('error', () => process.exit(0));
setInterval(scan, WATCHDOG_RESCAN_MS);
scan();
writeAtomic(path.join(dir, WATCHDOG_PID_FILE), `${JSON.stringify({ schema: WATCHDOG_SCHEMA, pid: process.pid, startTicks: startTicks() })}\n`);
if (!existsSync(dir)) process.exit(0);
