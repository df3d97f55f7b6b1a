/**
 * watchdogRunning: a watchdog counts as gone only when /proc says so (no such process, a
 * zombie, a reused pid), never when /proc/<pid>/stat cannot be read for another reason
 * (EMFILE: the supervisor out of descriptors), which would thaw a freeze early.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import { processStartTicks } from '@sandnode/shared';
import { watchdogRunning } from './freeze-watchdog';

describe('watchdogRunning', () => {
  test('alive, gone after exit, another start time is gone', async () => {
    const child = spawn('sleep', ['30'], { stdio: 'ignore' });
    await new Promise((r) => child.once('spawn', r));
    const pid = child.pid!;
    const ticks = processStartTicks(pid)!;
    expect(watchdogRunning(pid, ticks)).toBe(true);
    expect(watchdogRunning(pid, ticks + 1)).toBe(false);
    child.kill('SIGKILL');
    await new Promise((r) => child.once('exit', r));
    expect(watchdogRunning(pid, ticks)).toBe(false);
  });

  test('a /proc read that fails with EMFILE counts as running, not gone', () => {
    const ticks = processStartTicks(process.pid)!;
    const real = fs.readFileSync;
    const spy = jest.spyOn(fs, 'readFileSync').mockImplementation(((f: fs.PathOrFileDescriptor, o?: unknown) => {
      if (f === `/proc/${process.pid}/stat`) throw Object.assign(new Error('EMFILE: too many open files'), { code: 'EMFILE' });
      return (real as (f: fs.PathOrFileDescriptor, o?: unknown) => string | Buffer)(f, o);
    }) as typeof fs.readFileSync);
    try {
      expect(watchdogRunning(process.pid, ticks)).toBe(true);
    } finally {
      spy.mockRestore();
    }
  });
});
