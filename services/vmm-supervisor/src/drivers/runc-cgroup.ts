/**
 * What `runc pause`, `runc resume`, `runc state`, `runc kill` and `runc delete` do to a runc VM, done
 * in-process from its cgroup files (cgroup v1, the freezer hierarchy) and its init process,
 * without a process start each (runc is one process start of ~8 ms CPU per call; a drain's
 * stop made 9). A VM's cgroup is `/sandnode/<vmId>` (oci-spec.ts), so its freezer dir is
 * `<cgroupRoot>/freezer/sandnode/<vmId>`: a kernel filesystem (no symlinks, nothing the sandbox
 * can plant: it sees /sys/fs/cgroup read-only in its own cgroup namespace). Every function
 * says when it cannot tell (no v1 freezer: cgroup v2, a VM made with another cgroup path; a
 * state in between), and the driver then asks runc, as before.
 *
 * Signals go only to processes verified after being pinned by a pidfd (syscalls.ts): the init
 * by its start time, every other by its cgroup being the VM's (or below it).
 */
import { readdirSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import path from 'node:path';
import { isSameProcess, processLiveness } from '@sandnode/shared';
import { CGROUP_ROOT } from './cgroup-hierarchy';
import { signalVerified } from './syscalls';

export { CGROUP_ROOT };
/** How often freeze writes FROZEN again while the cgroup is FREEZING, and how many tries in all (runc's numbers: 1000 tries, a thaw and 10 ms pause every 50). */
const FREEZE_TRIES = 1000;
const FREEZE_THAW_EVERY = 50;
const FREEZE_THAW_PAUSE_MS = 10;

/** A v1 freezer state (freezer.state). */
export type FreezerState = 'THAWED' | 'FREEZING' | 'FROZEN';

/** vmCgroupPath is the cgroup of vmId's container, as in its OCI spec (`/sandnode/<vmId>`). */
export function vmCgroupPath(vmId: string): string {
  return `/sandnode/${vmId}`;
}

/**
 * setCpuBurst lets vmId's cgroup spend up to burstUs of CPU time it left unused in earlier CFS
 * periods on top of its quota in one period (Linux >= 5.14: v1 `cpu.cfs_burst_us`, v2
 * `cpu.max.burst` under v2Root; kernel docs sched-bwc "burst"). Without it a start that runs
 * several threads at once (Node: V8's compiler and GC threads) is throttled in most periods:
 * podd's start in a 1-vCPU sandbox was throttled 40-90 ms of its 180-210 ms. The average stays
 * at the quota. Returns false, changing nothing, where the kernel has no burst file or the
 * cgroup is not there (best effort: the VM runs as before).
 */
export function setCpuBurst(vmId: string, burstUs: number, root = CGROUP_ROOT, v2Root?: string): boolean {
  const files = v2Root !== undefined ? [path.join(v2Root, vmCgroupPath(vmId), 'cpu.max.burst')] : [path.join(root, 'cpu', vmCgroupPath(vmId), 'cpu.cfs_burst_us')];
  for (const f of files) {
    try {
      writeFileSync(f, `${Math.max(0, Math.floor(burstUs))}\n`, { flag: 'r+' });
      return true;
    } catch {
      /* no such file: an older kernel, no cpu controller there, or no such cgroup */
    }
  }
  return false;
}

/** freezerDir is vmId's v1 freezer dir, or undefined when it has none (cgroup v2, no such cgroup). */
export function freezerDir(vmId: string, root = CGROUP_ROOT): string | undefined {
  const dir = path.join(root, 'freezer', vmCgroupPath(vmId));
  return readFreezer(dir) === undefined ? undefined : dir;
}

/** readFreezer reads dir's freezer.state, undefined when it cannot be read or is unknown. */
export function readFreezer(dir: string): FreezerState | undefined {
  try {
    const s = readFileSync(path.join(dir, 'freezer.state'), 'utf8').trim();
    return s === 'THAWED' || s === 'FREEZING' || s === 'FROZEN' ? s : undefined;
  } catch {
    return undefined;
  }
}

/**
 * liveStatus is what `runc state` would say of a VM whose init is init (pid, start ticks):
 * 'stopped' when that process is gone or a zombie (runc's status is its init's), 'paused' or
 * 'running' from the freezer when it runs, undefined when it cannot tell (no freezer dir,
 * FREEZING, init unknown, /proc unreadable).
 */
export function liveStatus(vmId: string, init: { pid: number; startTimeTicks: number }, root = CGROUP_ROOT): 'stopped' | 'paused' | 'running' | undefined {
  if (init.pid <= 0) return undefined;
  const l = processLiveness(init.pid, init.startTimeTicks);
  if (l === 'gone') return 'stopped';
  if (l === 'unknown') return undefined; // /proc unreadable (EMFILE ...): never "stopped" on a failed read
  const dir = path.join(root, 'freezer', vmCgroupPath(vmId));
  const s = readFreezer(dir);
  if (s === 'FROZEN') return selfFreezing(dir) ? 'paused' : undefined; // frozen through an ancestor: not runc's "paused"
  if (s === 'THAWED') return 'running';
  return undefined;
}

/** selfFreezing says whether dir is frozen by its own freezer.state (not an ancestor's). */
function selfFreezing(dir: string): boolean {
  try {
    return readFileSync(path.join(dir, 'freezer.self_freezing'), 'utf8').trim() === '1';
  } catch {
    return false;
  }
}

/**
 * freeze freezes the v1 freezer dir as `runc pause` does (write FROZEN until it reads FROZEN,
 * a thaw and a pause every 50 tries, 1000 tries). Returns true once FROZEN; false when it stayed
 * FREEZING (left THAWED) or the file cannot be written. Never blocks the event loop for more
 * than one try.
 */
export async function freeze(dir: string): Promise<boolean> {
  const file = path.join(dir, 'freezer.state');
  try {
    for (let i = 0; i < FREEZE_TRIES; i++) {
      if (i % FREEZE_THAW_EVERY === FREEZE_THAW_EVERY - 1) {
        writeFileSync(file, 'THAWED');
        await new Promise((r) => setTimeout(r, FREEZE_THAW_PAUSE_MS));
      }
      writeFileSync(file, 'FROZEN');
      const s = readFreezer(dir);
      if (s === 'FROZEN') return true;
      if (s !== 'FREEZING') break;
      await new Promise((r) => setImmediate(r));
    }
    writeFileSync(file, 'THAWED');
  } catch {
    /* cannot be written: the caller asks runc */
  }
  return false;
}

/** thaw writes THAWED to the v1 freezer dir (`runc resume`); returns false when it cannot. */
export function thaw(dir: string): boolean {
  try {
    writeFileSync(path.join(dir, 'freezer.state'), 'THAWED');
    return readFreezer(dir) === 'THAWED';
  } catch {
    return false;
  }
}

/** cgroupPids lists the processes of the cgroup dir and of every cgroup below it (cgroup.procs). */
export function cgroupPids(dir: string): number[] {
  const out: number[] = [];
  const walk = (d: string) => {
    for (const l of readFileSync(path.join(d, 'cgroup.procs'), 'utf8').split('\n')) if (l) out.push(Number(l));
    for (const e of readdirSync(d, { withFileTypes: true })) if (e.isDirectory()) walk(path.join(d, e.name));
  };
  walk(dir);
  return out;
}

/** inFreezerCgroup says whether pid's v1 freezer cgroup (/proc/<pid>/cgroup) is cgroup or below it. */
export function inFreezerCgroup(pid: number, cgroup: string): boolean {
  try {
    for (const line of readFileSync(`/proc/${pid}/cgroup`, 'utf8').split('\n')) {
      const [, controllers, p] = line.split(':', 3) as [string, string?, string?];
      if (controllers?.split(',').includes('freezer')) return p === cgroup || (p ?? '').startsWith(`${cgroup}/`);
    }
  } catch {
    /* gone */
  }
  return false;
}

/**
 * killFrozen sends SIGKILL to every process of vmId's frozen freezer cgroup (`runc kill --all`
 * of a paused container: frozen tasks neither exit nor fork, so the list stays true until the
 * thaw, which lets them die). Each is pinned and checked to be in the VM's cgroup first.
 * Returns the number signalled; undefined when the cgroup is not FROZEN (the caller asks runc).
 */
export function killFrozen(vmId: string, root = CGROUP_ROOT): number | undefined {
  const dir = path.join(root, 'freezer', vmCgroupPath(vmId));
  if (readFreezer(dir) !== 'FROZEN') return undefined;
  let n = 0;
  for (const pid of cgroupPids(dir)) if (signalVerified(pid, 9, (p) => inFreezerCgroup(p, vmCgroupPath(vmId))) === 'signalled') n++;
  return n;
}

/**
 * signalInit sends sig to the VM's init process (`runc kill <id> <sig>`) if it still is the
 * process that started at init.startTimeTicks (checked once pinned). Returns the outcome.
 */
export function signalInit(init: { pid: number; startTimeTicks: number }, sig: number): 'signalled' | 'gone' | 'not-verified' {
  if (init.pid <= 0) return 'not-verified';
  return signalVerified(init.pid, sig, (p) => isSameProcess(p, init.startTimeTicks));
}

/** How often a cgroup dir still busy (its last tasks exiting) is tried again, and the first pause, ms (doubled each time; runc's numbers). */
const RMDIR_TRIES = 5;
const RMDIR_FIRST_PAUSE_MS = 10;

/**
 * deleteStopped does what `runc delete` does for a stopped container of ours (one with no
 * hooks and its own pid namespace): remove its cgroup dirs (those runc recorded in
 * `<runcRoot>/<vmId>/state.json`, each of which must be `<root>/<hierarchy>/sandnode/<vmId>`,
 * or on a unified host its one v2 dir `<root>/sandnode/<vmId>` under the key ""),
 * children first, then its state dir. Returns true when done; false (having removed at most
 * some empty cgroup dirs) when it cannot be sure: state unreadable, a path of another form, a
 * process still in the cgroup, a dir still busy. The caller then runs `runc delete --force`.
 */
export async function deleteStopped(runcRoot: string, vmId: string, root = CGROUP_ROOT): Promise<boolean> {
  const stateDir = path.join(runcRoot, vmId);
  let entries: [string, string][];
  try {
    const st = JSON.parse(readFileSync(path.join(stateDir, 'state.json'), 'utf8')) as { cgroup_paths?: Record<string, unknown> };
    entries = Object.entries(st.cgroup_paths ?? {}).map(([k, v]) => [k, String(v)]);
  } catch {
    return false;
  }
  // `<root>/<hierarchy>/sandnode/<vmId>` (v1, and hybrid's v2 tree `unified`); on a unified
  // host runc names the one v2 dir `<root>/sandnode/<vmId>`, under the key ""
  const own = ([key, p]: [string, string]) => {
    const rel = path.relative(root, p).split('/');
    if (!path.isAbsolute(p) || path.normalize(p) !== p) return false;
    if (key === '' && rel.length === 2 && rel[0] === 'sandnode' && rel[1] === vmId) return true;
    return rel.length === 3 && rel[0] !== '..' && rel[1] === 'sandnode' && rel[2] === vmId;
  };
  if (entries.length === 0 || !entries.every(own)) return false;
  for (const p of new Set(entries.map(([, p]) => p))) if (!(await removeCgroupDir(p))) return false;
  await rm(stateDir, { recursive: true, force: true });
  return true;
}

/** removeCgroupDir removes the cgroup dir p and those below it (children first) when no process is in them; true when p is gone. */
async function removeCgroupDir(p: string): Promise<boolean> {
  let subs: string[];
  try {
    subs = readdirSync(p, { withFileTypes: true })
      .filter((e) => e.isDirectory())
      .map((e) => path.join(p, e.name));
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'ENOENT'; // gone already
  }
  try {
    if (readFileSync(path.join(p, 'cgroup.procs'), 'utf8').trim() !== '') return false;
  } catch {
    return false; // not a cgroup
  }
  for (const s of subs) if (!(await removeCgroupDir(s))) return false;
  for (let i = 0, pause = RMDIR_FIRST_PAUSE_MS; ; i++, pause *= 2) {
    try {
      rmdirSync(p);
      return true;
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === 'ENOENT') return true;
      if (code !== 'EBUSY' || i >= RMDIR_TRIES - 1) return false;
      await new Promise((r) => setTimeout(r, pause));
    }
  }
}
