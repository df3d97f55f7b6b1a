/**
 * The local stack: start, find, stop and purge the node's daemons (vmm-supervisor,
 * ublk-manager, server) as separate background processes, each with a pid file and a log in
 * the runtime dir. Used by `sandnode up|down|status` and the demo.
 */
import { spawn } from 'node:child_process';
import { existsSync, fsyncSync, mkdirSync, openSync, readFileSync, readdirSync, renameSync, rmSync, symlinkSync, writeFileSync, writeSync, closeSync } from 'node:fs';
import path from 'node:path';
import { askVersion, processStartTicks, run, socketPath, unixAddress } from '@sandnode/shared';
import type { GetVersionResponse } from '@sandnode/shared/proto/common/v1/version';

export type Component = 'vmm-supervisor' | 'ublk-manager' | 'server';
/** Start order; stop order is the reverse. */
export const COMPONENTS: Component[] = ['vmm-supervisor', 'ublk-manager', 'server'];

/** Default time `up` waits for a component to answer, ms. */
export const DEFAULT_START_TIMEOUT_MS = 60_000;
/** Default time `down` waits after SIGTERM before SIGKILL, ms. */
export const DEFAULT_STOP_TIMEOUT_MS = 15_000;

export interface StackDirs {
  stateDir: string;
  runDir: string;
  /** the server's TCP listen address ("127.0.0.1:7070"; "" disables TCP) */
  listen: string;
}

const PKG: Record<Component, string> = {
  'vmm-supervisor': '@sandnode/vmm-supervisor',
  'ublk-manager': '@sandnode/ublk-manager',
  server: '@sandnode/server',
};
const ENV_PREFIX: Record<Component, string> = {
  'vmm-supervisor': 'SANDNODE_VMM_SUPERVISOR_',
  'ublk-manager': 'SANDNODE_UBLK_MANAGER_',
  server: 'SANDNODE_SERVER_',
};

/** mainScript is the built entry point of a component in this build (or in buildDir). */
export function mainScript(c: Component, buildDir?: string): string {
  if (buildDir) return path.join(path.resolve(buildDir), 'services', c, 'dist', 'main.js');
  return path.join(path.dirname(require.resolve(`${PKG[c]}/package.json`)), 'dist', 'main.js');
}

/** The file in a build's node_modules naming the Node it was built for: `{node, version, modules}` (deploy/host-setup.sh writes it). */
export const NODE_MARKER = path.join('node_modules', '.sandnode-node.json');

/**
 * nodeFor is the Node binary that runs the daemons of a build: for another build (buildDir),
 * the one its node_modules were built for (its NODE_MARKER, e.g. a release built on Node 20),
 * when that binary exists; else the Node this CLI runs on (process.execPath).
 */
export function nodeFor(buildDir?: string): string {
  if (!buildDir) return process.execPath;
  try {
    const m = JSON.parse(readFileSync(path.join(path.resolve(buildDir), NODE_MARKER), 'utf8')) as { node?: unknown };
    if (typeof m.node === 'string' && existsSync(m.node)) return m.node;
  } catch {
    /* no marker: a build made without deploy/host-setup.sh */
  }
  return process.execPath;
}

export function pidFile(dirs: StackDirs, c: Component): string {
  return path.join(path.resolve(dirs.runDir), `${c}.pid`);
}
export function logFile(dirs: StackDirs, c: Component): string {
  return path.join(path.resolve(dirs.runDir), 'logs', `${c}.log`);
}
export function componentAddress(dirs: StackDirs, c: Component): string {
  return unixAddress(socketPath(dirs.runDir, c));
}

/** A running component as found from its pid file. */
export interface RunningComponent {
  name: Component;
  pid: number;
}

/** findRunning returns the component's pid when its pid file names a live process of it. */
export function findRunning(dirs: StackDirs, c: Component): RunningComponent | undefined {
  const f = pidFile(dirs, c);
  if (!existsSync(f)) return undefined;
  const [pidStr, ticksStr] = readFileSync(f, 'utf8').trim().split(' ');
  const pid = Number(pidStr);
  const ticks = processStartTicks(pid);
  if (ticks === undefined || (ticksStr && Number(ticksStr) !== ticks)) return undefined;
  return { name: c, pid };
}

/** getVersion asks a component for its version; undefined when it does not answer. */
export async function getVersion(dirs: StackDirs, c: Component, timeoutMs = 1000): Promise<GetVersionResponse | undefined> {
  return versionAt(componentAddress(dirs, c), timeoutMs);
}

/** versionAt asks whatever serves address for its version; undefined when nothing answers. */
export async function versionAt(address: string, timeoutMs = 1000): Promise<GetVersionResponse | undefined> {
  return askVersion(address, { timeoutMs, retryAttempts: 1 }).catch(() => undefined);
}

/**
 * The ublk-manager slot that owns the devices ("" before the first device handover), kept in
 * the state dir so that a restart of the node starts the right slot.
 */
export function activeUblkSlot(dirs: StackDirs): '' | 'a' | 'b' {
  try {
    const v = readFileSync(path.join(path.resolve(dirs.stateDir), 'ublk-manager', 'active-slot'), 'utf8').trim();
    return v === 'a' || v === 'b' ? v : '';
  } catch {
    return '';
  }
}

/** setActiveUblkSlot records the slot that owns the devices (fsync'd). */
export function setActiveUblkSlot(dirs: StackDirs, slot: 'a' | 'b'): void {
  const dir = path.join(path.resolve(dirs.stateDir), 'ublk-manager');
  mkdirSync(dir, { recursive: true });
  const tmp = path.join(dir, 'active-slot.tmp');
  const fd = openSync(tmp, 'w');
  try {
    writeSync(fd, `${slot}\n`);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  renameSync(tmp, path.join(dir, 'active-slot'));
}

/** pointUblkAddress makes <runDir>/ublk-manager.sock a link to the slot's own socket. */
export function pointUblkAddress(dirs: StackDirs, slot: 'a' | 'b'): void {
  const stable = socketPath(dirs.runDir, 'ublk-manager');
  const tmp = `${stable}.${process.pid}.tmp`;
  rmSync(tmp, { force: true });
  symlinkSync(`ublk-manager-${slot}.sock`, tmp);
  renameSync(tmp, stable);
}

function componentEnv(dirs: StackDirs, c: Component): NodeJS.ProcessEnv {
  const p = ENV_PREFIX[c];
  const env: NodeJS.ProcessEnv = { ...process.env, [`${p}STATE_DIR`]: path.resolve(dirs.stateDir), [`${p}RUN_DIR`]: path.resolve(dirs.runDir) };
  if (c === 'server') env[`${p}LISTEN`] = dirs.listen;
  const slot = c === 'ublk-manager' ? activeUblkSlot(dirs) : '';
  if (slot) {
    env[`${p}SLOT`] = slot;
    env[`${p}LISTEN`] = unixAddress(path.join(path.resolve(dirs.runDir), `ublk-manager-${slot}.sock`));
  }
  return env;
}

/**
 * startComponent spawns a component detached (its own session, stdio to its log file, so it
 * outlives the CLI) and waits until it answers GetVersion. Idempotent: a running component is
 * left alone. Returns its pid.
 */
export async function startComponent(dirs: StackDirs, c: Component, opts: { buildDir?: string; timeoutMs?: number } = {}): Promise<{ pid: number; started: boolean }> {
  const running = findRunning(dirs, c);
  if (running && (await getVersion(dirs, c))) return { pid: running.pid, started: false };
  mkdirSync(path.dirname(logFile(dirs, c)), { recursive: true });
  const out = openSync(logFile(dirs, c), 'a');
  const child = spawn(nodeFor(opts.buildDir), [mainScript(c, opts.buildDir)], {
    detached: true,
    stdio: ['ignore', out, out],
    env: componentEnv(dirs, c),
    cwd: process.cwd(),
  });
  closeSync(out);
  child.unref();
  const pid = child.pid;
  if (!pid) throw new Error(`could not start ${c}`);
  let exited: number | null | undefined;
  child.once('exit', (code) => (exited = code));
  const deadline = Date.now() + (opts.timeoutMs ?? DEFAULT_START_TIMEOUT_MS);
  writeFileSync(pidFile(dirs, c), `${pid} ${processStartTicks(pid) ?? ''}\n`);
  for (;;) {
    if (exited !== undefined) throw new Error(`${c} exited with code ${exited} while starting; see ${logFile(dirs, c)}:\n${tail(logFile(dirs, c))}`);
    const slot = c === 'ublk-manager' ? activeUblkSlot(dirs) : '';
    if (slot && (await getVersion(dirs, c, 500).catch(() => undefined))?.pid !== pid) {
      const own = await versionAt(unixAddress(path.join(path.resolve(dirs.runDir), `ublk-manager-${slot}.sock`)), 500);
      if (own?.pid === pid) pointUblkAddress(dirs, slot);
    }
    const v = await getVersion(dirs, c, 500);
    if (v && v.pid === pid) return { pid, started: true };
    if (Date.now() > deadline) throw new Error(`${c} did not answer within ${opts.timeoutMs ?? DEFAULT_START_TIMEOUT_MS} ms; see ${logFile(dirs, c)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** tail returns the last lines of a log file. */
export function tail(file: string, lines = 15): string {
  try {
    return readFileSync(file, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
  } catch {
    return '';
  }
}

/** stopComponent sends SIGTERM (SIGKILL after timeoutMs) and waits for the exit. */
export async function stopComponent(dirs: StackDirs, c: Component, timeoutMs = DEFAULT_STOP_TIMEOUT_MS): Promise<boolean> {
  const r = findRunning(dirs, c);
  if (!r) {
    rmSync(pidFile(dirs, c), { force: true });
    return false;
  }
  const ticks = processStartTicks(r.pid);
  const alive = () => ticks !== undefined && processStartTicks(r.pid) === ticks;
  process.kill(r.pid, 'SIGTERM');
  const deadline = Date.now() + timeoutMs;
  while (alive() && Date.now() < deadline) await new Promise((res) => setTimeout(res, 50));
  if (alive()) process.kill(r.pid, 'SIGKILL');
  while (alive()) await new Promise((res) => setTimeout(res, 20));
  rmSync(pidFile(dirs, c), { force: true });
  return true;
}

/** killComponent sends SIGKILL (used by the demo and tests to prove adoption). */
export async function killComponent(dirs: StackDirs, c: Component): Promise<number | undefined> {
  const r = findRunning(dirs, c);
  if (!r) return undefined;
  const ticks = processStartTicks(r.pid);
  process.kill(r.pid, 'SIGKILL');
  while (processStartTicks(r.pid) === ticks) await new Promise((res) => setTimeout(res, 10));
  return r.pid;
}

/** What `down --purge` removed. */
export interface PurgeReport {
  containers: string[];
  mounts: string[];
  loopDevices: string[];
  dirs: string[];
}

/**
 * purgeNode removes what the stack left on the host below its dirs: runc containers under
 * <runDir>/runc, mounts below runDir/stateDir (deepest first), loop devices whose backing file
 * is below stateDir, then both dirs. Only for `down --purge`, after the daemons stopped.
 */
export async function purgeNode(dirs: StackDirs): Promise<PurgeReport> {
  const runDir = path.resolve(dirs.runDir);
  const stateDir = path.resolve(dirs.stateDir);
  const report: PurgeReport = { containers: [], mounts: [], loopDevices: [], dirs: [] };
  const runcRoot = path.join(runDir, 'runc');
  if (existsSync(runcRoot)) {
    try {
      const list = JSON.parse((await run('runc', ['--root', runcRoot, 'list', '--format', 'json'])).stdout || '[]') as { id: string }[] | null;
      for (const ct of list ?? []) {
        await run('runc', ['--root', runcRoot, 'delete', '--force', ct.id]).catch(() => undefined);
        report.containers.push(ct.id);
      }
    } catch {
      /* runc missing: nothing of ours can run */
    }
  }
  for (const m of mountsBelow([runDir, stateDir])) {
    await run('umount', [m]).catch(() => run('umount', ['-l', m]));
    report.mounts.push(m);
  }
  for (const dev of loopDevicesBelow(stateDir)) {
    await run('losetup', ['-d', dev]).catch(() => undefined);
    report.loopDevices.push(dev);
  }
  for (const d of [runDir, stateDir]) {
    if (existsSync(d)) {
      rmSync(d, { recursive: true, force: true });
      report.dirs.push(d);
    }
  }
  return report;
}

/** mountsBelow lists mount points below any of roots, deepest first (from /proc/self/mountinfo). */
export function mountsBelow(roots: string[]): string[] {
  const out: string[] = [];
  for (const line of readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    const mp = line.split(' ')[4]?.replace(/\\040/g, ' ');
    if (mp && roots.some((r) => mp === r || mp.startsWith(`${r}/`))) out.push(mp);
  }
  return out.sort((a, b) => b.length - a.length);
}

/** loopDevicesBelow lists loop devices whose backing file is below root (from /sys/block). */
export function loopDevicesBelow(root: string): string[] {
  const out: string[] = [];
  let names: string[] = [];
  try {
    names = readdirSync('/sys/block').filter((n) => n.startsWith('loop'));
  } catch {
    return out;
  }
  for (const n of names) {
    try {
      const backing = readFileSync(`/sys/block/${n}/loop/backing_file`, 'utf8').trim().replace(/ \(deleted\)$/, '');
      if (backing === root || backing.startsWith(`${root}/`)) out.push(`/dev/${n}`);
    } catch {
      /* not attached */
    }
  }
  return out;
}

/**
 * sandnodeProcesses lists live processes running a sandnode component main.js whose
 * environment names runDir (the stack of these dirs, of any build).
 */
export function sandnodeProcesses(runDir: string): { pid: number; cmd: string }[] {
  const marker = `RUN_DIR=${path.resolve(runDir)}`;
  const out: { pid: number; cmd: string }[] = [];
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const cmd = readFileSync(`/proc/${d}/cmdline`, 'utf8').split('\0').join(' ').trim();
      if (!/services\/(vmm-supervisor|ublk-manager|server)\/dist\/main\.js/.test(cmd)) continue;
      if (readFileSync(`/proc/${d}/environ`, 'utf8').split('\0').some((e) => e.endsWith(marker))) out.push({ pid: Number(d), cmd });
    } catch {
      /* gone */
    }
  }
  return out;
}
