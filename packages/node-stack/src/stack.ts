/**
 * The local stack: start and stop the node's daemons (vmm-supervisor, ublk-manager, server) as
 * separate background processes, each with a pid file and a log in the runtime dir. Used by
 * `sandnode up|down` and the demo.
 */
import { rmSync } from 'node:fs';
import path from 'node:path';
import { unixAddress } from '@sandnode/shared';
import { findRunning, getVersion, logFile, mainScript, nodeFor, pidFile, versionAt, writePidFile, type Component, type StackDirs } from './components';
import { spawnDaemon, stopProcess, tail, waitForDaemon } from './daemon-process';
import { activeUblkSlot, pointUblkAddress, ublkSlotSocket } from './ublk-slot';

/** Default time `up` waits for a component to answer, ms. */
export const DEFAULT_START_TIMEOUT_MS = 60_000;
/** Default time `down` waits after SIGTERM before SIGKILL, ms. */
export const DEFAULT_STOP_TIMEOUT_MS = 15_000;
/** Time one readiness probe (GetVersion) of a starting component may take, ms. */
const START_PROBE_TIMEOUT_MS = 500;

/** The environment variable prefix of each component's config. */
const ENV_PREFIX: Record<Component, string> = {
  'vmm-supervisor': 'SANDNODE_VMM_SUPERVISOR_',
  'ublk-manager': 'SANDNODE_UBLK_MANAGER_',
  server: 'SANDNODE_SERVER_',
};

/** componentEnv is this process's environment plus the component's dirs (and, for ublk-manager, its slot). */
function componentEnv(dirs: StackDirs, c: Component): NodeJS.ProcessEnv {
  const p = ENV_PREFIX[c];
  const env: NodeJS.ProcessEnv = { ...process.env, [`${p}STATE_DIR`]: path.resolve(dirs.stateDir), [`${p}RUN_DIR`]: path.resolve(dirs.runDir) };
  if (c === 'server') env[`${p}LISTEN`] = dirs.listen;
  const slot = c === 'ublk-manager' ? activeUblkSlot(dirs) : '';
  if (slot) {
    env[`${p}SLOT`] = slot;
    env[`${p}LISTEN`] = unixAddress(ublkSlotSocket(dirs, slot));
  }
  return env;
}

/** Options of {@link startComponent}. */
export interface StartOptions {
  /** a checkout of sandnode (with a build) to run the component from; default: this build */
  buildDir?: string;
  /** how long to wait for it to answer, ms (default {@link DEFAULT_START_TIMEOUT_MS}) */
  timeoutMs?: number;
}

/**
 * startComponent spawns a component detached (its own session, stdio to its log file, so it
 * outlives the CLI) and waits until it answers GetVersion with its pid. Idempotent: a running
 * component is left alone (started: false). Throws Error naming the log when it exits first
 * or does not answer within opts.timeoutMs.
 */
export async function startComponent(dirs: StackDirs, c: Component, opts: StartOptions = {}): Promise<{ pid: number; started: boolean }> {
  const running = findRunning(dirs, c);
  if (running && (await getVersion(dirs, c))) return { pid: running.pid, started: false };
  const timeoutMs = opts.timeoutMs ?? DEFAULT_START_TIMEOUT_MS;
  const log = logFile(dirs, c);
  const d = spawnDaemon({ script: mainScript(c, opts.buildDir), node: nodeFor(opts.buildDir), env: componentEnv(dirs, c), logPath: log });
  writePidFile(dirs, c, d.pid);
  await waitForDaemon(
    d,
    async () => {
      // a ublk-manager of a slot listens on its own socket: point the stable address at it once it answers there
      const slot = c === 'ublk-manager' ? activeUblkSlot(dirs) : '';
      if (slot && (await getVersion(dirs, c, START_PROBE_TIMEOUT_MS))?.pid !== d.pid) {
        const own = await versionAt(unixAddress(ublkSlotSocket(dirs, slot)), START_PROBE_TIMEOUT_MS);
        if (own?.pid === d.pid) pointUblkAddress(dirs, slot);
      }
      const v = await getVersion(dirs, c, START_PROBE_TIMEOUT_MS);
      return v && v.pid === d.pid ? true : undefined;
    },
    {
      timeoutMs,
      onExit: (code) => new Error(`${c} exited with code ${code} while starting; see ${log}:\n${tail(log)}`),
      onTimeout: () => new Error(`${c} did not answer within ${timeoutMs} ms; see ${log}`),
    },
  );
  return { pid: d.pid, started: true };
}

/**
 * stopComponent sends SIGTERM (SIGKILL after timeoutMs, ms) and waits for the exit; removes the
 * pid file. Returns whether the component was running.
 */
export async function stopComponent(dirs: StackDirs, c: Component, timeoutMs = DEFAULT_STOP_TIMEOUT_MS): Promise<boolean> {
  const r = findRunning(dirs, c);
  const stopped = r ? await stopProcess(r.pid, { timeoutMs, killAfterTimeout: true }) : false;
  rmSync(pidFile(dirs, c), { force: true });
  return stopped;
}

/** killComponent sends SIGKILL and waits for the exit (the demo and tests prove adoption with it); returns the pid, undefined when it was not running. */
export async function killComponent(dirs: StackDirs, c: Component): Promise<number | undefined> {
  const r = findRunning(dirs, c);
  if (!r) return undefined;
  await stopProcess(r.pid, { signal: 'SIGKILL' });
  return r.pid;
}
