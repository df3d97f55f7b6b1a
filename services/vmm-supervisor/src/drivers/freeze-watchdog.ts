/**
 * The node's freeze watchdog: ONE long-lived process per node (not one per freeze) that
 * thaws a VM's filesystems at its freeze's deadline even when the supervisor is dead. It is
 * `node freeze-watchdog-main.js <dir>`, started by the supervisor at the first freeze that
 * finds none alive, as the leader of its own session with stdio ignored: it survives a
 * SIGKILL of the supervisor, and a restarted supervisor finds it again by its pid file.
 *
 * Protocol, all files in `<runDir>/freeze-watchdog/` (the run dir, never a frozen fs):
 *
 *   watchdog.lock         flock(2)ed by the live watchdog (a second one exits at once)
 *   watchdog.json         {"schema":1,"pid":P,"startTicks":T}, written once it watches the dir
 *   <vmId>.deadline       {"schema":1,"token","deadlineMs","mounts":[host paths, thaw order],"endFile"}
 *                         written (atomically) by the supervisor BEFORE the first FIFREEZE,
 *                         removed by it once it thawed
 *
 * The watchdog reads every deadline file when the dir changes (inotify) and every
 * {@link WATCHDOG_RESCAN_MS}; at a file's deadline (wall clock read once, then a monotonic
 * timer) it FITHAWs each mount in-process (fs-ioctl.ts; "not frozen" is fine), writes the
 * thaw time (Unix epoch ms) to endFile and removes the deadline file.
 */
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmSync } from 'node:fs';
import path from 'node:path';
import { InternalError, processLiveness, processStartTicks, writeFileAtomic } from '@sandnode/shared';
import { DEADLINE_SUFFIX, WATCHDOG_DIR, WATCHDOG_PID_FILE, WATCHDOG_SCHEMA, type DeadlineFile } from './freeze-watchdog-files';

export * from './freeze-watchdog-files';

/** Longest the supervisor waits for a watchdog it started to be ready, ms. */
export const WATCHDOG_START_WAIT_MS = 10_000;
/** The watchdog's entry point (beside this file in dist/). */
export const WATCHDOG_MAIN = path.join(__dirname, 'freeze-watchdog-main.js');

/** WatchdogRef names the live watchdog (to tell a reused pid apart). */
export interface WatchdogRef {
  pid: number;
  startTicks: number;
}

/** watchdogDirOf is the watchdog dir of the VM dir `<runDir>/vms/<id>`. */
export function watchdogDirOf(vmDir: string): string {
  return path.join(path.dirname(path.dirname(vmDir)), WATCHDOG_DIR);
}

/** readWatchdog returns the watchdog dir's live watchdog, or undefined (none, dead, zombie, other pid file). */
export function readWatchdog(dir: string): WatchdogRef | undefined {
  try {
    const j = JSON.parse(readFileSync(path.join(dir, WATCHDOG_PID_FILE), 'utf8')) as Partial<WatchdogRef> & { schema?: number };
    if (j.schema !== WATCHDOG_SCHEMA || typeof j.pid !== 'number' || typeof j.startTicks !== 'number') return undefined;
    return watchdogRunning(j.pid, j.startTicks) ? { pid: j.pid, startTicks: j.startTicks } : undefined;
  } catch {
    return undefined;
  }
}

/**
 * watchdogRunning says whether pid still runs as the process started at startTicks (a zombie
 * counts as gone). A /proc read that fails for another reason than "no such process" (EMFILE
 * when the supervisor is out of descriptors) counts as running (processLiveness `unknown`): a
 * wrong "gone" would thaw a freeze early (the snapshot it guards taken of a live filesystem)
 * or start a second watchdog.
 */
export function watchdogRunning(pid: number, startTicks: number): boolean {
  return processLiveness(pid, startTicks) !== 'gone';
}

/** Started watchdogs not yet ready, by dir: concurrent callers wait for the same start. */
const starting = new Map<string, Promise<WatchdogRef>>();

/**
 * ensureWatchdog returns dir's live watchdog, starting one (one process start, not per
 * freeze) when there is none. InternalError when it cannot be started or is not ready
 * within {@link WATCHDOG_START_WAIT_MS}.
 */
export async function ensureWatchdog(dir: string): Promise<WatchdogRef> {
  const live = readWatchdog(dir);
  if (live) return live;
  let p = starting.get(dir);
  if (!p) {
    p = startWatchdog(dir).finally(() => starting.delete(dir));
    starting.set(dir, p);
  }
  return p;
}

async function startWatchdog(dir: string): Promise<WatchdogRef> {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const child = spawn(process.execPath, [WATCHDOG_MAIN, dir], { detached: true, stdio: 'ignore' });
  await new Promise<void>((resolve, reject) => {
    child.once('spawn', resolve);
    child.once('error', (err) => reject(new InternalError(`cannot start the freeze watchdog: ${err.message}`)));
  });
  child.unref();
  const pid = child.pid!;
  const startTicks = processStartTicks(pid);
  for (const until = Date.now() + WATCHDOG_START_WAIT_MS; Date.now() < until;) {
    const w = readWatchdog(dir);
    // ours, or one that won the lock first (then ours exits)
    if (w) return w;
    if (startTicks === undefined || !watchdogRunning(pid, startTicks)) {
      const other = readWatchdog(dir);
      if (other) return other;
      throw new InternalError('the freeze watchdog exited at start (see its dir for a lock held by another process)');
    }
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new InternalError(`the freeze watchdog was not ready within ${WATCHDOG_START_WAIT_MS} ms`);
}

/** deadlineFileOf is the deadline file of vmId in dir. */
export function deadlineFileOf(dir: string, vmId: string): string {
  return path.join(dir, `${vmId}${DEADLINE_SUFFIX}`);
}

/** writeDeadline hands the watchdog a freeze (atomic write on the run dir). */
export function writeDeadline(dir: string, vmId: string, d: Omit<DeadlineFile, 'schema'>): void {
  writeFileAtomic(deadlineFileOf(dir, vmId), `${JSON.stringify({ schema: WATCHDOG_SCHEMA, ...d })}\n`);
}

/** clearDeadline takes the freeze named by token back from the watchdog (a later freeze's file is left). */
export function clearDeadline(dir: string, vmId: string, token: string): void {
  const f = deadlineFileOf(dir, vmId);
  if (!existsSync(f)) return;
  try {
    if ((JSON.parse(readFileSync(f, 'utf8')) as DeadlineFile).token !== token) return;
  } catch {
    /* unreadable: ours to remove */
  }
  rmSync(f, { force: true });
}
