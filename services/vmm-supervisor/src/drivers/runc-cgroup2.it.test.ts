/**
 * runc-cgroup2.ts on a real cgroup2 tree (integration: root and a cgroup2 mount, which this
 * hybrid host has at /sys/fs/cgroup/unified): a cgroup `<v2Root>/sandnode/<id>` made here, a
 * real shell (a CPU loop) and its child `sleep` in it, and runc's state.json written as runc
 * writes it. The cgroup is found only for the init the state names and only when that init is
 * in it; freeze stops the loop (its CPU time stands still), thaw lets it run, an ancestor's
 * freeze is not "paused", and kill ends every process of the subtree, frozen ones included,
 * and none outside it. Every cgroup and process made here is removed.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { isSameProcess, processLiveness, processStartTicks } from '@sandnode/shared';
import { describeWith, makeTempDir, PARTS } from '@sandnode/testkit';
import { detectCgroupHierarchy } from './cgroup-hierarchy';
import { deleteStopped } from './runc-cgroup';
import { cgroup2Stats, freeze2, kill2, liveStatus2, readEvents, subtreePids, thaw2, vmCgroup2Dir } from './runc-cgroup2';

/** utime is pid's user CPU time in clock ticks (/proc/<pid>/stat field 14). */
function utime(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[11]);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A process started here: its pid, start ticks and exit. */
interface Proc {
  child: ChildProcess;
  pid: number;
  ticks: number;
  exited: Promise<NodeJS.Signals | null>;
}

async function start(cmd: string, args: string[], stdin: 'pipe' | 'ignore' = 'ignore'): Promise<Proc> {
  const child = spawn(cmd, args, { stdio: [stdin, 'ignore', 'ignore'] });
  await new Promise((r) => child.once('spawn', r));
  const exited = new Promise<NodeJS.Signals | null>((r) => child.once('exit', (_c, sig) => r(sig)));
  return { child, pid: child.pid!, ticks: processStartTicks(child.pid!)!, exited };
}

describeWith('runc VM cgroup v2: find, freeze, thaw, kill on a real cgroup2 tree (integration)', [PARTS.root, PARTS.cgroup2], () => {
  const v2Root = detectCgroupHierarchy().v2Root!;
  const parent = path.join(v2Root, 'sandnode');
  const vmId = `cgv2-it-${process.pid}-${Date.now().toString(36)}`;
  const dir = path.join(parent, vmId);
  const sub = path.join(dir, 'inner');
  let createdParent = false;
  let runcRoot = '';
  const procs: Proc[] = [];
  let init: Proc;
  let outside: Proc;

  /** writeState writes `<runcRoot>/<vmId>/state.json` as runc does (the fields read here). */
  const writeState = (fields: Record<string, unknown>) => {
    mkdirSync(path.join(runcRoot, vmId), { recursive: true });
    writeFileSync(path.join(runcRoot, vmId, 'state.json'), JSON.stringify({ id: vmId, init_process_pid: init.pid, init_process_start: init.ticks, cgroup_paths: { '': dir }, ...fields }));
  };

  beforeAll(async () => {
    runcRoot = makeTempDir('cgv2-runc');
    if (!existsSync(parent)) {
      mkdirSync(parent);
      createdParent = true;
    }
    mkdirSync(dir);
    mkdirSync(sub);
    // the "init": a shell that, once in the cgroup, forks a sleep (born in the cgroup) and loops on the CPU
    init = await start('sh', ['-c', 'read _; sleep 1000 & while :; do :; done'], 'pipe');
    procs.push(init);
    writeFileSync(path.join(sub, 'cgroup.procs'), String(init.pid));
    init.child.stdin!.end('\n');
    outside = await start('sleep', ['1000']);
    procs.push(outside);
    for (let i = 0; i < 200 && subtreePids(dir).length < 2; i++) await sleep(10);
    writeState({});
  });

  afterAll(async () => {
    for (const p of procs) p.child.kill('SIGKILL');
    if (existsSync(dir)) {
      writeFileSync(path.join(dir, 'cgroup.freeze'), '0');
      try {
        writeFileSync(path.join(dir, 'cgroup.kill'), '1');
      } catch {
        /* no cgroup.kill */
      }
    }
    for (let i = 0; i < 100 && existsSync(dir); i++) {
      try {
        if (existsSync(sub)) rmdirSync(sub);
        rmdirSync(dir);
      } catch {
        await sleep(20); // the last tasks are exiting
      }
    }
    if (createdParent) {
      try {
        rmdirSync(parent);
      } catch {
        /* someone else's VM cgroup is there now */
      }
    }
    expect(existsSync(dir)).toBe(false);
  });

  it('finds the VM cgroup from runc state only for the recorded init, in the cgroup (or below it)', () => {
    const me = { pid: init.pid, startTimeTicks: init.ticks };
    expect(vmCgroup2Dir(runcRoot, vmId, me, v2Root)).toBe(dir);
    // another start time (a reused pid), another init than runc recorded, an init outside the cgroup
    expect(vmCgroup2Dir(runcRoot, vmId, { ...me, startTimeTicks: init.ticks + 1 }, v2Root)).toBeUndefined();
    expect(vmCgroup2Dir(runcRoot, vmId, { pid: outside.pid, startTimeTicks: outside.ticks }, v2Root)).toBeUndefined();
    writeState({ init_process_pid: outside.pid, init_process_start: outside.ticks });
    expect(vmCgroup2Dir(runcRoot, vmId, { pid: outside.pid, startTimeTicks: outside.ticks }, v2Root)).toBeUndefined();
    // a state that names another dir: another VM's, a '..' walk, the parent
    for (const p of [path.join(parent, 'other-vm'), `${dir}/../${vmId}`, parent, sub]) {
      writeState({ cgroup_paths: { '': p } });
      expect(vmCgroup2Dir(runcRoot, vmId, me, v2Root)).toBeUndefined();
    }
    writeState({});
    expect(vmCgroup2Dir(runcRoot, vmId, me, v2Root)).toBe(dir);
  });

  it('freezes (the CPU loop stands still, status paused), thaws (it runs again), and an ancestor freeze is not paused', async () => {
    const me = { pid: init.pid, startTimeTicks: init.ticks };
    expect(liveStatus2(dir, me)).toBe('running');
    expect(await freeze2(dir)).toBe(true);
    expect(readEvents(dir)).toEqual({ populated: true, frozen: true });
    expect(liveStatus2(dir, me)).toBe('paused');
    // the child cgroup is frozen through its ancestor only: runc would not call it paused
    expect(liveStatus2(sub, me)).toBeUndefined();
    const t0 = utime(init.pid);
    await sleep(300);
    expect(utime(init.pid)).toBe(t0);
    expect(thaw2(dir)).toBe(true);
    expect(liveStatus2(dir, me)).toBe('running');
    const t1 = utime(init.pid);
    for (let i = 0; i < 100 && utime(init.pid) === t1; i++) await sleep(20);
    expect(utime(init.pid)).toBeGreaterThan(t1);
    const st = cgroup2Stats(dir);
    expect(st.cpuUsageUsec).toBeGreaterThan(0);
    // memory and pids are v1 on a hybrid host: read only where the tree has them
    expect(st.memoryCurrentBytes !== undefined).toBe(existsSync(path.join(dir, 'memory.current')));
    expect(st.pidsCurrent !== undefined).toBe(existsSync(path.join(dir, 'pids.current')));
  });

  it('kills every process of the frozen subtree (the init and the sleep it forked), none outside it', async () => {
    const inside = subtreePids(dir).map((pid) => ({ pid, ticks: processStartTicks(pid)! }));
    expect(inside.map((p) => p.pid)).toContain(init.pid);
    expect(inside.length).toBe(2);
    const allGone = () => inside.every((p) => processLiveness(p.pid, p.ticks) === 'gone'); // a zombie counts as gone
    expect(await freeze2(dir)).toBe(true);
    expect(kill2(dir, `/sandnode/${vmId}`)).toBe(true);
    expect(await init.exited).toBe('SIGKILL');
    for (let i = 0; i < 100 && readEvents(dir)?.populated; i++) await sleep(10);
    expect(readEvents(dir)?.populated).toBe(false);
    for (let i = 0; i < 100 && !allGone(); i++) await sleep(10);
    expect(allGone()).toBe(true);
    expect(isSameProcess(outside.pid, outside.ticks)).toBe(true);
    expect(liveStatus2(dir, { pid: init.pid, startTimeTicks: init.ticks })).toBe('stopped');
    expect(thaw2(dir)).toBe(true);
  });

  it('deleteStopped removes the stopped VM\'s v2 dir named as on a unified host (`<v2Root>/sandnode/<id>`, key "") and runc\'s state', async () => {
    const gone = `${vmId}-del`;
    const d = path.join(parent, gone);
    mkdirSync(d);
    mkdirSync(path.join(d, 'inner'));
    mkdirSync(path.join(runcRoot, gone));
    writeFileSync(path.join(runcRoot, gone, 'state.json'), JSON.stringify({ id: gone, cgroup_paths: { '': d } }));
    try {
      expect(await deleteStopped(runcRoot, gone, v2Root)).toBe(true);
      expect([existsSync(d), existsSync(path.join(runcRoot, gone))]).toEqual([false, false]);
    } finally {
      if (existsSync(path.join(d, 'inner'))) rmdirSync(path.join(d, 'inner'));
      if (existsSync(d)) rmdirSync(d);
    }
  });
});
