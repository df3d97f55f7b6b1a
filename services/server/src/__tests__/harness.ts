/**
 * Test harness: a whole node (vmm-supervisor, ublk-manager, server as real processes on unix
 * sockets) in temp dirs, and what a test needs to check it and clean up after it.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { socketPath, unixAddress } from '@sandnode/shared';
import { connectServer, type ServerApi } from '../cli/api';
import { COMPONENTS, purgeNode, startComponent, stopComponent, type StackDirs } from '../cli/stack';

/** missingParts names what this machine lacks for integration tests (empty: all there). */
export function missingParts(): string[] {
  const missing: string[] = [];
  if (process.getuid?.() !== 0) missing.push('root');
  if (spawnSync('runc', ['--version']).status !== 0) missing.push('runc (apt-get install runc)');
  if (!existsSync('/bin/busybox')) missing.push('busybox-static (apt-get install busybox-static)');
  if (!existsSync('/dev/loop-control')) missing.push('/dev/loop-control (loop devices)');
  for (const c of ['vmm-supervisor', 'ublk-manager', 'server', 'podd']) {
    if (!existsSync(path.join(__dirname, '..', '..', '..', c, 'dist', 'main.js'))) missing.push(`services/${c}/dist (run npm run build)`);
  }
  return missing;
}

/**
 * describeNode is `describe` when the machine has every part, else `describe.skip` with a
 * message naming what is missing.
 */
export function describeNode(name: string, fn: () => void): void {
  const missing = missingParts();
  if (missing.length) {
    // eslint-disable-next-line no-console
    console.warn(`skipping "${name}": missing ${missing.join(', ')}`);
    describe.skip(name, fn);
  } else {
    describe(name, fn);
  }
}

export interface TestNode {
  dirs: StackDirs;
  api: ServerApi;
  /** the server's unix address */
  address: string;
  /** reconnect after a server restart */
  reconnect(): ServerApi;
  cli(args: string[], input?: string): { status: number; stdout: string; stderr: string };
  stop(): Promise<void>;
}


/** startNode starts the three daemons in fresh temp dirs and builds (or reuses) the base template. */
export async function startNode(opts: { buildTemplate?: boolean } = {}): Promise<TestNode> {
  const root = mkdtempSync(path.join(os.tmpdir(), 'sandnode-it-'));
  const dirs: StackDirs = { stateDir: path.join(root, 'state'), runDir: path.join(root, 'run'), listen: '' };
  try {
    for (const c of COMPONENTS) await startComponent(dirs, c, { timeoutMs: 60_000 });
  } catch (err) {
    // stop what did start, so a failed start leaves no daemon or dir behind
    for (const c of [...COMPONENTS].reverse()) await stopComponent(dirs, c).catch(() => undefined);
    await purgeNode(dirs).catch(() => undefined);
    execFileSync('rm', ['-rf', root]);
    throw err;
  }
  const address = unixAddress(socketPath(dirs.runDir, 'server'));
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
      const r = spawnSync(process.execPath, [path.join(__dirname, '..', '..', 'dist', 'cli', 'main.js'), '--state-dir', dirs.stateDir, '--run-dir', dirs.runDir, '--listen', '', ...args], {
        input,
        encoding: 'utf8',
        timeout: 120_000,
      });
      return { status: r.status ?? -1, stdout: r.stdout, stderr: r.stderr };
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
      for (const c of [...COMPONENTS].reverse()) await stopComponent(dirs, c);
      await purgeNode(dirs);
      execFileSync('rm', ['-rf', root]);
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
