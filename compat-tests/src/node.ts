/**
 * A temporary node for one matrix cell or upgrade run: its own state and runtime dirs, each
 * daemon started from the build assigned to it on that build's Node (`<nodeFor(build)>
 * <build>/services/<c>/dist/main.js`, the way the operator CLI starts daemons: N's `stack.js`), templates built with a build's own
 * template builder, the public API through the working tree's generated clients, and a
 * cleanup that leaves nothing behind (`sandnode down --purge` of N's CLI, then any stray
 * process of these dirs).
 */
import { spawn } from 'node:child_process';
import { chmodSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { askVersion, connectServerApi, envKey, sandboxDir, socketPath, unixAddress, type ServerApi } from '@sandnode/shared';
import type { GetVersionResponse } from '@sandnode/shared/proto/common/v1/version';
import { startTestInternet, takeTestPool, waitFor, type TestInternet, type TestPool } from '@sandnode/testkit';
import { cliMain, templateBuilderModule } from './layout';
import { nodeFor } from './releases';
import { writeNodeConfig, writerOf, type ConfigMode } from './node-config';
import type { Build, Component } from './types';

/** A daemon component (podd runs inside sandboxes and is not started by the node). */
export type Daemon = Exclude<Component, 'podd'>;
/** Start order of the daemons; stop order is the reverse. */
export const DAEMONS: Daemon[] = ['vmm-supervisor', 'ublk-manager', 'server'];

interface StackDirs {
  stateDir: string;
  runDir: string;
  listen: string;
  /** the node's network settings (node-stack NodeNetworkSettings): a test pool of its own */
  network?: TestPool['settings'];
}

/** The part of N's `@sandnode/node-stack` this module uses. */
interface StackModule {
  startComponent(dirs: StackDirs, c: Daemon, opts?: { buildDir?: string; timeoutMs?: number }): Promise<{ pid: number; started: boolean }>;
  stopComponent(dirs: StackDirs, c: Daemon, timeoutMs?: number): Promise<boolean>;
  killComponent(dirs: StackDirs, c: Daemon): Promise<number | undefined>;
  purgeNode(dirs: StackDirs): Promise<unknown>;
  sandnodeProcesses(runDir: string): { pid: number; cmd: string }[];
}

let stackModule: StackModule | undefined;
/** stack loads N's stack module (how the operator CLI starts and stops daemons). */
function stack(): StackModule {
  stackModule ??= require('@sandnode/node-stack') as StackModule;
  return stackModule;
}

/** The public API of a node's server (shared's connectServerApi, N's generated clients). */
export const connectApi = connectServerApi;
export type { ServerApi };

/** versionAt asks whatever serves address for its version; throws when nothing answers. */
export function versionAt(address: string, timeoutMs = 3000): Promise<GetVersionResponse> {
  return askVersion(address, { timeoutMs, retryAttempts: 2 });
}

/** Output of one CLI run. */
export interface CliResult {
  status: number;
  stdout: string;
  stderr: string;
  ms: number;
}

/** runNode runs `node args...` (node: a build's, see nodeFor) without blocking the event loop (exec streams keep flowing). */
export function runNode(args: string[], env: NodeJS.ProcessEnv = process.env, timeoutMs = 300_000, node = process.execPath): Promise<CliResult> {
  const t0 = Date.now();
  return new Promise((resolve) => {
    const child = spawn(node, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('close', (code, sig) => {
      clearTimeout(timer);
      resolve({ status: code ?? (sig ? 128 : -1), stdout, stderr: sig ? `${stderr}\n(killed by ${sig})` : stderr, ms: Date.now() - t0 });
    });
  });
}

/** TempNode is one node in temp dirs; every daemon's build is chosen at start. */
export class TempNode {
  readonly root: string;
  readonly dirs: StackDirs;
  /** the server's unix address */
  readonly address: string;
  /** the build each daemon runs now */
  readonly running: Partial<Record<Daemon, Build>> = {};
  private apiHandle: ServerApi | undefined;

  /** the node's test pool (addresses, names, ports of its own: several nodes run at once on one machine) */
  readonly pool: TestPool;
  /** the test "internet" the node's DNS upstream points at (started by startInternet) */
  inet: TestInternet | undefined;

  /** which build's config file each daemon started with (its label), when the node has configs */
  readonly configOf: Partial<Record<Daemon, string>> = {};

  /**
   * @param n the working tree build, whose CLI drives upgrades and the purge
   * @param configs when set, every daemon starts with a config file (SANDNODE_<C>_CONFIG)
   *   written by its own build or the other build of the pair (node-config.ts)
   */
  constructor(
    readonly n: Build,
    prefix = 'sandnode-compat-',
    readonly configs?: { mode: ConfigMode; pair: readonly [Build, Build] },
  ) {
    this.root = mkdtempSync(path.join(os.tmpdir(), prefix));
    chmodSync(this.root, 0o711); // others may pass (the sandboxes' user namespace root must reach <runDir>), not list
    this.pool = takeTestPool();
    this.dirs = { stateDir: path.join(this.root, 'state'), runDir: path.join(this.root, 'run'), listen: '', network: this.pool.settings };
    this.address = unixAddress(socketPath(this.dirs.runDir, 'server'));
  }

  /**
   * startInternet starts the node's test internet (once; before the first server start, whose
   * dnsUpstreams names its DNS server). Throws when it cannot be made (needs root, ip).
   */
  async startInternet(): Promise<TestInternet> {
    this.inet ??= await startTestInternet();
    return this.inet;
  }

  /**
   * serverEnv is the server config of this node that is not in dirs (a build that does not know
   * a key ignores its variable): the ingress listener of the node's pool and, once the test
   * internet runs, the DNS upstream (its DNS server). Also given to N's CLI for `upgrade
   * server`, which starts a standby from the caller's environment while the active server wrote
   * no settings file (0.2.0).
   */
  serverEnv(): Record<string, string> {
    return {
      SANDNODE_SERVER_INGRESS_LISTEN: this.pool.settings.ingressListen ?? '',
      ...(this.inet ? { SANDNODE_SERVER_DNS_UPSTREAMS: `${this.inet.dns.address}:${this.inet.dns.port}` } : {}),
    };
  }

  /** ingressListen is the node's ingress listener, "127.0.0.1:port". */
  get ingressListen(): string {
    return this.pool.settings.ingressListen ?? '';
  }

  /** api is the current connection to the server (see reconnect). */
  get api(): ServerApi {
    this.apiHandle ??= connectApi(this.address);
    return this.apiHandle;
  }

  /** reconnect drops the connection (after a server restart or handover) and opens a new one. */
  reconnect(): ServerApi {
    this.apiHandle?.close();
    this.apiHandle = connectApi(this.address);
    return this.apiHandle;
  }

  /** buildEnv is the environment a daemon of build b starts with (its commit reported by GetVersion). */
  static buildEnv(b: Build): NodeJS.ProcessEnv {
    return { ...process.env, SANDNODE_BUILD_COMMIT: b.commit };
  }

  /** start starts daemon c from build b and waits until it answers; returns its pid. */
  async start(c: Daemon, b: Build): Promise<number> {
    if (c === 'server') await this.startInternet();
    const vars: Record<string, string> = { SANDNODE_BUILD_COMMIT: b.commit, ...(c === 'server' ? this.serverEnv() : {}) };
    if (this.configs) {
      const writer = writerOf(this.configs.mode, b, this.configs.pair);
      vars[envKey(c, 'config')] = writeNodeConfig(this.root, c, writer, this.n);
      this.configOf[c] = writer.label;
    }
    const saved = Object.fromEntries(Object.keys(vars).map((k) => [k, process.env[k]]));
    Object.assign(process.env, vars);
    try {
      const r = await stack().startComponent(this.dirs, c, { buildDir: b.dir, timeoutMs: 60_000 });
      this.running[c] = b;
      return r.pid;
    } finally {
      for (const [k, v] of Object.entries(saved)) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
    }
  }

  /** stop stops daemon c with SIGTERM (SIGKILL after 15 s). */
  async stop(c: Daemon): Promise<void> {
    await stack().stopComponent(this.dirs, c);
  }

  /** kill9 kills daemon c with SIGKILL; returns the pid killed. */
  async kill9(c: Daemon): Promise<number | undefined> {
    return stack().killComponent(this.dirs, c);
  }

  /** version asks daemon c (at its stable socket) for its version. */
  async version(c: Daemon): Promise<GetVersionResponse> {
    return versionAt(unixAddress(socketPath(this.dirs.runDir, c)));
  }

  /** poddVersion asks the podd of a sandbox (its socket in the sandbox's runtime dir). */
  async poddVersion(sandboxId: string): Promise<GetVersionResponse> {
    return versionAt(unixAddress(path.join(sandboxDir(this.dirs.runDir, sandboxId), 'podd.sock')));
  }

  /**
   * buildTemplate builds template `name` with podd of build b, using that build's own template
   * builder and copying that build's Node (nodeFor), into `<stateDir>/templates/<name>` (where
   * the server lists templates from).
   */
  async buildTemplate(name: string, b: Build): Promise<number> {
    const t0 = Date.now();
    const builder = require(templateBuilderModule(b.dir)) as {
      buildTemplate(o: { name: string; templatesDir: string; poddBundlePath: string; poddVersion: string; nodePath?: string }): Promise<unknown>;
    };
    await builder.buildTemplate({
      name,
      templatesDir: path.join(this.dirs.stateDir, 'templates'),
      poddBundlePath: path.join(b.dir, 'services', 'podd', 'dist', 'podd.bundle.js'),
      poddVersion: b.version,
      nodePath: nodeFor(b),
    });
    return Date.now() - t0;
  }

  /**
   * cli runs N's operator CLI on N's Node (`--listen ''`); env adds variables (e.g. the
   * target's commit). The CLI starts a build's daemons on that build's Node (its marker).
   */
  cli(args: string[], env: NodeJS.ProcessEnv = process.env): Promise<CliResult> {
    return runNode([cliMain(this.n.dir), '--state-dir', this.dirs.stateDir, '--run-dir', this.dirs.runDir, '--listen', '', ...args], env, undefined, nodeFor(this.n));
  }

  /** logTail returns the last lines of the newest log of component c (any slot). */
  logTail(c: Component, lines = 20): string {
    const logDir = path.join(this.dirs.runDir, 'logs');
    if (c === 'podd') c = 'server';
    try {
      const files = readdirSync(logDir)
        .filter((f) => f === `${c}.log` || new RegExp(`^${c}-[ab]\\.log$`).test(f))
        .map((f) => ({ f, m: statSync(path.join(logDir, f)).mtimeMs }))
        .sort((a, b) => b.m - a.m);
      if (!files[0]) return '';
      const text = readFileSync(path.join(logDir, files[0].f), 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
      return `${files[0].f}:\n${text}`;
    } catch {
      return '';
    }
  }

  /**
   * down removes the node: `sandnode down --purge` (N's CLI: deletes every sandbox, stops the
   * daemons, removes containers, mounts, loop devices and dirs), then kills any process still
   * running from these dirs (a retired server, a standby) and purges again. Never throws.
   */
  async down(): Promise<string> {
    this.apiHandle?.close();
    this.apiHandle = undefined;
    const notes: string[] = [];
    const r = await this.cli(['down', '--purge', '--json']);
    if (r.status !== 0) notes.push(`down --purge exited ${r.status}: ${r.stderr.trim().slice(-500)}`);
    const strays = stack().sandnodeProcesses(this.dirs.runDir);
    for (const p of strays) {
      try {
        process.kill(p.pid, 'SIGKILL');
        notes.push(`killed stray ${p.pid} ${p.cmd}`);
      } catch {
        /* gone */
      }
    }
    await waitFor('the killed strays to be gone', () => stack().sandnodeProcesses(this.dirs.runDir).length === 0, 5000).catch((err: Error) => notes.push(err.message));
    try {
      await stack().purgeNode(this.dirs);
    } catch (err) {
      notes.push(`purge: ${(err as Error).message}`);
    }
    rmSync(this.root, { recursive: true, force: true });
    await this.inet?.stop();
    this.pool.release();
    return notes.join('\n');
  }
}
