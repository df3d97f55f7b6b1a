import { CommandError, FailedPreconditionError, InternalError, InvalidArgumentError, UnavailableError, type Logger } from '@sandnode/shared';
import { FAILPOINTS, FAILPOINTS_ENV, poddFailpoints } from './failpoints';
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
    const q = new Quiescer({ port, sync: async () => void calls.push('sync') });
    const r = await q.quiesce(9000);
    expect(calls).toEqual(['status', 'sync', 'freeze 5000']);
    expect(r).toMatchObject({ token: 't1', maxFreezeMs: 5000, filesystems: ['/', '/workspace'], freezeMs: 3 });
    expect(r.syncMs).toBeGreaterThanOrEqual(0);
  });

  it('refuses with FAILED_PRECONDITION while a freeze holds, before syncing (a sync would block)', async () => {
    const { port, calls } = fakePort({ ...idle, frozen: true, token: 'x', remainingMs: 700 });
    const q = new Quiescer({ port, sync: async () => void calls.push('sync') });
    await expect(q.quiesce(0)).rejects.toBeInstanceOf(FailedPreconditionError);
    expect(calls).toEqual(['status']);
  });

  it('freezes nothing when the caller went away during the sync', async () => {
    const { port, calls } = fakePort();
    const ac = new AbortController();
    const q = new Quiescer({ port, sync: async () => ac.abort() });
    await expect(q.quiesce(0, ac.signal)).rejects.toThrow();
    expect(calls).toEqual(['status']);
  });

  it('passes UNAVAILABLE of an unreachable port through, nothing frozen', async () => {
    const { port, calls } = fakePort();
    port.status = async () => {
      throw new UnavailableError('freeze port gone');
    };
    const q = new Quiescer({ port, sync: async () => void calls.push('sync') });
    await expect(q.quiesce(0)).rejects.toBeInstanceOf(UnavailableError);
    expect(calls).toEqual([]);
  });

  it('rejects an empty Thaw token with INVALID_ARGUMENT without calling the port', async () => {
    const { port, calls } = fakePort();
    const q = new Quiescer({ port });
    await expect(q.thaw('')).rejects.toBeInstanceOf(InvalidArgumentError);
    expect(calls).toEqual([]);
    await expect(q.thaw('t1')).resolves.toEqual({ endedBy: 'caller', frozenMs: 42 });
  });

  it('a failed sync is a short INTERNAL without its stderr; the full error is logged; nothing frozen', async () => {
    const { port, calls } = fakePort();
    const logged: unknown[] = [];
    const log = { error: (obj: unknown) => logged.push(obj) } as unknown as Logger;
    const failure = new CommandError('sync -f / /workspace: exit 1: sync: /workspace: Input/output error', 'sync: /workspace: Input/output error', 1);
    const q = new Quiescer({ port, log, sync: async () => Promise.reject(failure) });
    const err = await q.quiesce(100).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(InternalError);
    expect((err as Error).message).toBe('sync of the sandbox filesystems failed (exit 1); nothing frozen (see the podd log)');
    expect(logged).toEqual([{ err: failure }]);
    expect(calls).toEqual(['status']);
  });

  it('a caller gone during the sync gets its abort, not INTERNAL', async () => {
    const { port } = fakePort();
    const ac = new AbortController();
    const q = new Quiescer({
      port,
      sync: async () => {
        ac.abort();
        throw new Error('killed');
      },
    });
    await expect(q.quiesce(100, ac.signal)).rejects.toMatchObject({ name: 'AbortError' });
  });

  it('hangs after the freeze when the failpoint is set (a bare name means hang)', async () => {
    const { port, calls } = fakePort();
    const failpoints = poddFailpoints();
    failpoints.set(FAILPOINTS.quiesceHangAfterFreeze);
    const q = new Quiescer({ port, sync: async () => undefined, failpoints });
    let settled = false;
    void q.quiesce(100).finally(() => (settled = true));
    // Every step of quiesce with these fakes is a microtask; two macrotask turns drain them all.
    for (let i = 0; i < 2; i++) await new Promise((r) => setImmediate(r));
    expect(calls).toEqual(['status', 'freeze 100']);
    expect(settled).toBe(false);
  });

  it('reads SANDNODE_PODD_FAILPOINTS and refuses unknown names and actions naming them', () => {
    expect(FAILPOINTS_ENV).toBe('SANDNODE_PODD_FAILPOINTS');
    const fp = poddFailpoints();
    fp.set(undefined);
    expect(fp.list()).toEqual([]);
    fp.set('quiesce.hang-after-freeze');
    expect(fp.list()).toEqual(['quiesce.hang-after-freeze=hang']);
    expect(() => fp.set('quiesce.nope')).toThrow(/SANDNODE_PODD_FAILPOINTS: unknown failpoint "quiesce.nope"/);
    expect(() => fp.set('quiesce.hang-after-freeze=pause')).toThrow(/pause is only for/);
  });
});

describe('poddFeatures', () => {
  it('lists podd.quiesce only with a freeze port', () => {
    const base = ['podd.exec.v1', 'podd.files.v1', 'podd.files.beneath.v1', 'podd.forward-port.v1', 'podd.exec-stream.v1', 'podd.files.stream.v1', 'podd.files.tree.v1'];
    expect(poddFeatures(true)).toEqual([...base, 'podd.quiesce']);
    expect(poddFeatures(false)).toEqual(base);
    expect(poddFeatures(false, true)).toEqual([...base, 'podd.exec-pty.v1']);
  });
});
