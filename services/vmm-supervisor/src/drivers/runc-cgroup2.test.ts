/**
 * runc-cgroup2.ts and cgroup-hierarchy.ts on a fake cgroup tree (regular files in a temp dir):
 * the hierarchy told from statfs types as runc tells it, the controller files a hybrid host
 * lacks in its v2 tree (memory.max, memory.swap.max, pids.max, cpu.max, io.max,
 * memory.current, pids.current) parsed strictly, a freeze that never completes given up in
 * time and undone, and a kill without cgroup.kill that signals no process of a forged list.
 * The real cgroup2 tree: runc-cgroup2.it.test.ts.
 */
import { spawn } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { isSameProcess, processStartTicks } from '@sandnode/shared';
import { useTempDir } from '@sandnode/testkit';
import { CGROUP2_SUPER_MAGIC, cgroup2Offers, detectCgroupHierarchy } from './cgroup-hierarchy';
import { cgroup2Limits, cgroup2Stats, freeze2, kill2, liveStatus2, parseIoMax, processCgroup2, readEvents, vmCgroup2Dir } from './runc-cgroup2';

const tmp = useTempDir('runc-cgroup2');
const TMPFS_MAGIC = 0x01021994;

/** cg writes a fake cgroup dir under root with files (name -> content). */
function cg(root: string, rel: string, files: Record<string, string>): string {
  const dir = path.join(root, rel);
  mkdirSync(dir, { recursive: true });
  for (const [f, v] of Object.entries(files)) writeFileSync(path.join(dir, f), v);
  return dir;
}

describe('detectCgroupHierarchy (statfs of /sys/fs/cgroup, as runc)', () => {
  const types = (m: Record<string, number>) => (p: string) => m[p];
  it('tells unified, hybrid and legacy apart and names the cgroup2 mount', () => {
    expect(detectCgroupHierarchy('/cg', types({ '/cg': CGROUP2_SUPER_MAGIC }))).toEqual({ mode: 'unified', v2Root: '/cg' });
    expect(detectCgroupHierarchy('/cg', types({ '/cg': TMPFS_MAGIC, '/cg/unified': CGROUP2_SUPER_MAGIC }))).toEqual({ mode: 'hybrid', v2Root: '/cg/unified' });
    expect(detectCgroupHierarchy('/cg', types({ '/cg': TMPFS_MAGIC }))).toEqual({ mode: 'legacy', v2Root: undefined });
    // a tmpfs dir named unified is no cgroup2 tree; no /sys/fs/cgroup at all is legacy
    expect(detectCgroupHierarchy('/cg', types({ '/cg': TMPFS_MAGIC, '/cg/unified': TMPFS_MAGIC })).mode).toBe('legacy');
    expect(detectCgroupHierarchy('/cg', types({})).mode).toBe('legacy');
  });

  it('this host: the real statfs gives a mode, and a v2 root exactly when not legacy', () => {
    const h = detectCgroupHierarchy();
    expect(['unified', 'hybrid', 'legacy']).toContain(h.mode);
    expect(h.v2Root === undefined).toBe(h.mode === 'legacy');
  });

  it('cgroup2Offers: a controller of the root that a child cgroup has a file of; else false', () => {
    const root = tmp();
    cg(root, '', { 'cgroup.controllers': 'cpuset cpu io memory pids\n' });
    expect(cgroup2Offers(root, 'io', ['io.weight', 'io.bfq.weight'])).toBe(false); // no child yet: cannot tell
    cg(root, 'system.slice', { 'io.bfq.weight': 'default 100\n', 'memory.max': 'max\n' });
    expect(cgroup2Offers(root, 'io', ['io.weight', 'io.bfq.weight'])).toBe(true);
    expect(cgroup2Offers(root, 'memory', ['memory.swap.max'])).toBe(false); // no swap accounting
    cg(root, '', { 'cgroup.controllers': 'hugetlb\n' }); // a hybrid host's v2 tree
    expect(cgroup2Offers(root, 'io', ['io.weight', 'io.bfq.weight'])).toBe(false);
  });
});

describe('readings of a v2 cgroup the hybrid host lacks (fake tree)', () => {
  it('stats: cpu.stat keys, memory.current, memory.swap.current, pids.current; a garbled or missing file is left out', () => {
    const dir = cg(tmp(), 'sandnode/vm-s', {
      'cpu.stat': 'usage_usec 123456\nuser_usec 100000\nsystem_usec 23456\nnr_periods 10\nnr_throttled 3\nthrottled_usec 7000\n',
      'memory.current': '52428800\n',
      'pids.current': '17\n',
      'memory.swap.current': '-1\n',
    });
    expect(cgroup2Stats(dir)).toEqual({
      cpuUsageUsec: 123456,
      cpuUserUsec: 100000,
      cpuSystemUsec: 23456,
      cpuNrThrottled: 3,
      cpuThrottledUsec: 7000,
      memoryCurrentBytes: 52428800,
      pidsCurrent: 17,
    });
    // the core cpu.stat only (no cpu controller): no throttle keys
    const core = cg(tmp(), 'sandnode/vm-c', { 'cpu.stat': 'usage_usec 5\nuser_usec 3\nsystem_usec 2\n' });
    expect(cgroup2Stats(core)).toEqual({ cpuUsageUsec: 5, cpuUserUsec: 3, cpuSystemUsec: 2 });
  });

  it('limits as runc writes them from the spec: memory.max, memory.swap.max 0, pids.max, cpu.max, io.max', () => {
    const dir = cg(tmp(), 'sandnode/vm-l', {
      'memory.max': '536870912\n',
      'memory.swap.max': '0\n',
      'pids.max': '1024\n',
      'cpu.max': '100000 100000\n',
      'io.max': '7:0 rbps=max wbps=4194304 riops=max wiops=max\n7:1 rbps=1048576 wbps=max riops=200 wiops=max\n',
    });
    expect(cgroup2Limits(dir)).toEqual({
      memoryMaxBytes: 536870912,
      memorySwapMaxBytes: 0,
      pidsMax: 1024,
      cpuMax: { quotaUs: 100000, periodUs: 100000 },
      ioMax: [
        { major: 7, minor: 0, rbps: 'max', wbps: 4194304, riops: 'max', wiops: 'max' },
        { major: 7, minor: 1, rbps: 1048576, wbps: 'max', riops: 200, wiops: 'max' },
      ],
    });
    const open = cg(tmp(), 'sandnode/vm-o', { 'memory.max': 'max\n', 'pids.max': 'max\n', 'cpu.max': 'max 100000\n', 'io.max': '' });
    expect(cgroup2Limits(open)).toEqual({ memoryMaxBytes: 'max', pidsMax: 'max', cpuMax: { quotaUs: 'max', periodUs: 100000 }, ioMax: [] });
  });

  it('parses strictly: a garbled line is no limit read (undefined), never a guess', () => {
    expect(parseIoMax('7:0 rbps=12')).toEqual({ major: 7, minor: 0, rbps: 12, wbps: 'max', riops: 'max', wiops: 'max' });
    for (const l of ['7 rbps=1', '7:0 rbps=-1', '7:0 foo=1', '7:0 rbps=1e3', 'x:y']) expect(parseIoMax(l)).toBeUndefined();
    const dir = cg(tmp(), 'sandnode/vm-g', { 'memory.max': '12 MiB\n', 'pids.max': '99999999999999999999\n', 'cpu.max': '100000\n', 'io.max': '7:0 rbps=1\nnonsense\n' });
    expect(cgroup2Limits(dir)).toEqual({});
  });

  it('cgroup.events: populated and frozen both 0/1 or it cannot tell', () => {
    const root = tmp();
    expect(readEvents(cg(root, 'a', { 'cgroup.events': 'populated 1\nfrozen 0\n' }))).toEqual({ populated: true, frozen: false });
    expect(readEvents(cg(root, 'b', { 'cgroup.events': 'populated 1\n' }))).toBeUndefined();
    expect(readEvents(cg(root, 'c', { 'cgroup.events': 'populated 2\nfrozen 0\n' }))).toBeUndefined();
    expect(readEvents(path.join(root, 'none'))).toBeUndefined();
  });
});

describe('status, freeze and kill on a fake tree', () => {
  const me = { pid: process.pid, startTimeTicks: processStartTicks(process.pid)! };

  it('liveStatus2: running, paused, and cannot tell while freezing, thawing or frozen by an ancestor', () => {
    const root = tmp();
    const st = (freeze: string, frozen: string) => liveStatus2(cg(root, `vm-${freeze}${frozen}`, { 'cgroup.freeze': `${freeze}\n`, 'cgroup.events': `populated 1\nfrozen ${frozen}\n` }), me);
    expect(st('0', '0')).toBe('running');
    expect(st('1', '1')).toBe('paused');
    expect(st('1', '0')).toBeUndefined(); // freezing
    expect(st('0', '1')).toBeUndefined(); // an ancestor's freeze
    expect(liveStatus2(undefined, me)).toBeUndefined();
    expect(liveStatus2(path.join(root, 'vm-00'), { ...me, startTimeTicks: me.startTimeTicks + 1 })).toBe('stopped');
  });

  it('freeze2 gives up after its timeout when the cgroup never says frozen, and sets cgroup.freeze back to 0', async () => {
    const dir = cg(tmp(), 'vm-f', { 'cgroup.freeze': '0\n', 'cgroup.events': 'populated 1\nfrozen 0\n' });
    const freezeFile = () => readFileSync(path.join(dir, 'cgroup.freeze'), 'utf8').trim();
    const t0 = Date.now();
    const during = new Promise<string>((r) => setTimeout(() => r(freezeFile()), 50));
    expect(await freeze2(dir, 150)).toBe(false);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(150);
    expect(await during).toBe('1'); // it asked for the freeze, and kept the event loop free meanwhile
    expect(freezeFile()).toBe('0');
    // a dir with no cgroup.freeze is not written (never created): false at once
    const bare = cg(tmp(), 'vm-b', { 'cgroup.events': 'populated 1\nfrozen 0\n' });
    expect(await freeze2(bare, 5000)).toBe(false);
  });

  it('kill2 without cgroup.kill signals no process of a forged cgroup.procs (not in the VM cgroup)', async () => {
    const child = spawn('sleep', ['30'], { stdio: 'ignore' });
    await new Promise((r) => child.once('spawn', r));
    const ticks = processStartTicks(child.pid!)!;
    try {
      const dir = cg(tmp(), 'sandnode/vm-k', { 'cgroup.procs': `${child.pid}\n` });
      expect(kill2(dir, '/sandnode/vm-k')).toBe(true);
      expect(isSameProcess(child.pid!, ticks)).toBe(true);
      // a cgroup.procs that cannot be read: nothing done, the caller asks runc
      expect(kill2(path.join(tmp(), 'none'), '/sandnode/none')).toBe(false);
    } finally {
      child.kill('SIGKILL');
    }
  });

  it('vmCgroup2Dir refuses a fake tree (not a cgroup2 filesystem), a bad id, or an init whose 0:: line is not the VM cgroup', () => {
    const root = tmp();
    const runcRoot = path.join(root, 'runc');
    const dir = cg(root, 'cg/sandnode/vm-x', {});
    mkdirSync(path.join(runcRoot, 'vm-x'), { recursive: true });
    writeFileSync(path.join(runcRoot, 'vm-x', 'state.json'), JSON.stringify({ init_process_pid: me.pid, init_process_start: me.startTimeTicks, cgroup_paths: { '': dir } }));
    expect(vmCgroup2Dir(runcRoot, 'vm-x', me, path.join(root, 'cg'))).toBeUndefined();
    for (const id of ['..', '.', 'a/b', '']) expect(vmCgroup2Dir(runcRoot, id, me, path.join(root, 'cg'))).toBeUndefined();
    // this process's own 0:: line is a clean absolute path, read only for its own start ticks
    expect(processCgroup2(me.pid, me.startTimeTicks)).toMatch(/^\/[^.]*/);
    expect(processCgroup2(me.pid, me.startTimeTicks + 1)).toBeUndefined();
  });
});
