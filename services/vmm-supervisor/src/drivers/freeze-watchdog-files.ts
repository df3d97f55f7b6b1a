/**
 * The files of the node's freeze watchdog (freeze-watchdog.ts has the protocol): names and
 * shapes only, no imports, so that the watchdog process (freeze-watchdog-main.ts) loads
 * nothing but Node and koffi.
 */

/** Schema of the watchdog's files this release reads and writes. */
export const WATCHDOG_SCHEMA = 1;
/** Name of the watchdog dir under the run dir. */
export const WATCHDOG_DIR = 'freeze-watchdog';
/** The watchdog's pid file. */
export const WATCHDOG_PID_FILE = 'watchdog.json';
/** The watchdog's lock file. */
export const WATCHDOG_LOCK_FILE = 'watchdog.lock';
/** Suffix of a deadline file. */
export const DEADLINE_SUFFIX = '.deadline';
/** How often the watchdog reads the dir even without a change, ms. */
export const WATCHDOG_RESCAN_MS = 1000;
/** The watchdog's nice value (setpriority(2); -20..19, lower runs first): ahead of the node's other work. */
export const WATCHDOG_NICE = -10;
/** DeadlineFile is what the supervisor hands the watchdog for one freeze. */
export interface DeadlineFile {
  schema: number;
  token: string;
  /** Unix epoch ms when the watchdog thaws. */
  deadlineMs: number;
  /** Host mount points, in thaw order. */
  mounts: string[];
  /** File the watchdog writes its thaw time (Unix epoch ms) into. */
  endFile: string;
}
