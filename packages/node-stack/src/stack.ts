/**
 * The local stack: start and stop the node's daemons (vmm-supervisor, ublk-manager, server) as
 * separate background processes, each with a pid file and a log in the runtime dir. Used by
 * `sandnode up|down` and the demo.
 */
import { readFileSync, rmSync } from 'node:fs';
import path from 'node:path';
import { checkTrustedDirs, prepareTrustedDirs, processState, unixAddress } from '@sandnode/shared';
import { COMPONENTS, findRunning, getVersion, logFile, mainScript, networkEnv, nodeFor, pidFile, versionAt, writePidFile, type Component, type StackDirs } from './components';
import { DAEMON_POLL_MS, sleep, spawnDaemon, stopProcess, tail, waitForDaemon } from './daemon-process';
import { nodeSettings } from './node-settings';
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

/**
 * componentEnv is this process's environment plus the component's dirs, the node's network
 * settings (dirs.network), the node's recorded settings when this process gives none
 * (node-settings.ts) and, for ublk-manager, its slot. Throws readNodeSettings's Error on a bad record.
 */
function componentEnv(dirs: StackDirs, c: Component): NodeJS.ProcessEnv {
  const p = ENV_PREFIX[c];
  // an env var this process has (a test's startNode env, an operator's) wins over dirs.network.
  // The /metrics address is the component's own config (its default, or what its config or env
  // names): never the address a previous process had, which a daemon of another build (an
  // upgrade or rollback with --from-build, in a slot beside the old one) would meet in use, and
  // builds before 0.3.0 exit on EADDRINUSE
  const env: NodeJS.ProcessEnv = {
    ...networkEnv(c, dirs.network),
    ...nodeSettings(dirs.stateDir, process.env).env,
    ...process.env,
    [`${p}STATE_DIR`]: path.resolve(dirs.stateDir),
    [`${p}RUN_DIR`]: path.resolve(dirs.runDir),
  };
  if (c === 'server') env[`${p}LISTEN`] = dirs.listen;
  const slot = c === 'ublk-manager' ? activeUblkSlot(dirs) : '';
  if (slot) {
    env[`${p}SLOT`] = slot;
    env[`${p}LISTEN`] = unixAddress(ublkSlotSocket(dirs, slot));
  }
  return env;
}

/**
 * checkStackDirs throws ConfigError (from checkTrustedDirs, @sandnode/shared: naming the dir,
 * its owner and mode) unless dirs.stateDir and dirs.runDir and every dir above them are root's
 * and writable only by root (a sticky parent like /tmp aside).
 */
export function checkStackDirs(dirs: StackDirs): void {
  checkTrustedDirs([
    { key: 'stateDir', dir: dirs.stateDir },
    { key: 'runDir', dir: dirs.runDir },
  ]);
}

/** prepareStackDirs makes dirs.runDir and dirs.stateDir when missing, then checks them (prepareTrustedDirs, @sandnode/shared). */
export function prepareStackDirs(dirs: StackDirs): void {
  prepareTrustedDirs(dirs);
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
 * component is left alone (started: false). When the pid file names a live process of the
 * component (same pid and start time) that does not answer yet, it never starts a second one:
 * it waits up to opts.timeoutMs for that one to answer and else throws Error naming its pid and
 * /proc state (e.g. "T": SIGSTOPped), leaving the pid file as it is. A component it starts that
 * exits first or does not answer within opts.timeoutMs is killed, its pid file removed, and
 * Error naming the log is thrown. Before anything is read or written in the dirs, dirs.stateDir
 * and dirs.runDir must be root's alone (checkTrustedDirs, @sandnode/shared): else ConfigError
 * naming the dir, its owner and mode.
 */
export async function startComponent(dirs: StackDirs, c: Component, opts: StartOptions = {}): Promise<{ pid: number; started: boolean }> {
  prepareStackDirs(dirs);
  const timeoutMs = opts.timeoutMs ?? DEFAULT_START_TIMEOUT_MS;
  const running = findRunning(dirs, c);
  if (running) {
    const answered = await waitForRunning(dirs, c, running.pid, timeoutMs);
    if (answered) return { pid: running.pid, started: false };
    // still that live process: refuse (one that exited while we waited is replaced below)
    if (findRunning(dirs, c)?.pid === running.pid) {
      const state = processState(running.pid) ?? '?';
      const hint = state === 'T' || state === 't' ? ': stopped? `kill -CONT` it' : '';
      throw new Error(`${c} pid ${running.pid} is running but does not answer within ${timeoutMs} ms (state ${state}${hint}): kill it or wait; no second ${c} was started (see ${logFile(dirs, c)})`);
    }
  }
  const log = logFile(dirs, c);
  const d = spawnDaemon({ script: mainScript(c, opts.buildDir), node: nodeFor(opts.buildDir), env: componentEnv(dirs, c), logPath: log });
  writePidFile(dirs, c, d.pid);
  try {
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
        onTimeout: () => new Error(`${c} did not answer within ${timeoutMs} ms and was killed; see ${log}`),
      },
    );
  } catch (err) {
    // no half-started daemon and no pid file naming it stay behind
    await stopProcess(d.pid, { signal: 'SIGKILL' });
    removePidFileOf(dirs, c, d.pid);
    throw err;
  }
  return { pid: d.pid, started: true };
}

/**
 * waitForRunning polls (every DAEMON_POLL_MS) until the component answers at its stable address
 * (true), the process pid is gone (false) or timeoutMs passes (false).
 */
async function waitForRunning(dirs: StackDirs, c: Component, pid: number, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await getVersion(dirs, c, START_PROBE_TIMEOUT_MS)) return true;
    if (findRunning(dirs, c)?.pid !== pid || Date.now() > deadline) return false;
    await sleep(DAEMON_POLL_MS);
  }
}

/** removePidFileOf removes the component's pid file when it still names pid (another `up` may have written its own since). */
function removePidFileOf(dirs: StackDirs, c: Component, pid: number): void {
  try {
    if (Number(readFileSync(pidFile(dirs, c), 'utf8').trim().split(' ')[0]) === pid) rmSync(pidFile(dirs, c), { force: true });
  } catch {
    /* no pid file */
  }
}

/** What {@link startStack} did with one component. */
export interface StartedComponent {
  name: Component;
  pid: number;
  /** false: it was already running and answering before this call */
  started: boolean;
  /** how long its start (or the check that it runs) took, ms */
  ms: number;
}

/** The start and stop {@link startStack} uses (tests pass their own). */
export interface StackOps {
  start(c: Component): Promise<{ pid: number; started: boolean }>;
  /** stop the component when it is still process pid (the one this call started); false: it is not (left alone) */
  stop(c: Component, pid: number): Promise<boolean>;
}

/**
 * startStack starts the components in COMPONENTS order (`sandnode up`; the CLI holds the node
 * lock, node-lock.ts, around it). When one fails it undoes this call: the processes this call
 * started are stopped in reverse order, each only while its pid file still names it (those that
 * ran before the call, or replaced one since, are left alone), and it throws Error with the
 * failure and what was undone. Undoing the vmm-supervisor is right too: one this call started
 * did not run before, and stopping it only stops the daemon (the sandboxes' containers keep
 * running and the next `up` adopts them, as after `down`), so the node is back where it was.
 */
export async function startStack(dirs: StackDirs, opts: StartOptions = {}, ops?: StackOps): Promise<StartedComponent[]> {
  const o: StackOps = ops ?? { start: (c) => startComponent(dirs, c, opts), stop: async (c, pid) => findRunning(dirs, c)?.pid === pid && (await stopComponent(dirs, c)) };
  const out: StartedComponent[] = [];
  for (const c of COMPONENTS) {
    const t0 = Date.now();
    try {
      const r = await o.start(c);
      out.push({ name: c, pid: r.pid, started: r.started, ms: Date.now() - t0 });
    } catch (err) {
      const undone: string[] = [];
      for (const s of out.filter((x) => x.started).reverse()) {
        const ok = await o.stop(s.name, s.pid).catch((e: Error) => `${s.name} pid ${s.pid} could not be stopped: ${e.message}`);
        undone.push(typeof ok === 'string' ? ok : ok ? `stopped ${s.name} pid ${s.pid}` : `${s.name} pid ${s.pid} had already exited or been replaced: left alone`);
      }
      const kept = out.filter((x) => !x.started).map((x) => `${x.name} pid ${x.pid}`);
      throw new Error(
        [(err as Error).message, `up undone: ${undone.join('; ') || 'nothing this up started'}`, ...(kept.length ? [`left running (they ran before this up): ${kept.join(', ')}`] : [])].join('\n'),
        { cause: err },
      );
    }
  }
  return out;
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
