import { spawn } from 'node:child_process';
import os from 'node:os';
import { isSameProcess, niceWhileBooting, processStartTicks, restoreNormalPriority, run, CommandError, STANDBY_BOOT_NICE } from './proc';

describe('process identity', () => {
  it('reads the start ticks of this process and rejects others', () => {
    const t = processStartTicks(process.pid);
    expect(t).toBeGreaterThan(0);
    expect(isSameProcess(process.pid, t!)).toBe(true);
    expect(isSameProcess(process.pid, t! + 1)).toBe(false);
    expect(processStartTicks(0)).toBeUndefined();
    expect(processStartTicks(2 ** 22 + 1)).toBeUndefined();
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
