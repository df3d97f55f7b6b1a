/**
 * What a node leaves on the host, found from the host's own tables (mountinfo, /sys/block,
 * /proc), and `down --purge`, which removes it: runc containers, mounts, loop devices and the
 * node's dirs. Also the check the demo and the tests end with: nothing of the node is left.
 */
import { existsSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import path from 'node:path';
import { run } from '@sandnode/shared';
import type { StackDirs } from './components';

/** What `down --purge` removed. */
export interface PurgeReport {
  /** runc container ids deleted */
  containers: string[];
  /** mount points unmounted (absolute, deepest first) */
  mounts: string[];
  /** loop devices detached ("/dev/loop3") */
  loopDevices: string[];
  /** dirs removed (absolute: the run dir and the state dir) */
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
      if (backing === root || backing.startsWith(`${root}/`)) out.push(`/dev/${n}`);
    } catch {
      /* not attached */
    }
  }
  return out;
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
