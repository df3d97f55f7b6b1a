/**
 * Shared parts of ublk-manager's integration tests (ublk-manager.it, clone.it, handover.it,
 * handover-churn.it): the daemon path, the machine parts they need (for testkit's
 * `describeWith`: skip naming what is missing, fail under CI=true), spawning dist/main.js
 * with its log in a file and waiting for one of its log lines (testkit's `waitFor`), a temp
 * dir, the cleanup of every mount and loop device made under it, and small helpers over
 * sysfs, mountinfo and HTTP.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { closeSync, openSync, readdirSync, readFileSync, realpathSync, rmSync } from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { built, makeTempDir, PARTS, waitFor, type Part } from '@sandnode/testkit';

export const ROOT = path.resolve(__dirname, '..', '..', '..', '..');
export const MAIN = path.join(ROOT, 'services', 'ublk-manager', 'dist', 'main.js');
export const MIB = 1024 * 1024;

function hasCommand(cmd: string): boolean {
  return spawnSync('sh', ['-c', `command -v ${cmd}`], { stdio: 'ignore' }).status === 0;
}

/** The util-linux commands the suites run themselves (losetup, blockdev, mount, umount); .ci/run's Debian has them. */
export const UTIL_LINUX: Part = {
  name: 'util-linux (losetup, blockdev, mount, umount: apt-get install util-linux mount)',
  present: () => ['losetup', 'blockdev', 'mount', 'umount'].every(hasCommand),
  ciProvides: true,
};

/**
 * DAEMON_PARTS: what every ublk-manager integration suite needs: root, loop devices,
 * e2fsprogs (mkfs.ext4, e2fsck, debugfs), util-linux and the daemon built (dist/main.js).
 */
export const DAEMON_PARTS: readonly Part[] = [PARTS.root, PARTS.loop, PARTS.e2fsprogs, UTIL_LINUX, built('@sandnode/ublk-manager')];

/** buildDaemon runs `tsc -b` for ublk-manager so dist/main.js is the source under test (incremental: quick when current). */
export function buildDaemon(): void {
  const r = spawnSync(path.join(ROOT, 'node_modules', '.bin', 'tsc'), ['-b', 'services/ublk-manager/tsconfig.build.json'], { cwd: ROOT, stdio: 'inherit' });
  if (r.status !== 0) throw new Error(`tsc -b services/ublk-manager failed (exit ${r.status})`);
}

/** tempRoot makes this suite's temp dir `<tmpdir>/sandnode-<prefix>-XXXXXX` (real path: sysfs shows backing files by it). */
export function tempRoot(prefix: string): string {
  return realpathSync(makeTempDir(prefix));
}

export type Slot = 'a' | 'b';
export interface Exit {
  code: number | null;
  signal: NodeJS.Signals | null;
}
export interface Daemon {
  proc: ChildProcess;
  done: Promise<Exit>;
  pid: number;
  /** set once the process exited */
  exit?: Exit;
}

/** spawnDaemon starts `node dist/main.js ...args` with exactly env, stdout and stderr appended to logFile. */
export function spawnDaemon(logFile: string, env: NodeJS.ProcessEnv, args: string[] = []): Daemon {
  const fd = openSync(logFile, 'a');
  const proc = spawn(process.execPath, [MAIN, ...args], { env, stdio: ['ignore', fd, fd] });
  closeSync(fd);
  const d: Daemon = {
    proc,
    pid: proc.pid ?? 0,
    done: new Promise<Exit>((resolve) =>
      proc.on('exit', (code, signal) => {
        d.exit = { code, signal };
        resolve(d.exit);
      }),
    ),
  };
  return d;
}

/**
 * waitForLog waits (up to timeoutMs) until logFile has a line of d's pid containing text
 * (the daemon's pino JSON lines); throws, with the log's tail, when d exits first or the
 * time runs out.
 */
export async function waitForLog(logFile: string, d: Daemon, text: string, timeoutMs = 30_000): Promise<void> {
  const seen = (): boolean =>
    readFileSync(logFile, 'utf8')
      .split('\n')
      .some((l) => l.includes(`"pid":${d.pid},`) && l.includes(text));
  const tail = (): string => readFileSync(logFile, 'utf8').slice(-3000);
  let outcome: 'seen' | 'exited';
  try {
    outcome = await waitFor(`a log line of pid ${d.pid} with ${text}`, () => (seen() ? 'seen' : d.exit ? 'exited' : undefined), timeoutMs);
  } catch (err) {
    throw new Error(`${(err as Error).message}; log:\n${tail()}`, { cause: err });
  }
  if (outcome === 'exited') throw new Error(`pid ${d.pid} exited (${JSON.stringify(d.exit)}) before a log line with ${text}; log:\n${tail()}`);
}

export function backingOf(dev: string): string | undefined {
  try {
    return readFileSync(`/sys/block/${path.basename(dev)}/loop/backing_file`, 'utf8').trim();
  } catch {
    return undefined;
  }
}

/** Loop devices (path -> backing file, without " (deleted)") whose backing file is under dir. */
export function loopsUnder(dir: string): Map<string, string> {
  const out = new Map<string, string>();
  for (const name of readdirSync('/sys/block').filter((n) => /^loop\d+$/.test(n))) {
    const f = backingOf(`/dev/${name}`)?.replace(/ \(deleted\)$/, '');
    if (f?.startsWith(`${dir}/`)) out.set(`/dev/${name}`, f);
  }
  return out;
}

/** imageLoopsUnder is loopsUnder without the image pool's own loop device (`.../ublk-manager/pool/images.xfs`). */
export function imageLoopsUnder(dir: string): Map<string, string> {
  return new Map([...loopsUnder(dir)].filter(([, f]) => !f.endsWith('/ublk-manager/pool/images.xfs')));
}

export function isMounted(dir: string): boolean {
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .some((l) => l.split(' ')[4] === dir);
}

/** Mount points under dir, in mount order. */
export function mountsUnder(dir: string): string[] {
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((l) => l.split(' ')[4] ?? '')
    .filter((m) => m.startsWith(`${dir}/`));
}

/**
 * cleanUpUnder undoes what a suite made under dir (call it once its daemons are dead):
 * thaws and unmounts every mount under it (last first), detaches every loop device backed
 * by a file under it (waiting up to 5 s for the kernel to let go), removes dir; then throws naming any mount or loop device left, so a
 * leak fails the suite instead of staying on the machine.
 */
/** imageFiles lists the images dir, sorted, without the empty ext4 templates dir (`.templates`, drivers/empty-images.ts). */
export function imageFiles(imagesDir: string): string[] {
  return readdirSync(imagesDir)
    .filter((n) => n !== '.templates')
    .sort();
}

export function cleanUpUnder(dir: string): void {
  for (const m of mountsUnder(dir).reverse()) {
    spawnSync('fsfreeze', ['--unfreeze', m], { stdio: 'ignore' });
    spawnSync('umount', [m]);
  }
  for (const dev of loopsUnder(dir).keys()) spawnSync('losetup', ['-d', dev]);
  // a detach (or an autoclear after the last umount) completes once the kernel and udev's
  // probes let go of the device: wait for that (bounded) before calling one a leak
  let left = [...mountsUnder(dir), ...loopsUnder(dir).keys()];
  for (let i = 0; i < 50 && left.length > 0; i++) {
    spawnSync('sleep', ['0.1']);
    for (const dev of loopsUnder(dir).keys()) spawnSync('losetup', ['-d', dev]);
    // the image pool (mounted on the images dir) unmounts once the image loop devices on it are gone
    for (const m of mountsUnder(dir).reverse()) spawnSync('umount', [m]);
    left = [...mountsUnder(dir), ...loopsUnder(dir).keys()];
  }
  if (left.length === 0) rmSync(dir, { recursive: true, force: true });
  else throw new Error(`left behind under ${dir} (not removed): ${left.join(', ')}`);
}

export function percentile(sorted: number[], p: number): number {
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[i] ?? NaN;
}

export function httpGet(url: string): Promise<string> {
  return new Promise((resolve, reject) => {
    http
      .get(url, (res) => {
        let body = '';
        res.on('data', (c: Buffer) => (body += c.toString()));
        res.on('end', () => resolve(body));
      })
      .on('error', reject);
  });
}
