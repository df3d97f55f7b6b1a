/**
 * What a node leaves on the host, found from the host's own tables (mountinfo, /sys/block,
 * /proc), and `down --purge`, which removes it: runc containers, the mounts and loop devices
 * sandnode made, and the node's dirs (never a mount of someone else's below them). Also the check the demo and the tests end with: nothing of the node is left.
 */
import { existsSync, readFileSync, readdirSync, realpathSync, rmSync } from 'node:fs';
import path from 'node:path';
import { defaultNetworkTag, processLiveness, purgeNodeNetwork, run, type Liveness, type PurgedNetwork } from '@sandnode/shared';
import type { StackDirs } from './components';
import { stopProcess } from './daemon-process';

/** What `down --purge` removed, and what it left because sandnode did not make it. */
export interface PurgeReport {
  /** runc container ids deleted */
  containers: string[];
  /** mount points unmounted (absolute, deepest first) */
  mounts: string[];
  /** loop devices detached ("/dev/loop3") */
  loopDevices: string[];
  /** dirs removed (absolute: the run dir and the state dir) */
  dirs: string[];
  /** pid of the node's freeze watchdog stopped (SIGTERM, then SIGKILL after {@link WATCHDOG_STOP_TIMEOUT_MS}); absent when none ran */
  watchdogPid?: number;
  /**
   * dirs left in place (absolute) and why: a mount sandnode did not make (or could not
   * unmount) at or below them; everything else in them was removed, the mount untouched
   */
  kept: { path: string; why: string }[];
  /** the node's network: its nftables table, interfaces and netns mounts (purgeNodeNetwork) */
  network?: PurgedNetwork;
}

/** The supervisor's freeze watchdog files (vmm-supervisor drivers/freeze-watchdog-files.ts): `<runDir>/freeze-watchdog/watchdog.json`. */
const WATCHDOG_PID_FILE = path.join('freeze-watchdog', 'watchdog.json');
/** The watchdog's entry point as its command line names it. */
const WATCHDOG_MAIN = 'freeze-watchdog-main.js';
/** How long purge waits for the watchdog to exit after SIGTERM before SIGKILL, ms. */
export const WATCHDOG_STOP_TIMEOUT_MS = 5000;

/**
 * What {@link watchdogOf} read: the watchdog's pid and whether it runs. `unknown` when /proc
 * could not be read (EMFILE, EACCES, a half-read stat): purge then cannot tell, and must not act
 * as if no watchdog ran.
 */
export interface WatchdogSeen {
  /** the pid its pid file names */
  pid: number;
  /** alive: that pid runs the watchdog that started at the file's startTicks */
  liveness: Liveness;
}

/**
 * watchdogOf reads runDir's freeze watchdog pid file (`{"schema":1,"pid","startTicks"}`):
 * undefined when there is none or it is malformed; else the pid with `alive` only when a live
 * process that started at startTicks (not a zombie, not a reused pid) runs
 * freeze-watchdog-main.js, `gone` when /proc says it does not, `unknown` when /proc could not be
 * read. liveness is injectable for tests.
 */
export function watchdogOf(runDir: string, liveness: (pid: number, startTicks: number) => Liveness = processLiveness): WatchdogSeen | undefined {
  let j: { schema?: unknown; pid?: unknown; startTicks?: unknown };
  try {
    j = JSON.parse(readFileSync(path.join(runDir, WATCHDOG_PID_FILE), 'utf8')) as typeof j;
  } catch {
    return undefined;
  }
  if (j.schema !== 1 || typeof j.pid !== 'number' || !Number.isInteger(j.pid) || j.pid <= 0 || typeof j.startTicks !== 'number') return undefined;
  const pid = j.pid;
  const seen = liveness(pid, j.startTicks);
  if (seen !== 'alive') return { pid, liveness: seen };
  let args: string[];
  try {
    args = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
  } catch (err) {
    return { pid, liveness: (err as NodeJS.ErrnoException).code === 'ENOENT' || (err as NodeJS.ErrnoException).code === 'ESRCH' ? 'gone' : 'unknown' };
  }
  // a live process with another command line is not the watchdog (a reused pid that kept the ticks cannot be: ticks differ)
  return { pid, liveness: args.some((a) => path.basename(a) === WATCHDOG_MAIN) ? 'alive' : 'gone' };
}

/** liveWatchdog: the pid of runDir's live freeze watchdog ({@link watchdogOf} said alive), else undefined. */
export function liveWatchdog(runDir: string): number | undefined {
  const seen = watchdogOf(runDir);
  return seen?.liveness === 'alive' ? seen.pid : undefined;
}

/** One line of /proc/self/mountinfo, the fields purge decides by. */
export interface MountEntry {
  /** absolute mount point */
  mountPoint: string;
  /** "ext4", "overlay", "tmpfs", ... */
  fsType: string;
  /** the mount source ("/dev/loop3", "overlay", "tmpfs") */
  source: string;
}

/** What the supervisor's runc driver mounts in each VM dir, `<runDir>/vms/<vmId>/<name>`. */
const VM_MOUNT_NAMES: ReadonlySet<string> = new Set(['upper-dev', 'rootfs', 'workspace']);
/** The runc driver's per-VM tmpfs mounts, `<runDir>/vm-tmpfs/<vmId>/<name>` (guest run dir, console log). */
const VM_TMPFS_NAMES: ReadonlySet<string> = new Set(['guest', 'console']);

/**
 * classifyMounts decides which mounts at or below runDir/stateDir sandnode made (`ours`,
 * deepest first): the supervisor's per-VM mounts (`<runDir>/vms/<vmId>/upper-dev|rootfs|workspace`)
 * and their tmpfs (`<runDir>/vm-tmpfs/<vmId>/guest|console`, type tmpfs) and any mount of a loop device whose backing file is a sandnode image
 * (`<stateDir>/images/<id>.img`; loopBacking maps "/dev/loopN" to its backing file). Every
 * other mount there is `foreign` (the user's): purge never unmounts it. Pure.
 */
export function classifyMounts(mounts: MountEntry[], dirs: { runDir: string; stateDir: string }, loopBacking: ReadonlyMap<string, string>): { ours: string[]; foreign: MountEntry[] } {
  const runDir = path.resolve(dirs.runDir);
  const stateDir = path.resolve(dirs.stateDir);
  const vmsDir = path.join(runDir, 'vms');
  const tmpfsDir = path.join(runDir, 'vm-tmpfs');
  const ours: string[] = [];
  const foreign: MountEntry[] = [];
  for (const m of mounts) {
    if (!isAtOrBelow(m.mountPoint, runDir) && !isAtOrBelow(m.mountPoint, stateDir)) continue;
    const rel = path.relative(vmsDir, m.mountPoint).split(path.sep);
    const relT = path.relative(tmpfsDir, m.mountPoint).split(path.sep);
    const vmMount =
      (rel.length === 2 && rel[0] !== '..' && rel[0] !== '' && VM_MOUNT_NAMES.has(rel[1]!)) ||
      (m.fsType === 'tmpfs' && relT.length === 2 && relT[0] !== '..' && relT[0] !== '' && VM_TMPFS_NAMES.has(relT[1]!));
    const backing = loopBacking.get(m.source);
    if (vmMount || (backing !== undefined && isSandnodeImage(backing, stateDir))) ours.push(m.mountPoint);
    else foreign.push(m);
  }
  return { ours: ours.sort((a, b) => b.length - a.length), foreign };
}

/** isSandnodeImage: file is a ublk-manager image of this state dir (`<stateDir>/images/<id>.img`). */
export function isSandnodeImage(file: string, stateDir: string): boolean {
  return path.dirname(file) === path.join(path.resolve(stateDir), 'images') && file.endsWith('.img');
}

function isAtOrBelow(p: string, root: string): boolean {
  return p === root || p.startsWith(`${root}/`);
}

/** realDir resolves symlinks of an existing dir (mountinfo names real paths). */
function realDir(d: string): string {
  const abs = path.resolve(d);
  try {
    return realpathSync(abs);
  } catch {
    return abs;
  }
}

/**
 * purgeNode removes what the stack left on the host below its dirs: runc containers under
 * <runDir>/runc, the mounts sandnode made there ({@link classifyMounts}; deepest first), loop
 * devices whose backing file is a sandnode image, then both dirs. A mount it did not make (a
 * tmpfs the user mounted at <stateDir>/mine) is never unmounted nor entered: the dirs leading
 * to it stay, everything else is removed, and `kept` says so. A mount of sandnode with such a
 * mount below it stays mounted too (a lazy unmount would detach the user's mount with it), and
 * a busy one is detached lazily only while nothing is mounted below it. Only for
 * `down --purge`, after the daemons stopped. liveness (injectable for tests) tells whether the
 * freeze watchdog runs; when it cannot tell, the run dir is kept and `kept` says why.
 */
export async function purgeNode(dirs: StackDirs, liveness: (pid: number, startTicks: number) => Liveness = processLiveness): Promise<PurgeReport> {
  const runDir = realDir(dirs.runDir);
  const stateDir = realDir(dirs.stateDir);
  const report: PurgeReport = { containers: [], mounts: [], loopDevices: [], dirs: [], kept: [] };
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
  // the network first: its netns bind mounts (nsfs) are not mounts classifyMounts would take for ours
  report.network = purgeNodeNetwork({ tag: dirs.network?.tag ?? defaultNetworkTag(dirs.stateDir), runDir });
  const loops = loopBackingFiles();
  const classified = classifyMounts(readMounts(), { runDir, stateDir }, loops);
  const { ours } = classified;
  // the ublk-manager's image pool (an XFS file system in <stateDir>/ublk-manager/pool/images.xfs,
  // mounted on <stateDir>/images): unmounted after the image loop devices on it are detached
  const poolFile = path.join(stateDir, 'ublk-manager', 'pool', 'images.xfs');
  const poolMounts = classified.foreign.filter((m) => loops.get(m.source) === poolFile && m.mountPoint === path.join(stateDir, 'images'));
  const foreign = classified.foreign.filter((m) => !poolMounts.includes(m));
  /** mount points not to enter: foreign ones and ours that would not unmount */
  const blocked = foreign.map((m) => ({ at: m.mountPoint, why: `a ${m.fsType} mount sandnode did not make (from ${m.source})` }));
  for (const m of ours) {
    // a lazy unmount detaches the whole subtree: never with a mount of someone else below it
    const below = foreign.filter((f) => f.mountPoint !== m && isAtOrBelow(f.mountPoint, m)).map((f) => f.mountPoint);
    if (below.length) {
      blocked.push({ at: m, why: `a sandnode mount left mounted because ${below.join(', ')} below it is not sandnode's` });
      continue;
    }
    try {
      await run('umount', [m]).catch(async (err: unknown) => {
        // busy: detach lazily only when nothing is mounted below it any more (a mount that appeared since is kept)
        const now = mountsBelow([m]).filter((mp) => mp !== m);
        if (now.length) throw new Error(`${(err as Error).message.split('\n')[0]}; not detached lazily: ${now.join(', ')} is mounted below it`, { cause: err });
        return run('umount', ['-l', m]);
      });
      report.mounts.push(m);
    } catch (err) {
      blocked.push({ at: m, why: `a sandnode mount that would not unmount (${(err as Error).message.split('\n')[0]})` });
    }
  }
  for (const [dev, backing] of loops) {
    if (!isSandnodeImage(backing, stateDir)) continue;
    await run('losetup', ['-d', dev]).catch(() => undefined);
    report.loopDevices.push(dev);
  }
  for (const m of poolMounts) {
    // the detaches above complete once the kernel lets go of the image files: retry a while
    let err: unknown;
    for (let i = 0; i < 50; i++) {
      err = await run('umount', [m.mountPoint]).then(
        () => undefined,
        (e: unknown) => e,
      );
      if (err === undefined) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    if (err === undefined) report.mounts.push(m.mountPoint);
    else blocked.push({ at: m.mountPoint, why: `the image pool, which would not unmount (${(err as Error).message.split('\n')[0]})` });
  }
  for (const [dev, backing] of loops) {
    if (backing !== poolFile) continue;
    await run('losetup', ['-d', dev]).catch(() => undefined);
    report.loopDevices.push(dev);
  }
  // the freeze watchdog outlives the supervisor by design (it thaws at a deadline): with the
  // containers and mounts gone it has nothing to guard; stop it rather than leave it until it
  // sees its dir removed
  const watchdog = watchdogOf(runDir, liveness);
  if (watchdog?.liveness === 'alive' && (await stopProcess(watchdog.pid, { timeoutMs: WATCHDOG_STOP_TIMEOUT_MS, killAfterTimeout: true }))) report.watchdogPid = watchdog.pid;
  for (const d of [runDir, stateDir]) {
    if (!existsSync(d)) continue;
    if (d === runDir && watchdog?.liveness === 'unknown') {
      // /proc could not be read: the watchdog may still run and guard a frozen sandbox; removing its dir would hide it
      report.kept.push({ path: d, why: `could not tell from /proc whether the freeze watchdog (pid ${watchdog.pid}) still runs: left in place; run down --purge again` });
      continue;
    }
    const inside = blocked.filter((b) => isAtOrBelow(b.at, d));
    if (!inside.length) {
      rmSync(d, { recursive: true, force: true });
      report.dirs.push(d);
      continue;
    }
    removeAround(
      d,
      inside.map((b) => b.at),
    );
    report.kept.push({ path: d, why: `${inside.map((b) => `${b.at} is ${b.why}`).join('; ')}: left in place, the rest removed; unmount it and remove ${d} yourself` });
  }
  return report;
}

/** removeAround removes everything in dir except the mount points in keep and the dirs leading to them. */
function removeAround(dir: string, keep: string[]): void {
  if (keep.includes(dir)) return;
  for (const name of readdirSync(dir)) {
    const p = path.join(dir, name);
    if (keep.some((k) => isAtOrBelow(k, p))) removeAround(p, keep);
    else rmSync(p, { recursive: true, force: true });
  }
}

/** unescapeMountinfo decodes the octal escapes (\040 for space) of a mountinfo field. */
function unescapeMountinfo(s: string): string {
  return s.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));
}

/** parseMountinfo reads the mounts of a /proc/<pid>/mountinfo text (proc(5)). Pure. */
export function parseMountinfo(text: string): MountEntry[] {
  const out: MountEntry[] = [];
  for (const line of text.split('\n')) {
    const f = line.split(' ');
    const sep = f.indexOf('-', 6);
    if (f.length < 5 || sep < 0) continue;
    out.push({ mountPoint: unescapeMountinfo(f[4]!), fsType: f[sep + 1] ?? '', source: unescapeMountinfo(f[sep + 2] ?? '') });
  }
  return out;
}

function readMounts(): MountEntry[] {
  return parseMountinfo(readFileSync('/proc/self/mountinfo', 'utf8'));
}

/** mountsBelow lists mount points below any of roots, deepest first (from /proc/self/mountinfo). */
export function mountsBelow(roots: string[]): string[] {
  return readMounts()
    .map((m) => m.mountPoint)
    .filter((mp) => roots.some((r) => isAtOrBelow(mp, r)))
    .sort((a, b) => b.length - a.length);
}

/** loopBackingFiles maps each attached loop device ("/dev/loop3") to its backing file (from /sys/block). */
function loopBackingFiles(): Map<string, string> {
  const out = new Map<string, string>();
  let names: string[];
  try {
    names = readdirSync('/sys/block').filter((n) => n.startsWith('loop'));
  } catch {
    return out;
  }
  for (const n of names) {
    try {
      const backing = readFileSync(`/sys/block/${n}/loop/backing_file`, 'utf8')
        .trim()
        .replace(/ \(deleted\)$/, '');
      out.set(`/dev/${n}`, backing);
    } catch {
      /* not attached */
    }
  }
  return out;
}

/** loopDevicesBelow lists loop devices whose backing file is below root (from /sys/block). */
export function loopDevicesBelow(root: string): string[] {
  return [...loopBackingFiles()].filter(([, backing]) => isAtOrBelow(backing, root)).map(([dev]) => dev);
}

/**
 * sandnodeProcesses lists live processes running a sandnode component main.js whose
 * environment names runDir (the stack of these dirs, of any build): pid and command line.
 */
export function sandnodeProcesses(runDir: string): { pid: number; cmd: string }[] {
  const marker = `RUN_DIR=${path.resolve(runDir)}`;
  const out: { pid: number; cmd: string }[] = [];
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const cmd = readFileSync(`/proc/${d}/cmdline`, 'utf8').split('\0').join(' ').trim();
      if (!/services\/(vmm-supervisor|ublk-manager|server)\/dist\/main\.js/.test(cmd)) continue;
      if (
        readFileSync(`/proc/${d}/environ`, 'utf8')
          .split('\0')
          .some((e) => e.endsWith(marker))
      )
        out.push({ pid: Number(d), cmd });
    } catch {
      /* gone */
    }
  }
  return out;
}
