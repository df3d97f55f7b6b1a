/**
 * The node's daemons as the operator's tools see them: their names and start order, the dirs
 * of a stack, where each one's entry point, pid file, log and socket are, and whether it runs
 * and answers.
 */
import { closeSync, constants, existsSync, lstatSync, openSync, readFileSync, rmSync, writeSync } from 'node:fs';
import path from 'node:path';
import { askVersion, processStartTicks, socketPath, unixAddress } from '@sandnode/shared';
import type { GetVersionResponse } from '@sandnode/shared/proto/common/v1/version';

/** A daemon of the node that the stack starts and stops. */
export type Component = 'vmm-supervisor' | 'ublk-manager' | 'server';
/** Start order; stop order is the reverse. */
export const COMPONENTS: Component[] = ['vmm-supervisor', 'ublk-manager', 'server'];

/** Default time one GetVersion may take when the tools ask whether a daemon answers, ms. */
export const DEFAULT_VERSION_TIMEOUT_MS = 1000;

/** The dirs and listen address of one node's stack. */
export interface StackDirs {
  /** the state dir (records, images, templates); relative paths resolve against the cwd */
  stateDir: string;
  /** the runtime dir (sockets, pid files, logs, sandbox dirs) */
  runDir: string;
  /** the server's TCP listen address ("127.0.0.1:7070"; "": none, the default) */
  listen: string;
  /**
   * the node's network settings, given to the daemons at every start (absent: the daemons'
   * defaults, which give a node network: `sandnode up`)
   */
  network?: NodeNetworkSettings;
}

/**
 * A node's network settings (docs/network.md) as the stack passes them to the daemons (env of
 * their config keys): the supervisor's `network`, `networkPool`, `networkTag`, `dnsPort`,
 * `egressProxyPort` and the server's `ingressListen`. A field left out is the daemon's default.
 */
export interface NodeNetworkSettings {
  /** false: every sandbox is loopback only (the supervisor's key `network`) */
  enabled: boolean;
  /** the sandboxes' address pool, a CIDR */
  pool?: string;
  /** prefix of the node's interface and nftables names (1..4 of [0-9a-z]) */
  tag?: string;
  dnsPort?: number;
  egressProxyPort?: number;
  /** the server's ingress listener, "host:port" ("" off) */
  ingressListen?: string;
}

/** networkEnv is the env of the daemon c's network keys for settings n (empty without settings). */
export function networkEnv(c: Component, n: NodeNetworkSettings | undefined): Record<string, string> {
  if (!n) return {};
  const out: Record<string, string> = {};
  if (c === 'vmm-supervisor') {
    const p = 'SANDNODE_VMM_SUPERVISOR_';
    out[`${p}NETWORK`] = String(n.enabled);
    if (n.pool !== undefined) out[`${p}NETWORK_POOL`] = n.pool;
    if (n.tag !== undefined) out[`${p}NETWORK_TAG`] = n.tag;
    if (n.dnsPort !== undefined) out[`${p}DNS_PORT`] = String(n.dnsPort);
    if (n.egressProxyPort !== undefined) out[`${p}EGRESS_PROXY_PORT`] = String(n.egressProxyPort);
  }
  if (c === 'server' && n.ingressListen !== undefined) out.SANDNODE_SERVER_INGRESS_LISTEN = n.ingressListen;
  return out;
}

/** The workspace package of each component (its `dist/main.js` is the entry point). */
const PKG: Record<Component, string> = {
  'vmm-supervisor': '@sandnode/vmm-supervisor',
  'ublk-manager': '@sandnode/ublk-manager',
  server: '@sandnode/server',
};

/** The file in a build's node_modules naming the Node it was built for: `{node, version, modules}` (deploy/host-setup.sh writes it). */
export const NODE_MARKER = path.join('node_modules', '.sandnode-node.json');

/**
 * nodeFor is the Node binary that runs the daemons of a build: for another build (buildDir),
 * the one its node_modules were built for (its NODE_MARKER, e.g. a release built on Node 20),
 * when that binary exists; else the Node this process runs on (process.execPath).
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

/** mainScript is the built entry point of a component in this build (or in buildDir, a checkout), an absolute path. */
export function mainScript(c: Component, buildDir?: string): string {
  if (buildDir) return path.join(path.resolve(buildDir), 'services', c, 'dist', 'main.js');
  return path.join(path.dirname(require.resolve(`${PKG[c]}/package.json`)), 'dist', 'main.js');
}

/** pidFile is `<runDir>/<component>.pid`: "PID START_TICKS\n" of the running daemon. */
export function pidFile(dirs: StackDirs, c: Component): string {
  return path.join(path.resolve(dirs.runDir), `${c}.pid`);
}

/** logFile is `<runDir>/logs/<component>.log`, which the daemon's stdout and stderr are appended to. */
export function logFile(dirs: StackDirs, c: Component): string {
  return path.join(path.resolve(dirs.runDir), 'logs', `${c}.log`);
}

/** componentAddress is the component's stable gRPC address, "unix:///abs/<runDir>/<component>.sock". */
export function componentAddress(dirs: StackDirs, c: Component): string {
  return unixAddress(socketPath(dirs.runDir, c));
}

/** writePidFile records pid (with its start time, so that a reused pid is not taken for it) as the component's. */
export function writePidFile(dirs: StackDirs, c: Component, pid: number): void {
  // a fresh file, never through a symlink left at that name
  rmSync(pidFile(dirs, c), { force: true });
  const fd = openSync(pidFile(dirs, c), constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o644);
  try {
    writeSync(fd, `${pid} ${processStartTicks(pid) ?? ''}\n`);
  } finally {
    closeSync(fd);
  }
}

/** A running component as found from its pid file. */
export interface RunningComponent {
  name: Component;
  /** its host pid */
  pid: number;
}

/** findRunning returns the component's pid when its pid file (a regular file owned by this user) names a live process (same start time); else undefined. */
export function findRunning(dirs: StackDirs, c: Component): RunningComponent | undefined {
  const f = pidFile(dirs, c);
  if (!existsSync(f)) return undefined;
  // only a pid file this user wrote (a regular file of its own, not a symlink) names a process to signal
  const st = lstatSync(f, { throwIfNoEntry: false });
  if (!st?.isFile() || st.uid !== process.geteuid?.()) return undefined;
  const [pidStr, ticksStr] = readFileSync(f, 'utf8').trim().split(' ');
  const pid = Number(pidStr);
  const ticks = processStartTicks(pid);
  if (ticks === undefined || (ticksStr && Number(ticksStr) !== ticks)) return undefined;
  return { name: c, pid };
}

/** getVersion asks a component at its stable address for its version (one attempt, timeoutMs); undefined when it does not answer. */
export async function getVersion(dirs: StackDirs, c: Component, timeoutMs = DEFAULT_VERSION_TIMEOUT_MS): Promise<GetVersionResponse | undefined> {
  return versionAt(componentAddress(dirs, c), timeoutMs);
}

/** versionAt asks whatever serves address for its version (one attempt, timeoutMs); undefined when nothing answers. */
export async function versionAt(address: string, timeoutMs = DEFAULT_VERSION_TIMEOUT_MS): Promise<GetVersionResponse | undefined> {
  return askVersion(address, { timeoutMs, retryAttempts: 1 }).catch(() => undefined);
}
