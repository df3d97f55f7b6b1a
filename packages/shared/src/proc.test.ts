import { spawn, spawnSync } from 'node:child_process';
import os from 'node:os';
import path from 'node:path';
import { isSameProcess, niceWhileBooting, processLiveness, processStartTicks, restoreNormalPriority, run, CommandError, STANDBY_BOOT_NICE } from './proc';

describe('process identity', () => {
  it('reads the start ticks of this process and rejects others', () => {
    const t = processStartTicks(process.pid);
    expect(t).toBeGreaterThan(0);
    expect(isSameProcess(process.pid, t!)).toBe(true);
    expect(isSameProcess(process.pid, t! + 1)).toBe(false);
    expect(processStartTicks(0)).toBeUndefined();
    expect(processStartTicks(2 ** 22 + 1)).toBeUndefined();
  });
  it('processLiveness: alive, gone (other ticks, no such pid)', () => {
    const t = processStartTicks(process.pid)!;
    expect(processLiveness(process.pid, t)).toBe('alive');
    expect(processLiveness(process.pid, t + 1)).toBe('gone');
    expect(processLiveness(0, t)).toBe('gone');
    expect(processLiveness(2 ** 22 + 1, t)).toBe('gone');
  });
  it('processLiveness says unknown, never gone, when the caller is out of file descriptors (attack: a server at its RLIMIT_NOFILE)', () => {
    // a child at RLIMIT_NOFILE 64 opens files until EMFILE, then asks about itself
    const dist = path.join(__dirname, '..', 'dist', 'proc.js');
    const js = `const p=require(${JSON.stringify(dist)});const fs=require('fs');const t=p.processStartTicks(process.pid);const fds=[];try{for(;;)fds.push(fs.openSync('/dev/null','r'))}catch(e){if(e.code!=='EMFILE')throw e}console.log(JSON.stringify({liveness:p.processLiveness(process.pid,t),same:p.isSameProcess(process.pid,t),fds:fds.length}))`;
    const r = spawnSync('prlimit', ['--nofile=64:64', process.execPath, '-e', js], { encoding: 'utf8', timeout: 20_000 });
    expect(r.stderr).toBe('');
    const got = JSON.parse(r.stdout) as { liveness: string; same: boolean; fds: number };
    expect(got.fds).toBeGreaterThan(0);
    expect(got.same).toBe(false); // what the reaper used before: a live process taken for gone
    expect(got.liveness).toBe('unknown');
  });
  it('runs commands and reports failures with stderr', async () => {
    expect((await run('sh', ['-c', 'echo hi'])).stdout).toBe('hi\n');
    await expect(run('sh', ['-c', 'echo bad >&2; exit 3'])).rejects.toThrow(CommandError);
    await expect(run('sh', ['-c', 'echo bad >&2; exit 3'])).rejects.toThrow(/exit 3: bad/);
  });
});

describe('a standby boots niced and takes its priority back', () => {
  it('niceWhileBooting lowers a process to STANDBY_BOOT_NICE', async () => {
    const child = spawn('sleep', ['30']);
    try {
      await new Promise((r) => child.once('spawn', r));
      expect(niceWhileBooting(child.pid!)).toBe(true);
      expect(os.getPriority(child.pid!)).toBe(STANDBY_BOOT_NICE);
    } finally {
      child.kill('SIGKILL');
    }
  });
  it('restoreNormalPriority brings this process back to 0 (root) and says what it was', () => {
    os.setPriority(STANDBY_BOOT_NICE);
    try {
      const was = restoreNormalPriority();
      // raising a priority needs root (CAP_SYS_NICE); without it the call says so (undefined)
      if (process.getuid?.() === 0) {
        expect(was).toBe(STANDBY_BOOT_NICE);
        expect(os.getPriority()).toBe(0);
      } else expect(was).toBeUndefined();
    } finally {
      if (process.getuid?.() === 0) os.setPriority(0);
    }
    expect(restoreNormalPriority()).toBe(os.getPriority());
  });
});
