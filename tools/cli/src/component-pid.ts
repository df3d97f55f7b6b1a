/**
 * The PID column of `sandnode status`: a pid only for a process that lives. A pid file whose
 * process is gone (or a zombie nobody reaped, or another process that took the pid) is "stale".
 */
import { existsSync, readFileSync } from 'node:fs';
import { findRunning, pidFile, type Component, type StackDirs } from '@sandnode/node-stack';
import { processState } from '@sandnode/shared';

/** What status knows of a component's process. */
export interface ComponentPid {
  /** the pid of its live process, or null */
  pid: number | null;
  /** the pid its pid file names when that process is not alive (stale pid file); absent otherwise */
  stalePid?: number;
}

/** alive: pid is a process that runs (not gone, not a zombie or dead entry). */
function alive(pid: number): boolean {
  const s = processState(pid);
  return s !== undefined && s !== 'Z' && s !== 'X';
}

/** componentPid: c's pid from its answer (answeredPid: GetVersion's pid, when it answered), else from its pid file when that process lives; a pid file without a live process gives stalePid. */
export function componentPid(dirs: StackDirs, c: Component, answeredPid: number | undefined): ComponentPid {
  if (answeredPid) return { pid: answeredPid };
  const running = findRunning(dirs, c);
  if (running && alive(running.pid)) return { pid: running.pid };
  const f = pidFile(dirs, c);
  if (!existsSync(f)) return { pid: null };
  const n = Number(readFileSync(f, 'utf8').trim().split(' ')[0]);
  return Number.isInteger(n) && n > 0 ? { pid: null, stalePid: n } : { pid: null };
}

/** pidText: the PID column: the pid, "- (stale pid file: N)", or "-". */
export function pidText(p: ComponentPid): string {
  if (p.pid !== null) return String(p.pid);
  return p.stalePid ? `- (stale pid file: ${p.stalePid})` : '-';
}
