/**
 * The one daemon fixture: a sandnode daemon (`process.execPath main ...args`) serving gRPC on
 * a unix socket, started with its env config, logging to a file, ready once it answers
 * GetVersion. Every daemon a test file started and did not stop is SIGKILLed in an afterAll.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, openSync, readFileSync, rmSync } from 'node:fs';
import path from 'node:path';
import { createSandnodeChannel, createServiceClient } from '@sandnode/shared';
import { VersionServiceDefinition } from '@sandnode/shared/proto/common/v1/version';
import { makeTempDir } from './temp-dir';
import { waitFor } from './wait-for';

/** How long {@link startDaemon} waits for GetVersion by default, ms. */
export const DEFAULT_READY_MS = 20_000;
/** How long {@link RunningDaemon.stop} waits after SIGTERM before SIGKILL by default, ms. */
export const DEFAULT_STOP_MS = 8_000;

export interface DaemonOptions {
  /** the script node runs (e.g. `services/vmm-supervisor/dist/main.js`, a podd bundle) */
  main: string;
  /** arguments after main, e.g. `['--socket', path]` */
  args?: string[];
  /** env vars set on top of process.env (undefined: removed) */
  env?: Record<string, string | undefined>;
  /** the unix socket path the daemon serves on (the address is `unix://<socket>`) */
  socket: string;
  /** ms to wait for GetVersion to answer (default {@link DEFAULT_READY_MS}) */
  readyTimeoutMs?: number;
  /** file stdout and stderr are appended to; default `<a temp dir>/daemon.log`, removed after the file's tests */
  logFile?: string;
  /** the daemon's cwd (default this process's) */
  cwd?: string;
}

/** How a daemon process ended. */
export interface DaemonExit {
  code: number | null;
  signal: NodeJS.Signals | null;
}

export interface RunningDaemon {
  pid: number;
  /** `unix://<socket>` */
  address: string;
  socket: string;
  logFile: string;
  /** resolves when the process has exited (by itself or signalled) */
  exited: Promise<DaemonExit>;
  /** whether the process is still running */
  running(): boolean;
  /** stop sends SIGTERM, SIGKILL after graceMs (default {@link DEFAULT_STOP_MS}), and returns how it ended */
  stop(graceMs?: number): Promise<DaemonExit>;
  /** kill sends signal (default SIGKILL) and returns how the process ended */
  kill(signal?: NodeJS.Signals): Promise<DaemonExit>;
  /** log returns the last maxBytes (default 8 KiB) of the daemon's log so far */
  log(maxBytes?: number): string;
}

const started = new Set<{ proc: ChildProcess; exited: Promise<DaemonExit> }>();
const tempDirs: string[] = [];

// One afterAll per test file (jest gives each file its own module registry): kill what a test forgot.
if (typeof afterAll === 'function') {
  try {
    afterAll(async () => {
      for (const d of started) {
        if (d.proc.exitCode === null && d.proc.signalCode === null) d.proc.kill('SIGKILL');
        await d.exited;
      }
      started.clear();
      for (const dir of tempDirs.splice(0)) rmSync(dir, { recursive: true, force: true });
    });
  } catch {
    /* loaded inside a test: no hook; the caller stops its daemons itself */
  }
}

/** The daemons' metricsListen variables set to "" (off). */
const NO_METRICS = { SANDNODE_SERVER_METRICS_LISTEN: '', SANDNODE_VMM_SUPERVISOR_METRICS_LISTEN: '', SANDNODE_UBLK_MANAGER_METRICS_LISTEN: '' };

/**
 * startDaemon spawns `process.execPath main ...args` with process.env + env, stdout and stderr
 * appended to logFile, and waits (waitFor) until GetVersion answers on `unix://<socket>`.
 * Throws Error with the log tail when the process exits first or is not ready within
 * readyTimeoutMs (and then kills it).
 */
export async function startDaemon(opts: DaemonOptions): Promise<RunningDaemon> {
  let logFile = opts.logFile;
  if (!logFile) {
    const dir = makeTempDir('daemon');
    tempDirs.push(dir);
    logFile = path.join(dir, 'daemon.log');
  }
  // /metrics is on by default on fixed ports (9464-9466): off for a lone test daemon unless opts.env names an address, so parallel tests do not fight for them
  const env: NodeJS.ProcessEnv = { ...process.env, ...NO_METRICS };
  for (const [k, v] of Object.entries(opts.env ?? {})) {
    if (v === undefined) delete env[k];
    else env[k] = v;
  }
  const fd = openSync(logFile, 'a');
  let proc: ChildProcess;
  try {
    proc = spawn(process.execPath, [opts.main, ...(opts.args ?? [])], { stdio: ['ignore', fd, fd], env, cwd: opts.cwd });
  } finally {
    closeSync(fd);
  }
  let exit: DaemonExit | undefined;
  const exited = new Promise<DaemonExit>((resolve) =>
    proc.once('exit', (code, signal) => {
      exit = { code, signal };
      resolve(exit);
    }),
  );
  const entry = { proc, exited };
  started.add(entry);
  const file = logFile;
  const log = (maxBytes = 8192): string => {
    try {
      return readFileSync(file, 'utf8').slice(-maxBytes);
    } catch {
      return '';
    }
  };
  const kill = async (signal: NodeJS.Signals = 'SIGKILL'): Promise<DaemonExit> => {
    if (!exit) proc.kill(signal);
    return exited;
  };
  const address = `unix://${opts.socket}`;
  const readyMs = opts.readyTimeoutMs ?? DEFAULT_READY_MS;
  const channel = createSandnodeChannel(address);
  const version = createServiceClient(VersionServiceDefinition, channel, { timeoutMs: 1000, retryAttempts: 1 });
  let how: string;
  try {
    how = await waitFor(`${path.basename(opts.main)} to answer GetVersion on ${opts.socket}`, async () => (exit ? 'exited' : (await version.getVersion({})) && 'ready'), readyMs, 50);
  } catch (err) {
    await kill();
    throw new Error(`${(err as Error).message}; log:\n${log()}`, { cause: err });
  } finally {
    channel.close();
  }
  if (how === 'exited') throw new Error(`${opts.main} exited at start (${JSON.stringify(exit)}); log:\n${log()}`);
  return {
    pid: proc.pid!,
    address,
    socket: opts.socket,
    logFile: file,
    exited,
    running: () => !exit,
    kill,
    async stop(graceMs = DEFAULT_STOP_MS) {
      if (exit) return exit;
      proc.kill('SIGTERM');
      const t = setTimeout(() => proc.kill('SIGKILL'), graceMs);
      try {
        return await exited;
      } finally {
        clearTimeout(t);
      }
    },
    log,
  };
}
