/**
 * The SQLite lock helpers on scripted steps: busy errors become StoreBusyError (UNAVAILABLE with
 * a retry delay), waitWhileBusy retries with setTimeout until the step succeeds, the wait bound
 * or the deadline passes, or the signal aborts; other errors pass at once; the gate runs a
 * listed method only once the store can be written, and leaves the others alone.
 */
import { Status } from 'nice-grpc-common';
import { DEADLINE_METADATA_KEY } from './grpc-host';
import { busyToUnavailable, gateWritesWhileBusy, isSqliteBusy, retryAfterMsOf, StoreBusyError, waitWhileBusy } from './sqlite-busy';

const busy = () => Object.assign(new Error('database is locked'), { code: 'SQLITE_BUSY' });
const ctx = (deadlineMs?: number, signal = new AbortController().signal) => ({
  signal,
  metadata: { get: (k: string) => (k === DEADLINE_METADATA_KEY && deadlineMs !== undefined ? String(deadlineMs) : undefined) },
});

describe('sqlite busy helpers', () => {
  it('busyToUnavailable maps SQLITE_BUSY* and SQLITE_LOCKED* to StoreBusyError (UNAVAILABLE, retry delay) and passes other errors', () => {
    for (const code of ['SQLITE_BUSY', 'SQLITE_BUSY_SNAPSHOT', 'SQLITE_LOCKED']) {
      let err: unknown;
      try {
        busyToUnavailable('t.db: write', () => {
          throw Object.assign(new Error('x'), { code });
        });
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(StoreBusyError);
      expect((err as StoreBusyError).code).toBe(Status.UNAVAILABLE);
      expect(retryAfterMsOf(err)).toBeGreaterThan(0);
      expect((err as Error).message).toMatch(/^t\.db: write: the database is locked by another process; nothing was changed; retry after \d+ ms$/);
    }
    const other = Object.assign(new Error('constraint'), { code: 'SQLITE_CONSTRAINT' });
    expect(() =>
      busyToUnavailable('t', () => {
        throw other;
      }),
    ).toThrow(other);
    expect(isSqliteBusy(new Error('plain'))).toBe(false);
    expect(retryAfterMsOf(new Error('plain'))).toBeUndefined();
  });

  it('waitWhileBusy retries until the step succeeds', async () => {
    const at: number[] = [];
    const r = await waitWhileBusy(
      () => {
        at.push(Date.now());
        if (at.length < 5) throw busy();
        return 'done';
      },
      { what: 't', maxWaitMs: 5000 },
    );
    expect(r).toBe('done');
    expect(at).toHaveLength(5);
  });

  it('waitWhileBusy gives StoreBusyError at the wait bound or before the deadline, the abort reason on abort, other errors at once', async () => {
    let n = 0;
    const alwaysBusy = () => {
      n++;
      throw busy();
    };
    await expect(waitWhileBusy(alwaysBusy, { what: 't', maxWaitMs: 60 })).rejects.toThrow(StoreBusyError);
    expect(n).toBeGreaterThan(1);
    await expect(
      waitWhileBusy(
        () => {
          throw busy();
        },
        { what: 't', deadlineMs: Date.now() + 20 },
      ),
    ).rejects.toThrow(/waited|retry after/);
    const ac = new AbortController();
    setTimeout(() => ac.abort(new Error('caller went away')), 30);
    await expect(
      waitWhileBusy(
        () => {
          throw busy();
        },
        { what: 't', maxWaitMs: 10_000, signal: ac.signal },
      ),
    ).rejects.toThrow('caller went away');
    let calls = 0;
    await expect(
      waitWhileBusy(
        () => {
          calls++;
          throw new Error('not busy');
        },
        { what: 't' },
      ),
    ).rejects.toThrow('not busy');
    expect(calls).toBe(1);
  });

  it('gateWritesWhileBusy runs a listed method only once the probe passes; unlisted methods never probe', async () => {
    /** how many more probes find the lock held */
    let busyProbes = Infinity;
    let probes = 0;
    const ran: string[] = [];
    const store = {
      probeWrite: () => {
        probes++;
        if (busyProbes-- > 0) throw busy();
      },
    };
    const impl = (maxWaitMs: number) =>
      gateWritesWhileBusy({ write: async (_req: unknown, _ctx: unknown) => ran.push('write'), read: async (_req: unknown, _ctx: unknown) => ran.push('read') }, ['write'], store, {
        what: 'db',
        maxWaitMs,
      });
    await expect(impl(50).write({}, ctx(Date.now() + 5000))).rejects.toThrow(/^db: write: the database is locked/);
    expect(ran).toEqual([]);
    const before = probes;
    await impl(50).read({}, ctx());
    expect(probes).toBe(before);
    // the lock goes after three more probes: the write then runs, once
    busyProbes = 3;
    await impl(60_000).write({}, ctx(Date.now() + 60_000));
    expect(ran).toEqual(['read', 'write']);
    expect(probes).toBe(before + 4);
    expect(() => gateWritesWhileBusy({ a: 1 } as unknown as { a: () => void }, ['a'], store, { what: 'db' })).toThrow(/not a method/);
  });
});
