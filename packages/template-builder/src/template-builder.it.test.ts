/**
 * Template builder integration (root, runc, busybox-static): build a template from the real
 * podd bundle, run node and sh in it with chroot, then boot it with runc (under this test's own
 * --root), call podd through the bind-mounted socket, kill -9 podd and see the init respawn it
 * with its own pid unchanged, stop it with SIGTERM. Needs root, runc, busybox-static, chroot and
 * the podd bundle (`npm run build`, or the podd tsc -b + bundle): skips naming what is missing,
 * or fails under CI=true.
 */
import { execFile, spawn, spawnSync } from 'node:child_process';
import { closeSync, cpSync, existsSync, mkdirSync, openSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { createSandnodeChannel, createServiceClient, processStartTicks } from '@sandnode/shared';
import { PoddServiceDefinition, type ExecResponse } from '@sandnode/shared/proto/podd/v1/podd';
import { built, describeWith, makeTempDir, PARTS, waitFor, type Part } from '@sandnode/testkit';
import { buildTemplate, ROOTFS_PATHS, type TemplateInfo } from './template-builder';

const PODD_DIR = path.dirname(require.resolve('@sandnode/podd/package.json'));
const BUNDLE = path.join(PODD_DIR, 'dist', 'podd.bundle.js');
const PODD_VERSION = (JSON.parse(readFileSync(path.join(PODD_DIR, 'package.json'), 'utf8')) as { version: string }).version;

/** What this suite needs (chroot is coreutils: every Debian has it). */
const TB_PARTS: Part[] = [
  PARTS.root,
  PARTS.runc,
  PARTS.busybox,
  { name: 'chroot (coreutils)', present: () => (process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin').split(':').some((d) => existsSync(path.join(d, 'chroot'))), ciProvides: true },
  built('@sandnode/podd', 'dist/podd.bundle.js'),
];

function sh(cmd: string, args: string[], timeoutMs = 30_000): Promise<{ stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    execFile(cmd, args, { timeout: timeoutMs }, (err, stdout, stderr) => {
      if (err) reject(new Error(`${cmd} ${args.join(' ')}: ${err.message}: ${stderr}`));
      else resolve({ stdout: String(stdout), stderr: String(stderr) });
    });
  });
}

/** until waits (waitFor, 15 s by default, polling every 50 ms) for fn to return a truthy value and returns it. */
function until<T>(what: string, fn: () => Promise<T> | T, ms = 15_000): Promise<NonNullable<T>> {
  return waitFor(what, fn, ms, 50);
}

/** Children of ppid whose command line contains needle. */
function childrenMatching(ppid: number, needle: string): number[] {
  const out: number[] = [];
  for (const n of readdirSync('/proc')) {
    if (!/^\d+$/.test(n)) continue;
    try {
      const stat = readFileSync(`/proc/${n}/stat`, 'utf8');
      const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      if (Number(rest[1]) !== ppid || rest[0] === 'Z') continue;
      if (readFileSync(`/proc/${n}/cmdline`, 'utf8').includes(needle)) out.push(Number(n));
    } catch {
      /* gone */
    }
  }
  return out;
}

describeWith('template builder (integration: chroot + runc)', TB_PARTS, () => {
  let dir: string;
  let tpl: TemplateInfo;
  const runcRoot = () => path.join(dir, 'runc-root');
  const id = `sandnode-tb-it-${process.pid}`;
  let created = false;

  const runc = (...args: string[]) => sh('runc', ['--root', runcRoot(), ...args]);

  beforeAll(async () => {
    dir = makeTempDir('tpl-it');
    tpl = await buildTemplate({ name: 'it', templatesDir: path.join(dir, 'templates'), poddBundlePath: BUNDLE, poddVersion: PODD_VERSION });
  });

  afterAll(async () => {
    if (created) await runc('delete', '--force', id).catch(() => undefined);
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test('the build takes a few seconds and the libraries are complete (chroot node, chroot sh)', async () => {
    expect(tpl.buildMs).toBeLessThan(15_000);
    expect((await sh('chroot', [tpl.rootfsPath, ROOTFS_PATHS.node, '-e', 'console.log(1)'])).stdout).toBe('1\n');
    expect((await sh('chroot', [tpl.rootfsPath, '/bin/sh', '-c', 'echo ok'])).stdout).toBe('ok\n');
    // the bundle alone loads in the rootfs (no node_modules there)
    const v = await sh('chroot', [tpl.rootfsPath, ROOTFS_PATHS.node, ROOTFS_PATHS.podd, '--help']);
    expect(v.stderr).toMatch(/usage: podd/);
  });

  test("podd's compile cache is made at build and used by a boot in the rootfs", () => {
    const cache = path.join(tpl.rootfsPath, ROOTFS_PATHS.poddCompileCache);
    const entries = readdirSync(cache, { recursive: true, withFileTypes: true }).filter((e) => e.isFile() && e.name !== 'manifest.json');
    expect(entries).toHaveLength(1);
    expect(statSync(tpl.rootfsPath).mode & 0o777).toBe(0o755);
    const r = spawnSync('chroot', [tpl.rootfsPath, ROOTFS_PATHS.node, ROOTFS_PATHS.poddBoot, '--help'], {
      env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin', NODE_DEBUG_NATIVE: 'COMPILE_CACHE' },
      encoding: 'utf8',
      timeout: 30_000,
    });
    expect(r.stderr).toMatch(/usage: podd/);
    expect(r.stderr).toMatch(/reading cache from .*podd\.js\.\.\.\[[^\]]*\]\.\.\. success/);
    expect(r.stderr).not.toContain('compile cache not used');
  });

  test('runs under runc: podd answers on the bind-mounted socket; the init respawns a killed podd', async () => {
    // A bundle whose root is a copy of the template, so the template stays pristine.
    const bundleDir = path.join(dir, 'bundle');
    const hostRun = path.join(dir, 'run');
    mkdirSync(bundleDir);
    mkdirSync(hostRun);
    mkdirSync(runcRoot());
    cpSync(tpl.rootfsPath, path.join(bundleDir, 'rootfs'), { recursive: true, verbatimSymlinks: true, preserveTimestamps: true });
    await sh('runc', ['spec', '--bundle', bundleDir]);
    const specPath = path.join(bundleDir, 'config.json');
    const spec = JSON.parse(readFileSync(specPath, 'utf8')) as {
      process: { args: string[]; terminal: boolean; env: string[] };
      root: { path: string; readonly: boolean };
      hostname: string;
      mounts: Array<{ destination: string; type: string; source: string; options?: string[] }>;
      linux: { cgroupsPath?: string };
    };
    spec.process.args = [ROOTFS_PATHS.init];
    spec.process.terminal = false;
    spec.root = { path: path.join(bundleDir, 'rootfs'), readonly: false };
    spec.hostname = 'tb-it';
    spec.mounts.push({ destination: '/run/sandnode', type: 'bind', source: hostRun, options: ['rbind', 'rw'] });
    spec.mounts.push({ destination: '/workspace', type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'nodev', 'mode=755', 'size=65536k'] });
    spec.linux.cgroupsPath = `/${id}`;
    writeFileSync(specPath, JSON.stringify(spec, null, 2));

    const logFd = openSync(path.join(dir, 'container.log'), 'a');
    const rc = await new Promise<number | null>((resolve) => {
      const p = spawn('runc', ['--root', runcRoot(), 'run', '-d', '--bundle', bundleDir, id], { stdio: ['ignore', logFd, logFd] });
      p.once('exit', resolve);
    });
    closeSync(logFd);
    created = true;
    expect({ rc, log: rc === 0 ? '' : readFileSync(path.join(dir, 'container.log'), 'utf8') }).toEqual({ rc: 0, log: '' });

    const initPid = (JSON.parse((await runc('state', id)).stdout) as { pid: number }).pid;
    const initTicks = processStartTicks(initPid);
    expect(initTicks).toBeDefined();

    const sock = path.join(hostRun, 'podd.sock');
    const channel = createSandnodeChannel(`unix://${sock}`);
    try {
      const client = createServiceClient(PoddServiceDefinition, channel, { timeoutMs: 3000 });
      await until('podd socket', () => existsSync(sock) || undefined);
      const h = await until('podd health', () => client.health({}));
      expect(h).toMatchObject({ ok: true, hostname: 'tb-it' });

      const evs: ExecResponse[] = [];
      for await (const ev of client.exec({ argv: ['sh', '-c', 'echo hi; pwd; id -u; echo $HOME; cat /proc/1/cmdline | tr "\\0" " "'] })) evs.push(ev);
      const out = Buffer.concat(evs.flatMap((e) => (e.event?.$case === 'stdout' ? [e.event.value] : []))).toString();
      expect(out).toBe(`hi\n/workspace\n0\n/root\n/bin/busybox sh ${ROOTFS_PATHS.init} `);
      expect(evs.at(-1)?.event).toEqual({ $case: 'exit', value: expect.objectContaining({ exitCode: 0 }) });
      await client.writeFile({ path: '/workspace/f.txt', data: Buffer.from('in the sandbox') });
      expect((await client.readFile({ path: '/workspace/f.txt' })).data.toString()).toBe('in the sandbox');

      // kill -9 podd: the init (pid unchanged) starts a new one.
      const [podd1] = await until('podd process', () => {
        const c = childrenMatching(initPid, ROOTFS_PATHS.poddBoot);
        return c.length === 1 ? c : undefined;
      });
      process.kill(podd1 as number, 'SIGKILL');
      const [podd2] = await until('respawned podd', () => {
        const c = childrenMatching(initPid, ROOTFS_PATHS.poddBoot);
        return c.length === 1 && c[0] !== podd1 ? c : undefined;
      });
      expect(podd2).not.toBe(podd1);
      const h2 = await until('respawned podd health', () => client.health({}));
      expect(h2.ok).toBe(true);
      expect((JSON.parse((await runc('state', id)).stdout) as { pid: number }).pid).toBe(initPid);
      expect(processStartTicks(initPid)).toBe(initTicks);
      const log = readFileSync(path.join(hostRun, 'podd.log'), 'utf8');
      expect(log).toMatch(/podd exited with status 137 .*restarting/);
      expect(log).toMatch(/"msg":"podd listening"/);

      // SIGTERM to the init: podd gets TERM, the init exits 0, the container stops.
      await runc('kill', id, 'TERM');
      await until('container stopped', async () => ((JSON.parse((await runc('state', id)).stdout) as { status: string }).status === 'stopped' ? true : undefined));
      expect(readFileSync(path.join(hostRun, 'podd.log'), 'utf8')).toMatch(/"msg":"stopped"[\s\S]*sandnode-init.*stopped/);
    } finally {
      channel.close();
      await runc('delete', '--force', id).catch(() => undefined);
      created = false;
    }
    expect(existsSync(path.join(runcRoot(), id))).toBe(false);
  });
});
