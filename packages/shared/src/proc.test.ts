import { isSameProcess, processStartTicks, run, CommandError } from './proc';

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
