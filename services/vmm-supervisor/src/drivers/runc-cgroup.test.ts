/**
 * runc-cgroup.ts on a fake cgroup root (status from the freezer file and the init's start time;
 * a pid list or a state file that names what is not the VM's is never acted on) and on real
 * processes (signals only to a verified process).
 */
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { isSameProcess, processStartTicks } from '@sandnode/shared';
import { useTempDir } from '@sandnode/testkit';
import { deleteStopped, killFrozen, liveStatus, setCpuBurst, signalInit } from './runc-cgroup';

const tmp = useTempDir('runc-cgroup');

/** freezerOf writes a fake v1 freezer dir of vmId under root with state (and self_freezing). */
function freezerOf(root: string, vmId: string, state: string, self = '1', procs = ''): string {
  const dir = path.join(root, 'freezer', 'sandnode', vmId);
  mkdirSync(dir, { recursive: true });
  writeFileSync(path.join(dir, 'freezer.state'), `${state}\n`);
  writeFileSync(path.join(dir, 'freezer.self_freezing'), `${self}\n`);
  writeFileSync(path.join(dir, 'cgroup.procs'), procs);
  return dir;
}

/** sleeper starts `sleep 30` and resolves with it and its start ticks; the test kills it. */
async function sleeper() {
  const child = spawn('sleep', ['30'], { stdio: 'ignore' });
  await new Promise((r) => child.once('spawn', r));
  const exited = new Promise<NodeJS.Signals | null>((r) => child.once('exit', (_c, sig) => r(sig)));
  return { child, pid: child.pid!, ticks: processStartTicks(child.pid!)!, exited };
}

describe('liveStatus', () => {
  const me = { pid: process.pid, startTimeTicks: processStartTicks(process.pid)! };

  it('reads running / paused from the freezer of a VM whose init runs', () => {
    const root = tmp();
    freezerOf(root, 'vm-r', 'THAWED');
    freezerOf(root, 'vm-p', 'FROZEN');
    expect(liveStatus('vm-r', me, root)).toBe('running');
    expect(liveStatus('vm-p', me, root)).toBe('paused');
  });

  it('says stopped when the init is gone or another process has its pid (start time differs)', () => {
    const root = tmp();
    freezerOf(root, 'vm-r', 'THAWED');
    expect(liveStatus('vm-r', { pid: me.pid, startTimeTicks: me.startTimeTicks + 1 }, root)).toBe('stopped');
  });

  it('cannot tell (undefined: the driver asks runc) while FREEZING, when frozen by an ancestor, without a freezer dir, or without an init', () => {
    const root = tmp();
    freezerOf(root, 'vm-f', 'FREEZING');
    freezerOf(root, 'vm-a', 'FROZEN', '0');
    expect(liveStatus('vm-f', me, root)).toBeUndefined();
    expect(liveStatus('vm-a', me, root)).toBeUndefined();
    expect(liveStatus('vm-none', me, root)).toBeUndefined();
    expect(liveStatus('vm-f', { pid: 0, startTimeTicks: 0 }, root)).toBeUndefined();
  });
});

describe('signals', () => {
  it('signalInit signals the init only while it is the process that started at its ticks', async () => {
    const s = await sleeper();
    try {
      expect(signalInit({ pid: s.pid, startTimeTicks: s.ticks + 1 }, 15)).toBe('not-verified');
      expect(isSameProcess(s.pid, s.ticks)).toBe(true);
      expect(signalInit({ pid: s.pid, startTimeTicks: s.ticks }, 15)).toBe('signalled');
      expect(await s.exited).toBe('SIGTERM');
      expect(signalInit({ pid: s.pid, startTimeTicks: s.ticks }, 15)).toBe('gone');
    } finally {
      s.child.kill('SIGKILL');
    }
  });

  it('killFrozen signals no process of a frozen cgroup list that is not in the VM cgroup (a forged list)', async () => {
    const s = await sleeper();
    try {
      const root = tmp();
      freezerOf(root, 'vm-k', 'FROZEN', '1', `${s.pid}\n`);
      expect(killFrozen('vm-k', root)).toBe(0);
      expect(isSameProcess(s.pid, s.ticks)).toBe(true);
      // not FROZEN: nothing is signalled, the caller asks runc
      freezerOf(root, 'vm-t', 'THAWED', '0', `${s.pid}\n`);
      expect(killFrozen('vm-t', root)).toBeUndefined();
      expect(isSameProcess(s.pid, s.ticks)).toBe(true);
    } finally {
      s.child.kill('SIGKILL');
    }
  });
});

describe('deleteStopped', () => {
  /** stateOf writes `<runcRoot>/<vmId>/state.json` with cgroup_paths. */
  const stateOf = (runcRoot: string, vmId: string, paths: Record<string, string>) => {
    mkdirSync(path.join(runcRoot, vmId), { recursive: true });
    writeFileSync(path.join(runcRoot, vmId, 'state.json'), JSON.stringify({ id: vmId, cgroup_paths: paths }));
  };

  it('removes nothing when a cgroup path of the state file is not the VM cgroup: another VM, a dir outside, a ".." walk', async () => {
    const dir = tmp();
    const root = path.join(dir, 'cg');
    const runcRoot = path.join(dir, 'runc');
    const other = freezerOf(root, 'vm-other', 'THAWED');
    const outside = path.join(dir, 'precious');
    mkdirSync(outside);
    for (const p of [other, outside, `${root}/freezer/sandnode/vm-x/../vm-other`, path.join(root, 'freezer', 'sandnode')]) {
      stateOf(runcRoot, 'vm-x', { freezer: p });
      expect(await deleteStopped(runcRoot, 'vm-x', root)).toBe(false);
      expect(existsSync(path.join(runcRoot, 'vm-x', 'state.json'))).toBe(true);
    }
    expect([existsSync(other), existsSync(outside)]).toEqual([true, true]);
  });

  it('takes `<root>/sandnode/<id>` (a unified host\'s v2 dir) only under the key "" runc names it with (removal on a real tree: runc-cgroup2.it)', async () => {
    const dir = tmp();
    const root = path.join(dir, 'cg');
    const runcRoot = path.join(dir, 'runc');
    const v2 = path.join(root, 'sandnode', 'vm-u');
    mkdirSync(v2, { recursive: true });
    writeFileSync(path.join(v2, 'cgroup.procs'), '');
    for (const key of ['memory', 'freezer', 'unified']) {
      stateOf(runcRoot, 'vm-u', { [key]: v2 });
      expect(await deleteStopped(runcRoot, 'vm-u', root)).toBe(false);
      expect([existsSync(v2), existsSync(path.join(runcRoot, 'vm-u', 'state.json'))]).toEqual([true, true]);
    }
  });

  it('removes nothing when the state file is unreadable, names no path, or a cgroup still has a process', async () => {
    const dir = tmp();
    const root = path.join(dir, 'cg');
    const runcRoot = path.join(dir, 'runc');
    mkdirSync(path.join(runcRoot, 'vm-y'), { recursive: true });
    writeFileSync(path.join(runcRoot, 'vm-y', 'state.json'), '{not json');
    expect(await deleteStopped(runcRoot, 'vm-y', root)).toBe(false);
    stateOf(runcRoot, 'vm-y', {});
    expect(await deleteStopped(runcRoot, 'vm-y', root)).toBe(false);
    const busy = freezerOf(root, 'vm-y', 'THAWED', '0', '12345\n');
    stateOf(runcRoot, 'vm-y', { freezer: busy });
    expect(await deleteStopped(runcRoot, 'vm-y', root)).toBe(false);
    expect([existsSync(busy), existsSync(path.join(runcRoot, 'vm-y'))]).toEqual([true, true]);
  });
});

describe('setCpuBurst', () => {
  it('writes cpu.cfs_burst_us (v1) or cpu.max.burst (v2) of the VM cgroup; false, creating nothing, where the file is not there', () => {
    const root = tmp();
    const v1 = path.join(root, 'cpu', 'sandnode', 'vm-b');
    mkdirSync(v1, { recursive: true });
    writeFileSync(path.join(v1, 'cpu.cfs_burst_us'), '0\n');
    expect(setCpuBurst('vm-b', 150_000.7, root)).toBe(true);
    expect(readFileSync(path.join(v1, 'cpu.cfs_burst_us'), 'utf8')).toBe('150000\n');
    const v2Root = path.join(root, 'unified');
    const v2 = path.join(v2Root, 'sandnode', 'vm-b');
    mkdirSync(v2, { recursive: true });
    writeFileSync(path.join(v2, 'cpu.max.burst'), '0\n');
    expect(setCpuBurst('vm-b', 100_000, root, v2Root)).toBe(true);
    expect(readFileSync(path.join(v2, 'cpu.max.burst'), 'utf8')).toBe('100000\n');
    // an older kernel (no burst file), or no such cgroup: nothing made
    expect(setCpuBurst('vm-c', 100_000, root)).toBe(false);
    expect(existsSync(path.join(root, 'cpu', 'sandnode', 'vm-c'))).toBe(false);
    mkdirSync(path.join(root, 'cpu', 'sandnode', 'vm-d'), { recursive: true });
    expect(setCpuBurst('vm-d', 100_000, root)).toBe(false);
    expect(existsSync(path.join(root, 'cpu', 'sandnode', 'vm-d', 'cpu.cfs_burst_us'))).toBe(false);
  });
});
