/**
 * Test harness: a whole node (vmm-supervisor, ublk-manager, server as real processes on unix
 * sockets) in temp dirs, and what a test needs to check it and clean up after it.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { createSandnodeChannel, createServiceClient, metricsStatusFile, readMetricsStatus, serverLeasePath, socketPath, unixAddress } from '@sandnode/shared';
import { AdminServiceDefinition, type ServerRole } from '@sandnode/shared/proto/server/v1/admin';
import { DeviceServiceDefinition } from '@sandnode/shared/proto/ublk/v1/ublk';
import { VmServiceDefinition } from '@sandnode/shared/proto/vmm/v1/vmm';
import { describeWith, NODE_PARTS } from './prereq';
import { passableTempDir } from './temp-dir';
import { sweepDeadTestNodes, TEST_NODE_PREFIX, writeOwner } from './dead-nodes';
import { killProcesses } from './kill-processes';
export { killProcesses } from './kill-processes';
import { takeTestPool, type TestPool } from './test-pool';
import {
  COMPONENTS,
  METRICS_LISTEN_ENV,
  connectServer,
  findActiveServer,
  purgeNode,
  sandnodeProcesses,
  startComponent,
  stopComponent,
  type Component,
  type ServerApi,
  type StackDirs,
} from '@sandnode/node-stack';

/**
 * describeNode is `describe` when the machine has every part a whole node needs (NODE_PARTS),
 * else it skips naming what is missing, or fails under CI=true (see describeWith).
 */
export function describeNode(name: string, fn: () => void): void {
  describeWith(name, NODE_PARTS, fn);
}

export interface TestNode {
  dirs: StackDirs;
  api: ServerApi;
  /** the server's unix address */
  address: string;
  /** reconnect after a server restart */
  reconnect(): ServerApi;
  cli(args: string[], input?: string): { status: number; stdout: string; stderr: string };
  /**
   * tcpAddress is "127.0.0.1:PORT" of the server's TCP listener (started with `listen`), read
   * from the servers' ready lines in <runDir>/logs/server*.log (a handover keeps the port).
   */
  tcpAddress(): string;
  /** metricsUrl is "http://127.0.0.1:PORT/metrics" of a component, from its metrics status file; throws Error when it serves none. */
  metricsUrl(c: Component): string;
  /** tcpToken is the secret of an admin bearer token for the TCP listener (made once per node with `sandnode token create`). */
  tcpToken(): string;
  stop(): Promise<void>;
}

/** serverProcesses lists the live server processes (any slot, any role) of runDir. */
export function serverProcesses(runDir: string): number[] {
  return sandnodeProcesses(runDir)
    .filter((p) => /services\/server\/dist\/main\.js/.test(p.cmd))
    .map((p) => p.pid);
}

/** withEnv runs fn (which must spawn synchronously or await its spawn) with extra env vars set. */
export async function withEnv<T>(env: Record<string, string>, fn: () => Promise<T>): Promise<T> {
  const saved = Object.fromEntries(Object.keys(env).map((k) => [k, process.env[k]]));
  Object.assign(process.env, env);
  try {
    return await fn();
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  }
}

/**
 * waitReadyPort is readyPort once the ready line is there: the server answers on its socket (what
 * startNode waits for) a moment before it writes that line, after its metrics and reaper start,
 * and on a loaded CI host that moment was long enough for a test to look first ("no server ready
 * line with a TCP port"). Waits at most timeoutMs (a synchronous sleep: tcpAddress is sync).
 */
export function waitReadyPort(runDir: string, timeoutMs = 30_000): number {
  const until = Date.now() + timeoutMs;
  for (;;) {
    try {
      return readyPort(runDir);
    } catch (err) {
      if (Date.now() >= until) throw err;
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 50);
    }
  }
}

/** readyPort returns the TCP port of the newest server ready line in runDir's server logs. */
export function readyPort(runDir: string): number {
  const logDir = path.join(runDir, 'logs');
  let best: { at: number; port: number } | undefined;
  for (const f of readdirSync(logDir).filter((n) => /^server(-[ab])?\.log$/.test(n))) {
    const lines = readFileSync(path.join(logDir, f), 'utf8').split('\n');
    lines.forEach((line, i) => {
      if (!line.startsWith('{"ready":true')) return;
      const port = (JSON.parse(line) as { port: number }).port;
      // the ready line has no time; the pino line before it does
      const prev = lines[i - 1]?.startsWith('{') ? (JSON.parse(lines[i - 1]!) as { time?: number }).time : undefined;
      const at = prev ?? 0;
      if (port > 0 && (!best || at >= best.at)) best = { at, port };
    });
  }
  if (!best) throw new Error(`no server ready line with a TCP port in ${logDir}`);
  return best.port;
}

/** freePort is a TCP port on 127.0.0.1 that was free a moment ago (bound to 0 and closed). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const port = (srv.address() as net.AddressInfo).port;
      srv.close(() => resolve(port));
    });
  });
}

/** The sweep of dead test nodes this process ran (the first startNode starts it). */
let sweeping: Promise<string[]> | undefined;

/** startNode starts the three daemons in fresh temp dirs and builds (or reuses) the base template. */
export async function startNode(
  opts: {
    buildTemplate?: boolean;
    /** the server's TCP listen address ("127.0.0.1:0": any free port; default "": none) */
    listen?: string;
    /** extra environment of one component's first start (e.g. SANDNODE_SERVER_FAILPOINTS) */
    env?: Partial<Record<Component, Record<string, string>>>;
    /**
     * sandbox networking on: a test pool of its own (a /24 of 10.211.0.0/17, tag and ports;
     * test-pool.ts), held until stop. Default off: sandboxes are loopback only and the server has
     * no ingress listener, so that tests that do not need a network make no netns or listener.
     */
    network?: boolean;
  } = {},
): Promise<TestNode> {
  // the nodes of a killed test run go first (dead-nodes.ts); once per process
  sweeping ??= sweepDeadTestNodes().catch(() => []);
  await sweeping;
  const root = passableTempDir(TEST_NODE_PREFIX);
  const pool: TestPool | undefined = opts.network ? takeTestPool() : undefined;
  writeOwner(root, pool?.settings.tag ?? '');
  const dirs: StackDirs = {
    stateDir: path.join(root, 'state'),
    runDir: path.join(root, 'run'),
    listen: opts.listen ?? '',
    network: pool?.settings ?? { enabled: false, ingressListen: '' },
  };
  const killStrays = async () => killProcesses(sandnodeProcesses(dirs.runDir).map((p) => p.pid));
  try {
    // /metrics on free loopback ports, not the fixed defaults, so that parallel nodes do not collide; a
    // restart or upgrade keeps the port (the metrics status file, the server's settings file)
    for (const c of COMPONENTS) {
      const metrics = { [METRICS_LISTEN_ENV[c]]: `127.0.0.1:${await freePort()}` };
      await withEnv({ ...metrics, ...opts.env?.[c] }, () => startComponent(dirs, c, { timeoutMs: 60_000 }));
    }
  } catch (err) {
    // stop what did start, so a failed start leaves no daemon or dir behind
    for (const c of [...COMPONENTS].reverse()) await stopComponent(dirs, c).catch(() => undefined);
    await killStrays();
    await purgeNode(dirs).catch(() => undefined);
    execFileSync('rm', ['-rf', root]);
    pool?.release();
    throw err;
  }
  const address = unixAddress(socketPath(dirs.runDir, 'server'));
  let token: string | undefined;
  const node: TestNode = {
    dirs,
    address,
    api: connectServer(address),
    reconnect() {
      node.api.close();
      node.api = connectServer(address);
      return node.api;
    },
    cli(args, input) {
      const r = spawnSync(process.execPath, [require.resolve('@sandnode/cli/dist/main.js'), '--state-dir', dirs.stateDir, '--run-dir', dirs.runDir, '--listen', '', ...args], {
        input,
        encoding: 'utf8',
        timeout: 120_000,
      });
      return { status: r.status ?? -1, stdout: r.stdout, stderr: r.stderr };
    },
    tcpAddress() {
      return `127.0.0.1:${waitReadyPort(dirs.runDir)}`;
    },
    metricsUrl(c) {
      const url = readMetricsStatus(dirs.runDir, c)?.url;
      if (!url) throw new Error(`${c} serves no /metrics (${metricsStatusFile(dirs.runDir, c)}: ${JSON.stringify(readMetricsStatus(dirs.runDir, c) ?? null)})`);
      return url;
    },
    tcpToken() {
      if (!token) {
        const r = node.cli(['token', 'create', '--name', 'testkit', '--json']);
        if (r.status !== 0) throw new Error(`sandnode token create failed (${r.status}): ${r.stderr}`);
        token = (JSON.parse(r.stdout) as { secret: string }).secret;
      }
      return token;
    },
    async stop() {
      node.api.close();
      const api = connectServer(address);
      try {
        const list = await api.sandboxes.listSandboxes({ pageSize: 1000 });
        await Promise.all(list.sandboxes.map((s) => api.sandboxes.deleteSandbox({ sandboxId: s.sandboxId }).catch(() => undefined)));
      } catch {
        /* server down: purge below removes everything */
      } finally {
        api.close();
      }
      // the server of the pid file, then any other server of this run (standbys, retiring
      // or crashed-and-replaced ones), then the device manager and the supervisor
      await stopComponent(dirs, 'server');
      await killProcesses(serverProcesses(dirs.runDir));
      for (const c of [...COMPONENTS].reverse().filter((x) => x !== 'server')) await stopComponent(dirs, c);
      await killStrays();
      await purgeNode(dirs);
      execFileSync('rm', ['-rf', root]);
      pool?.release();
    },
  };
  if (opts.buildTemplate !== false) {
    await node.api.templates.buildTemplate({ name: 'base', replace: false });
  }
  return node;
}

/** execCollect runs argv in a sandbox and collects stdout, stderr and the exit code. */
export async function execCollect(api: ServerApi, sandboxId: string, argv: string[], extra: { stdin?: Buffer; cwd?: string; env?: Record<string, string>; timeoutMs?: number } = {}) {
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  let exitCode = -1;
  let started = 0;
  for await (const ev of api.sandboxes.exec({ sandboxId, argv, stdin: extra.stdin ?? Buffer.alloc(0), cwd: extra.cwd ?? '', env: extra.env ?? {}, timeoutMs: extra.timeoutMs ?? 0 })) {
    const e = ev.event;
    if (e?.$case === 'stdout') out.push(Buffer.from(e.value));
    else if (e?.$case === 'stderr') err.push(Buffer.from(e.value));
    else if (e?.$case === 'started') started = e.value.pid;
    else if (e?.$case === 'exit') exitCode = e.value.exitCode;
  }
  return { stdout: Buffer.concat(out).toString(), stderr: Buffer.concat(err).toString(), exitCode, started };
}

/** What a server's AdminService says about the lease, plus its admin address. */
export interface LeaseView {
  role: ServerRole;
  epoch: number;
  holderPid: number;
  admin: string;
}

/** adminStatus asks the server at an admin address for its lease status (undefined: no answer). */
export async function adminStatus(admin: string, timeoutMs = 2000): Promise<LeaseView | undefined> {
  const ch = createSandnodeChannel(admin);
  try {
    const st = await createServiceClient(AdminServiceDefinition, ch, { timeoutMs, retryAttempts: 1 }).getLeaseStatus({});
    return { role: st.role, epoch: Number(st.epoch), holderPid: st.holderPid, admin };
  } catch {
    return undefined;
  } finally {
    ch.close();
  }
}

/** leaseFile is the node's server lease. */
export function leaseFile(dirs: StackDirs): string {
  return serverLeasePath(dirs.stateDir);
}

/**
 * writeLeaseRecord writes the holder record a server writes when it takes the node's lease
 * (`<stateDir>/server.lease.json`, naming epoch): what vmm-supervisor and ublk-manager check
 * before they raise their epoch fence. For tests that run those daemons without a server.
 */
export function writeLeaseRecord(stateDir: string, epoch: number): void {
  mkdirSync(stateDir, { recursive: true });
  writeFileSync(`${serverLeasePath(stateDir)}.json`, JSON.stringify({ pid: 0, admin: '', slot: '', version: 'test', epoch, sinceMs: Date.now() }), { mode: 0o600 });
}

/** holderStatus asks the active server (the one whose admin socket answers ACTIVE); undefined: none answers. */
export async function holderStatus(dirs: StackDirs): Promise<LeaseView | undefined> {
  const a = await findActiveServer(dirs.runDir);
  return a ? adminStatus(a.admin) : undefined;
}

/** The node's own view below its dirs: what could be an orphan. */
export interface NodeInventory {
  /** runc container ids under <runDir>/runc */
  containers: string[];
  /** backing files of loop devices below the state dir */
  loopBackingFiles: string[];
  /** per-sandbox runtime dirs */
  dirs: string[];
  /** the supervisor's VMs and the device manager's devices */
  vms: string[];
  devices: { deviceId: string; backingFile: string }[];
}

export async function inventory(dirs: StackDirs): Promise<NodeInventory> {
  const runDir = path.resolve(dirs.runDir);
  const stateDir = path.resolve(dirs.stateDir);
  let containers: string[] = [];
  const r = spawnSync('runc', ['--root', path.join(runDir, 'runc'), 'list', '--format', 'json'], { encoding: 'utf8' });
  if (r.status === 0) containers = ((JSON.parse(r.stdout || '[]') as { id: string }[] | null) ?? []).map((c) => c.id).sort();
  const loopBackingFiles: string[] = [];
  for (const n of readdirSync('/sys/block').filter((x) => x.startsWith('loop'))) {
    try {
      const b = readFileSync(`/sys/block/${n}/loop/backing_file`, 'utf8')
        .trim()
        .replace(/ \(deleted\)$/, '');
      // the ublk-manager's image pool (an XFS file system in a file, mounted on <stateDir>/images) is the node's, not a sandbox's
      if (b.startsWith(`${stateDir}/`) && b !== path.join(stateDir, 'ublk-manager', 'pool', 'images.xfs')) loopBackingFiles.push(b);
    } catch {
      /* not attached */
    }
  }
  const sbDir = path.join(runDir, 'sandboxes');
  const sdirs = existsSync(sbDir) ? readdirSync(sbDir).sort() : [];
  const vch = createSandnodeChannel(unixAddress(socketPath(runDir, 'vmm-supervisor')));
  const dch = createSandnodeChannel(unixAddress(socketPath(runDir, 'ublk-manager')));
  try {
    const vms = (await createServiceClient(VmServiceDefinition, vch, { timeoutMs: 5000 }).listVms({})).vms.map((v) => v.vmId).sort();
    const devices = (await createServiceClient(DeviceServiceDefinition, dch, { timeoutMs: 5000 }).listDevices({})).devices
      .map((d) => ({ deviceId: d.deviceId, backingFile: d.backingFile }))
      .sort((a, b) => a.deviceId.localeCompare(b.deviceId));
    return { containers, loopBackingFiles: loopBackingFiles.sort(), dirs: sdirs, vms, devices };
  } finally {
    vch.close();
    dch.close();
  }
}

/**
 * orphans lists what no sandbox record owns (expected empty): containers, VMs, devices, loop
 * devices and dirs. `live` are the sandboxes with a VM (RUNNING/PAUSED), `all` every record.
 */
export function orphans(inv: NodeInventory, live: string[], all: string[]): string[] {
  const out: string[] = [];
  const liveSet = new Set(live);
  const allSet = new Set(all);
  // <id>-upper, <id>-ws, and <id>-upper-g<N> after a ResetRootfs
  const owned = (deviceId: string) => /^(sb-[0-9a-f]{16})-(upper|ws|upper-g\d+)$/.exec(deviceId)?.[1] !== undefined && allSet.has(deviceId.slice(0, 19));
  for (const c of inv.containers) if (!liveSet.has(c)) out.push(`container ${c}`);
  for (const v of inv.vms) if (!liveSet.has(v)) out.push(`vm ${v}`);
  for (const d of inv.devices) if (!owned(d.deviceId)) out.push(`device ${d.deviceId}`);
  const backing = new Set(inv.devices.filter((d) => owned(d.deviceId)).map((d) => d.backingFile));
  for (const b of inv.loopBackingFiles) if (!backing.has(b)) out.push(`loop device on ${b}`);
  for (const d of inv.dirs) if (!allSet.has(d)) out.push(`dir ${d}`);
  // and the other way round: a live sandbox lacks a part
  for (const id of live) {
    if (!inv.containers.includes(id)) out.push(`sandbox ${id} has no container`);
    if (!inv.vms.includes(id)) out.push(`sandbox ${id} has no vm`);
  }
  return out;
}
