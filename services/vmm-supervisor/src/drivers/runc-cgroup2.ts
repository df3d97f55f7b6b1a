/**
 * What `runc pause`, `runc resume`, `runc state` and `runc kill --all` do to a runc VM on a
 * cgroup v2 tree, done in-process from its cgroup files (the v2 twin of runc-cgroup.ts, which
 * keeps the v1 freezer): `cgroup.freeze` + `cgroup.events` (freeze, thaw, status),
 * `cgroup.kill` (every process of the cgroup and below it, frozen or not; Linux 5.14), and the
 * readings `cpu.stat`, `memory.current`, `pids.current` and the limits runc wrote from the
 * spec (`memory.max`, `memory.swap.max`, `pids.max`, `cpu.max`, `io.max`) where the tree has
 * those controllers.
 *
 * Finding the cgroup (vmCgroup2Dir): runc's own record, `<runcRoot>/<vmId>/state.json` (a dir
 * of the supervisor, 0700: the sandbox never writes it), names it in cgroup_paths[""]; it is
 * used only when it is exactly `<v2Root>/sandnode/<vmId>` (no `..`, no other VM's), on a
 * cgroup2 filesystem, for the init runc recorded (pid and start ticks equal to the VM row's),
 * and when that init's `0::` line in /proc/<pid>/cgroup (read between two reads of its start
 * ticks, so a reused pid is never taken for it) is that cgroup or below it. The path is never
 * built from what the sandbox can write: the `0::` line only confirms. A line with `..` (a
 * cgroup outside the reader's cgroup namespace) or anything else is "cannot tell": every
 * function here then answers undefined or false and the driver asks runc, as before.
 *
 * The files read are the kernel's; their contents are still parsed strictly (a number, `max`,
 * a known key), anything else is "cannot tell".
 */
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { processLiveness, processStartTicks } from '@sandnode/shared';
import { CGROUP2_SUPER_MAGIC, fsType } from './cgroup-hierarchy';
import { signalVerified } from './syscalls';

/** Longest a freeze waits for `frozen 1` in cgroup.events before it thaws again and gives up, in ms (runc's: 1000 × 10 ms). */
export const DEFAULT_FREEZE2_TIMEOUT_MS = 10_000;
/** Longest pause between two reads of cgroup.events while freezing, in ms (the first reads come sooner). */
const FREEZE2_POLL_MAX_MS = 10;
/** How deep the pid walk of a cgroup without cgroup.kill goes (the kernel's default cgroup.max.depth is unlimited). */
const WALK_MAX_DEPTH = 32;
/** The parent of every VM cgroup (oci-spec.ts cgroupsPath `/sandnode/<vmId>`). */
export const VM_CGROUP_PARENT = 'sandnode';

/** Writes go to an existing file only (r+: never created; a cgroup file that is missing is ENOENT). */
const WRITE_EXISTING = { flag: 'r+' } as const;

/** The VM's init as the VM row names it. */
export interface InitProcess {
  pid: number;
  startTimeTicks: number;
}

/** isVmIdComponent says whether vmId is one path component runc accepts as an id (no `/`, not `.` or `..`). */
function isVmIdComponent(vmId: string): boolean {
  return /^[A-Za-z0-9_+.-]+$/.test(vmId) && vmId !== '.' && vmId !== '..';
}

/**
 * processCgroup2 returns the `0::` path of pid's /proc/<pid>/cgroup (its cgroup in the v2
 * tree, as seen from this process's cgroup namespace) if pid still is the process that
 * started at startTicks before and after the read, and not a zombie (a zombie keeps its
 * cgroup line after its cgroup emptied); undefined when it is not, is gone, has no
 * `0::` line, or the path is not a clean absolute path (`..`, `.`, empty components, a
 * ` (deleted)` suffix).
 */
export function processCgroup2(pid: number, startTicks: number): string | undefined {
  if (!Number.isInteger(pid) || pid <= 0 || processLiveness(pid, startTicks) !== 'alive') return undefined;
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/cgroup`, 'utf8');
  } catch {
    return undefined;
  }
  if (processLiveness(pid, startTicks) !== 'alive') return undefined; // the pid was reused (or it exited) meanwhile
  const line = text.split('\n').find((l) => l.startsWith('0::'));
  const p = line?.slice(3);
  if (p === undefined || !isCleanAbsolute(p)) return undefined;
  return p;
}

/** isCleanAbsolute: `/` or `/a/b` with no empty, `.` or `..` component and nothing but printable non-space characters. */
function isCleanAbsolute(p: string): boolean {
  if (p === '/') return true;
  if (!p.startsWith('/') || !/^[\x21-\x7e]+$/.test(p)) return false;
  return p
    .slice(1)
    .split('/')
    .every((c) => c !== '' && c !== '.' && c !== '..');
}

/** isAtOrBelow says whether the clean absolute cgroup path p is cgroup or below it. */
function isAtOrBelow(p: string, cgroup: string): boolean {
  return p === cgroup || p.startsWith(`${cgroup}/`);
}

/**
 * vmCgroup2Dir returns the host dir of vmId's cgroup in the cgroup2 tree mounted at v2Root,
 * found from runc's state and confirmed by the init (see the file header); undefined when
 * any check fails (the caller asks runc). Reads state.json (size: tens of KiB), statfs and
 * /proc; no process start.
 */
export function vmCgroup2Dir(runcRoot: string, vmId: string, init: InitProcess, v2Root: string): string | undefined {
  if (!isVmIdComponent(vmId) || init.pid <= 0) return undefined;
  const expected = path.join(v2Root, VM_CGROUP_PARENT, vmId);
  let st: { init_process_pid?: unknown; init_process_start?: unknown; cgroup_paths?: Record<string, unknown> };
  try {
    st = JSON.parse(readFileSync(path.join(runcRoot, vmId, 'state.json'), 'utf8')) as typeof st;
  } catch {
    return undefined;
  }
  if (st.cgroup_paths?.[''] !== expected) return undefined;
  if (st.init_process_pid !== init.pid || Number(st.init_process_start) !== init.startTimeTicks) return undefined;
  if (fsType(expected) !== CGROUP2_SUPER_MAGIC) return undefined;
  const own = processCgroup2(init.pid, init.startTimeTicks);
  if (own === undefined || !isAtOrBelow(own, `/${VM_CGROUP_PARENT}/${vmId}`)) return undefined;
  return expected;
}

/** Cgroup2Events: the keys of cgroup.events. */
export interface Cgroup2Events {
  /** some process is in the cgroup or below it */
  populated: boolean;
  /** the cgroup is frozen (by its own cgroup.freeze or an ancestor's) */
  frozen: boolean;
}

/** readEvents reads dir's cgroup.events; undefined when unreadable or a key is missing or not 0/1. */
export function readEvents(dir: string): Cgroup2Events | undefined {
  let text: string;
  try {
    text = readFileSync(path.join(dir, 'cgroup.events'), 'utf8');
  } catch {
    return undefined;
  }
  const kv = flatKeyed(text);
  const populated = kv.get('populated');
  const frozen = kv.get('frozen');
  if ((populated !== '0' && populated !== '1') || (frozen !== '0' && frozen !== '1')) return undefined;
  return { populated: populated === '1', frozen: frozen === '1' };
}

/** readFreeze2 reads dir's own cgroup.freeze ("1": this cgroup asked to be frozen); undefined when unreadable or not 0/1. */
export function readFreeze2(dir: string): '0' | '1' | undefined {
  try {
    const v = readFileSync(path.join(dir, 'cgroup.freeze'), 'utf8').trim();
    return v === '0' || v === '1' ? v : undefined;
  } catch {
    return undefined;
  }
}

/**
 * liveStatus2 is what `runc state` would say of the VM whose v2 cgroup is dir and whose init is
 * init: 'stopped' when the init is gone or a zombie; 'paused' when its own cgroup.freeze is 1
 * and cgroup.events says frozen; 'running' when both are 0; undefined when it cannot tell
 * (no dir, freezing or thawing in between, frozen only through an ancestor, /proc unreadable).
 */
export function liveStatus2(dir: string | undefined, init: InitProcess): 'stopped' | 'paused' | 'running' | undefined {
  if (init.pid <= 0) return undefined;
  const l = processLiveness(init.pid, init.startTimeTicks);
  if (l === 'gone') return 'stopped';
  if (l === 'unknown' || dir === undefined) return undefined;
  const own = readFreeze2(dir);
  const ev = readEvents(dir);
  if (own === undefined || ev === undefined) return undefined;
  if (own === '1' && ev.frozen) return 'paused';
  if (own === '0' && !ev.frozen) return 'running';
  return undefined;
}

/**
 * freeze2 freezes dir as `runc pause` does on v2: writes 1 to cgroup.freeze, then reads
 * cgroup.events until it says `frozen 1`, at most timeoutMs (default
 * {@link DEFAULT_FREEZE2_TIMEOUT_MS}). Returns true once frozen; false when it did not freeze
 * in time (cgroup.freeze is set back to 0) or a file cannot be written or read. The event loop
 * is never held: the reads are spread over timers.
 */
export async function freeze2(dir: string, timeoutMs = DEFAULT_FREEZE2_TIMEOUT_MS): Promise<boolean> {
  const file = path.join(dir, 'cgroup.freeze');
  try {
    writeFileSync(file, '1', WRITE_EXISTING);
    const until = Date.now() + timeoutMs;
    for (let pause = 0; ; pause = Math.min(FREEZE2_POLL_MAX_MS, Math.max(1, pause * 2))) {
      const ev = readEvents(dir);
      if (ev === undefined) break;
      if (ev.frozen && readFreeze2(dir) === '1') return true;
      if (Date.now() >= until) break;
      await new Promise((r) => (pause === 0 ? setImmediate(r) : setTimeout(r, pause)));
    }
    writeFileSync(file, '0', WRITE_EXISTING);
  } catch {
    /* cannot be written: the caller asks runc */
  }
  return false;
}

/** thaw2 writes 0 to dir's cgroup.freeze (`runc resume` on v2); false when it cannot or it does not read 0 after. */
export function thaw2(dir: string): boolean {
  try {
    writeFileSync(path.join(dir, 'cgroup.freeze'), '0', WRITE_EXISTING);
    return readFreeze2(dir) === '0';
  } catch {
    return false;
  }
}

/**
 * kill2 sends SIGKILL to every process of the VM's cgroup dir and below it (`runc kill --all`
 * on v2): one write of 1 to cgroup.kill, which the kernel applies to the whole subtree, frozen
 * tasks included, with no pid list and so no pid reuse race. Without cgroup.kill (Linux < 5.14)
 * each pid of the subtree's cgroup.procs is pinned and signalled only if its `0::` cgroup is
 * still cgroupPath (`/sandnode/<vmId>`) or below it. Returns true when done; false when nothing
 * could be done (the caller asks runc).
 */
export function kill2(dir: string, cgroupPath: string): boolean {
  try {
    writeFileSync(path.join(dir, 'cgroup.kill'), '1', WRITE_EXISTING);
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') return false;
  }
  let pids: number[];
  try {
    pids = subtreePids(dir);
  } catch {
    return false;
  }
  for (const pid of pids) {
    signalVerified(pid, 9, (p) => {
      const ticks = processStartTicks(p);
      const own = ticks === undefined ? undefined : processCgroup2(p, ticks);
      return own !== undefined && isAtOrBelow(own, cgroupPath);
    });
  }
  return true;
}

/** subtreePids lists the pids of dir's cgroup.procs and of every cgroup below it (to {@link WALK_MAX_DEPTH}); throws when a file cannot be read. */
export function subtreePids(dir: string): number[] {
  const out: number[] = [];
  const walk = (d: string, depth: number) => {
    for (const l of readFileSync(path.join(d, 'cgroup.procs'), 'utf8').split('\n')) if (/^\d+$/.test(l)) out.push(Number(l));
    if (depth >= WALK_MAX_DEPTH) return;
    for (const e of readdirSync(d, { withFileTypes: true })) if (e.isDirectory()) walk(path.join(d, e.name), depth + 1);
  };
  walk(dir, 0);
  return out;
}

/** Cgroup2Stats: what a VM's v2 cgroup says it used; a field is undefined where the tree has no such file (the controller is not enabled: on a hybrid host memory and pids are v1). */
export interface Cgroup2Stats {
  /** cpu.stat usage_usec: CPU time of the cgroup's processes, µs (core file: always there) */
  cpuUsageUsec?: number;
  /** cpu.stat user_usec, µs */
  cpuUserUsec?: number;
  /** cpu.stat system_usec, µs */
  cpuSystemUsec?: number;
  /** cpu.stat nr_throttled: CFS periods in which the quota ran out (cpu controller only) */
  cpuNrThrottled?: number;
  /** cpu.stat throttled_usec: time throttled by the quota, µs (cpu controller only) */
  cpuThrottledUsec?: number;
  /** memory.current: bytes charged now (memory controller) */
  memoryCurrentBytes?: number;
  /** memory.swap.current: bytes of swap used now (memory controller with swap accounting) */
  memorySwapCurrentBytes?: number;
  /** pids.current: processes and threads now (pids controller) */
  pidsCurrent?: number;
}

/** cgroup2Stats reads dir's cpu.stat, memory.current, memory.swap.current and pids.current (each optional). */
export function cgroup2Stats(dir: string): Cgroup2Stats {
  const out: Cgroup2Stats = {};
  const cpu = readText(dir, 'cpu.stat');
  if (cpu !== undefined) {
    const kv = flatKeyed(cpu);
    const set = (k: string, f: keyof Cgroup2Stats) => {
      const v = uint(kv.get(k));
      if (v !== undefined) out[f] = v;
    };
    set('usage_usec', 'cpuUsageUsec');
    set('user_usec', 'cpuUserUsec');
    set('system_usec', 'cpuSystemUsec');
    set('nr_throttled', 'cpuNrThrottled');
    set('throttled_usec', 'cpuThrottledUsec');
  }
  const single: [string, keyof Cgroup2Stats][] = [
    ['memory.current', 'memoryCurrentBytes'],
    ['memory.swap.current', 'memorySwapCurrentBytes'],
    ['pids.current', 'pidsCurrent'],
  ];
  for (const [file, f] of single) {
    const v = uint(readText(dir, file)?.trim());
    if (v !== undefined) out[f] = v;
  }
  return out;
}

/** A limit value of a v2 file: a number, or 'max' (none). */
export type Limit = number | 'max';

/** IoMax: one line of io.max, per device; 'max' = no limit in that direction. */
export interface IoMax {
  major: number;
  minor: number;
  rbps: Limit;
  wbps: Limit;
  riops: Limit;
  wiops: Limit;
}

/** Cgroup2Limits: the limits runc wrote from the spec into a VM's v2 cgroup; a field is undefined where the tree has no such file or it does not parse. */
export interface Cgroup2Limits {
  /** memory.max, bytes (spec linux.resources.memory.limit) */
  memoryMaxBytes?: Limit;
  /** memory.swap.max, bytes of swap on top of memory.max (spec memory.swap minus memory.limit; 0 = no swap) */
  memorySwapMaxBytes?: Limit;
  /** pids.max (spec pids.limit) */
  pidsMax?: Limit;
  /** cpu.max: quota and period, µs (spec cpu.quota / cpu.period) */
  cpuMax?: { quotaUs: Limit; periodUs: number };
  /** io.max lines (spec blockIO.throttle*Device) */
  ioMax?: IoMax[];
}

/** cgroup2Limits reads dir's memory.max, memory.swap.max, pids.max, cpu.max and io.max. */
export function cgroup2Limits(dir: string): Cgroup2Limits {
  const out: Cgroup2Limits = {};
  const lim = (file: string) => limit(readText(dir, file)?.trim());
  const mem = lim('memory.max');
  if (mem !== undefined) out.memoryMaxBytes = mem;
  const swap = lim('memory.swap.max');
  if (swap !== undefined) out.memorySwapMaxBytes = swap;
  const pids = lim('pids.max');
  if (pids !== undefined) out.pidsMax = pids;
  const cpu = readText(dir, 'cpu.max')?.trim().split(' ');
  if (cpu?.length === 2) {
    const quotaUs = limit(cpu[0]);
    const periodUs = uint(cpu[1]);
    if (quotaUs !== undefined && periodUs !== undefined) out.cpuMax = { quotaUs, periodUs };
  }
  const io = readText(dir, 'io.max');
  if (io !== undefined) {
    const lines = io.split('\n').filter(Boolean).map(parseIoMax);
    if (lines.every((l) => l !== undefined)) out.ioMax = lines as IoMax[];
  }
  return out;
}

/** parseIoMax parses one io.max line (`8:16 rbps=2097152 wbps=max riops=max wiops=120`); undefined when it is not of that form. */
export function parseIoMax(line: string): IoMax | undefined {
  const [dev, ...rest] = line.trim().split(/\s+/);
  const m = /^(\d+):(\d+)$/.exec(dev ?? '');
  if (!m) return undefined;
  const out: IoMax = { major: Number(m[1]), minor: Number(m[2]), rbps: 'max', wbps: 'max', riops: 'max', wiops: 'max' };
  for (const kv of rest) {
    const [k, v] = kv.split('=', 2);
    const n = limit(v);
    if ((k !== 'rbps' && k !== 'wbps' && k !== 'riops' && k !== 'wiops') || n === undefined) return undefined;
    out[k] = n;
  }
  return out;
}

function readText(dir: string, file: string): string | undefined {
  try {
    return readFileSync(path.join(dir, file), 'utf8');
  } catch {
    return undefined;
  }
}

/** flatKeyed parses a flat-keyed cgroup file (`key value` per line). */
function flatKeyed(text: string): Map<string, string> {
  const m = new Map<string, string>();
  for (const line of text.split('\n')) {
    const [k, v, extra] = line.split(' ');
    if (k && v !== undefined && extra === undefined) m.set(k, v);
  }
  return m;
}

/** uint parses a decimal that is a safe integer; undefined otherwise. */
function uint(s: string | undefined): number | undefined {
  if (s === undefined || !/^\d{1,16}$/.test(s)) return undefined;
  const n = Number(s);
  return Number.isSafeInteger(n) ? n : undefined;
}

/** limit parses `max` or a {@link uint}. */
function limit(s: string | undefined): Limit | undefined {
  return s === 'max' ? 'max' : uint(s);
}
