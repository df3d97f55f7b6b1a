import { FailedPreconditionError, InvalidArgumentError, UnavailableError } from '@sandnode/shared';
import { FAILPOINTS, FAILPOINTS_ENV } from './failpoints';
import { clampFreezeMs, Quiescer, type FreezePort, type PortStatus } from './quiesce';
import { poddFeatures } from '../features';

const idle: PortStatus = { frozen: false, token: '', maxFreezeMs: 0, remainingMs: 0, endedBy: undefined, frozenMs: 0 };

function fakePort(status: PortStatus = idle) {
  const calls: string[] = [];
  const port: FreezePort = {
    async freeze(ms) {
      calls.push(`freeze ${ms}`);
      return { token: 't1', maxFreezeMs: ms, deadlineUnixMs: 1000 + ms, filesystems: ['/', '/workspace'], freezeMs: 3 };
    },
    async thaw(token) {
      calls.push(`thaw ${token}`);
      return { endedBy: 'caller', frozenMs: 42 };
    },
    async status() {
      calls.push('status');
      return status;
    },
  };
  return { port, calls };
}

describe('clampFreezeMs', () => {
  it.each([
    [0, 1500],
    [1, 100],
    [99, 100],
    [100, 100],
    [1500, 1500],
    [5000, 5000],
    [5001, 5000],
    [4294967295, 5000],
    [NaN, 1500],
  ])('%p -> %p', (req, want) => expect(clampFreezeMs(req)).toBe(want));
});

describe('Quiescer', () => {
  it('syncs before it freezes, with the clamped window, and reports the sync time', async () => {
    const { port, calls } = fakePort();
    const q = new Quiescer({ port, sync: async () => void calls.push('sync'), env: {} });
    const r = await q.quiesce(9000);
    expect(calls).toEqual(['status', 'sync', 'freeze 5000']);
    expect(r).toMatchObject({ token: 't1', maxFreezeMs: 5000, filesystems: ['/', '/workspace'], freezeMs: 3 });
    expect(r.syncMs).toBeGreaterThanOrEqual(0);
  });

  it('refuses with FAILED_PRECONDITION while a freeze holds, before syncing (a sync would block)', async () => {
    const { port, calls } = fakePort({ ...idle, frozen: true, token: 'x', remainingMs: 700 });
    const q = new Quiescer({ port, sync: async () => void calls.push('sync'), env: {} });
    await expect(q.quiesce(0)).rejects.toBeInstanceOf(FailedPreconditionError);
    expect(calls).toEqual(['status']);
  });

  it('freezes nothing when the caller went away during the sync', async () => {
    const { port, calls } = fakePort();
    const ac = new AbortController();
    const q = new Quiescer({ port, sync: async () => ac.abort(), env: {} });
    await expect(q.quiesce(0, ac.signal)).rejects.toThrow();
    expect(calls).toEqual(['status']);
  });

  it('passes UNAVAILABLE of an unreachable port through, nothing frozen', async () => {
    const { port, calls } = fakePort();
    port.status = async () => {
      throw new UnavailableError('freeze port gone');
    };
    const q = new Quiescer({ port, sync: async () => void calls.push('sync'), env: {} });
    await expect(q.quiesce(0)).rejects.toBeInstanceOf(UnavailableError);
    expect(calls).toEqual([]);
  });

  it('rejects an empty Thaw token with INVALID_ARGUMENT without calling the port', async () => {
    const { port, calls } = fakePort();
    const q = new Quiescer({ port, env: {} });
    await expect(q.thaw('')).rejects.toBeInstanceOf(InvalidArgumentError);
    expect(calls).toEqual([]);
    await expect(q.thaw('t1')).resolves.toEqual({ endedBy: 'caller', frozenMs: 42 });
  });

  it('hangs after the freeze when the failpoint is set', async () => {
    const { port, calls } = fakePort();
    const q = new Quiescer({ port, sync: async () => undefined, env: { [FAILPOINTS_ENV]: FAILPOINTS.quiesceHangAfterFreeze } });
    const outcome = await Promise.race([q.quiesce(100).then(() => 'answered'), new Promise((r) => setTimeout(() => r('stuck'), 300))]);
    expect(outcome).toBe('stuck');
    expect(calls).toEqual(['status', 'freeze 100']);
  });
});

describe('poddFeatures', () => {
  it('lists podd.quiesce only with a freeze port', () => {
    expect(poddFeatures(true)).toContain('podd.quiesce');
    expect(poddFeatures(false)).not.toContain('podd.quiesce');
  });
});
