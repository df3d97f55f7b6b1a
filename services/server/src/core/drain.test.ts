/**
 * drainNode with scripted parts: defaults when the request says 0, the bounded concurrency,
 * the report in domain terms, a caller who goes away (no further sandbox is started and the
 * device manager is not stopped), and the bounds: a sandbox whose stop never ends (a process in
 * D state) is reported with its step and does not hold the drain or the device manager's stop.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import { AbortedError, createLogger, DEFAULT_DRAIN_CONCURRENCY, DEFAULT_DRAIN_DEADLINE_MS, FailedPreconditionError, KeyedMutex } from '@sandnode/shared';
import { waitFor } from '@sandnode/testkit';
import type { CoreContext } from './context';
import { drainNode, drainOne, reserveMs, type DrainDeps, type DrainProgress } from './drain';
import type { RecordStore, SandboxRecord, SandboxState } from './types';

const log = createLogger('test', '0', 'silent');

function deps(
  states: SandboxState[],
  drainOne: (id: string, progress?: DrainProgress) => Promise<void>,
): DrainDeps & { asked: number; devices: { features: { reset(): void; get(): Promise<{ pid: number }> } } } {
  const recs = states.map((state, i) => ({ sandboxId: `sb-${String(i).padStart(16, '0')}`, state }) as SandboxRecord);
  const d = {
    asked: 0,
    manager: { drainOne },
    store: { list: () => recs } as unknown as RecordStore,
    // pid 0: nothing to signal (the test must not SIGTERM anything)
    devices: { features: { reset: () => undefined, get: async () => (d.asked++, { pid: 0 }) } },
    log,
  };
  return d;
}

describe('drainNode', () => {
  it('drains RUNNING and PAUSED sandboxes only, DEFAULT_DRAIN_CONCURRENCY at once when the request says 0', async () => {
    let running = 0;
    let peak = 0;
    const drained: string[] = [];
    const d = deps([...Array<SandboxState>(12).fill('RUNNING'), 'PAUSED', 'DRAINED', 'ERROR', 'UNKNOWN', 'CREATING'], async (id) => {
      running++;
      peak = Math.max(peak, running);
      await new Promise((r) => setTimeout(r, 5)); // each drain takes a while, so the concurrency shows
      running--;
      drained.push(id);
    });
    const r = await drainNode({ ...d, deadlineMs: 0, concurrency: 0 });
    expect(DEFAULT_DRAIN_CONCURRENCY).toBe(8);
    expect(DEFAULT_DRAIN_DEADLINE_MS).toBe(20_000);
    expect(peak).toBe(DEFAULT_DRAIN_CONCURRENCY);
    expect(r.sandboxes).toHaveLength(13);
    expect(r.sandboxes.every((s) => s.outcome === 'preserved' && s.resumeMethod === 'cold-start' && s.error === '')).toBe(true);
    expect(drained).toHaveLength(13);
    expect(d.asked).toBe(1);
  });

  it('reports a sandbox that could not be drained as failed with the reason', async () => {
    const d = deps(['RUNNING', 'RUNNING'], async (id) => {
      if (id.endsWith('1')) throw new FailedPreconditionError(`sandbox ${id} is PAUSED; Drain needs RUNNING or PAUSED`);
    });
    const r = await drainNode({ ...d, concurrency: 1 });
    expect(r.sandboxes.map((s) => s.outcome)).toEqual(['preserved', 'failed']);
    expect(r.sandboxes[1]!.error).toMatch(/Drain needs/);
  });

  it('tells its listeners the count first and each outcome as it ends (in the order they end); a listener that throws does not stop the drain', async () => {
    const events: string[] = [];
    // sb-...0 takes longer than sb-...1: with two lanes, 1 ends first
    const d = deps(['RUNNING', 'PAUSED', 'DRAINED'], async (id) => {
      await new Promise((r) => setTimeout(r, id.endsWith('0') ? 40 : 5));
      if (id.endsWith('1')) throw new FailedPreconditionError('nope');
    });
    const r = await drainNode({
      ...d,
      concurrency: 2,
      deadlineMs: 5000,
      onStart: (st) => events.push(`start ${st.sandboxes} ${st.deadlineMs} ${st.concurrency}`),
      onSandbox: (sb) => {
        events.push(`${sb.sandboxId.slice(-1)} ${sb.outcome}`);
        throw new Error('a listener bug');
      },
    });
    expect(events).toEqual(['start 2 5000 2', '1 failed', '0 preserved']);
    expect(r.sandboxes.map((x) => x.outcome)).toEqual(['preserved', 'failed']);
    expect(d.asked).toBe(1); // the device manager's step still ran
  });

  it('a cancelled drain starts no further sandbox and leaves the device manager running', async () => {
    const ac = new AbortController();
    const d = deps(['RUNNING', 'RUNNING', 'RUNNING'], async () => {
      ac.abort();
    });
    const r = await drainNode({ ...d, concurrency: 1, signal: ac.signal });
    expect(r.sandboxes.map((s) => s.outcome)).toEqual(['preserved', 'failed', 'failed']);
    expect(r.sandboxes[1]!.error).toMatch(/cancelled by its caller; it keeps running/);
    expect(r.deviceManagerStopped).toBe(false);
    expect(d.asked).toBe(0);
  });
});

describe('drainNode bounds (a sandbox that does not die on SIGKILL must not hold the drain)', () => {
  const children: ChildProcess[] = [];
  afterEach(() => {
    for (const c of children.splice(0)) c.kill('SIGKILL');
  });
  /** a live process standing in for the ublk-manager */
  function fakeDeviceManager(): number {
    const c = spawn('sleep', ['60'], { stdio: 'ignore' });
    children.push(c);
    return c.pid!;
  }

  it('reports a sandbox stuck in its stop as not preserved naming the step, moves on, and still stops the device manager', async () => {
    const pid = fakeDeviceManager();
    const signals: string[] = [];
    const d = deps(['RUNNING', 'RUNNING', 'RUNNING'], async (id, progress) => {
      if (!id.endsWith('1')) return;
      progress!.step = 'stop';
      await new Promise(() => undefined); // DeleteVm never answers: a process in D state
    });
    d.devices.features.get = async () => ({ pid });
    const r = await drainNode({
      ...d,
      deadlineMs: 3000,
      concurrency: 2,
      sandboxTimeoutMs: 300,
      kill: (p, sig) => {
        signals.push(`${p} ${sig}`);
        process.kill(p, sig);
      },
    });
    expect(r.sandboxes.map((s) => s.outcome)).toEqual(['preserved', 'failed', 'preserved']);
    expect(r.sandboxes[1]!.error).toMatch(/^step stop \(SIGKILL, unmount; DeleteVm\) did not finish within 300 ms: a process of it does not die on SIGKILL/);
    expect(signals).toEqual([`${pid} SIGTERM`]);
    expect({ stopped: r.deviceManagerStopped, error: r.deviceManagerError }).toEqual({ stopped: true, error: '' });
    expect(r.durationMs).toBeLessThanOrEqual(3000);
  });

  it('with one lane and a stuck sandbox, the rest of the deadline goes to the device manager, not to waiting', async () => {
    const pid = fakeDeviceManager();
    const d = deps(['RUNNING', 'RUNNING'], async (_id, progress) => {
      progress!.step = 'stop';
      await new Promise(() => undefined);
    });
    d.devices.features.get = async () => ({ pid });
    const r = await drainNode({ ...d, deadlineMs: 1000, concurrency: 1 });
    expect(r.sandboxes.map((s) => s.outcome)).toEqual(['failed', 'failed']);
    expect(r.sandboxes[0]!.error).toMatch(/^step stop .* did not finish within \d+ ms/);
    expect(r.sandboxes[1]!.error).toMatch(/not reached before the drain deadline \(1000 ms\); it keeps running/);
    expect(r.deviceManagerStopped).toBe(true);
    expect(r.durationMs).toBeLessThanOrEqual(1000);
  });

  it('kills the device manager shortly before the deadline when SIGTERM does not stop it, and says so', async () => {
    const pid = fakeDeviceManager();
    const d = deps(['RUNNING'], async () => undefined);
    d.devices.features.get = async () => ({ pid });
    const signals: string[] = [];
    const r = await drainNode({ ...d, deadlineMs: 600, kill: (p, sig) => (signals.push(sig), sig === 'SIGKILL' && process.kill(p, sig)) }); // SIGTERM ignored
    expect(r.sandboxes.map((s) => s.outcome)).toEqual(['preserved']);
    expect(signals).toEqual(['SIGTERM', 'SIGKILL']);
    expect(r.deviceManagerStopped).toBe(true);
    expect(r.deviceManagerError).toMatch(new RegExp(`^the device manager \\(pid ${pid}\\) did not exit within \\d+ ms of SIGTERM .* and was killed \\(SIGKILL\\)`));
  });

  it('says so when the device manager outlives SIGTERM and SIGKILL', async () => {
    const pid = fakeDeviceManager();
    const d = deps(['RUNNING'], async () => undefined);
    d.devices.features.get = async () => ({ pid });
    const r = await drainNode({ ...d, deadlineMs: 600, kill: () => undefined }); // both ignored (a process in D state)
    expect(r.deviceManagerStopped).toBe(false);
    expect(r.deviceManagerError).toBe(`the device manager (pid ${pid}) got SIGTERM, then SIGKILL, and did not exit before the drain deadline`);
  });

  it('a /proc read that fails with EMFILE is not an exit: the device manager is not reported stopped', async () => {
    const pid = fakeDeviceManager();
    const d = deps(['RUNNING'], async () => undefined);
    d.devices.features.get = async () => ({ pid });
    const real = fs.readFileSync;
    const spy = jest.spyOn(fs, 'readFileSync');
    try {
      const signals: string[] = [];
      const r = await drainNode({
        ...d,
        deadlineMs: 600,
        kill: (_p, sig) => {
          signals.push(sig);
          // from the first signal on the server is out of descriptors (the process still runs)
          spy.mockImplementation(((f: fs.PathOrFileDescriptor, o?: unknown) => {
            if (f === `/proc/${pid}/stat`) throw Object.assign(new Error('EMFILE: too many open files'), { code: 'EMFILE' });
            return (real as (f: fs.PathOrFileDescriptor, o?: unknown) => string | Buffer)(f, o);
          }) as typeof fs.readFileSync);
        },
      });
      expect(signals).toEqual(['SIGTERM', 'SIGKILL']);
      expect(r.deviceManagerStopped).toBe(false);
      expect(r.deviceManagerError).toBe(
        `the device manager (pid ${pid}) got SIGTERM, then SIGKILL, and did not exit before the drain deadline (its /proc/${pid}/stat could not be read: out of file descriptors?)`,
      );
    } finally {
      spy.mockRestore();
    }
  });

  it('reserveMs keeps a fifth of the deadline for the device manager, 50 ms to 2 s', () => {
    expect([reserveMs(150), reserveMs(2000), reserveMs(20_000), reserveMs(60_000)]).toEqual([50, 400, 2000, 2000]);
  });
});

describe('drainOne', () => {
  /** a CoreContext with one RUNNING record and a VM peer that records its calls */
  function ctx(pause: () => Promise<void>) {
    const rec = { sandboxId: 'sb-0000000000000001', state: 'RUNNING', vm: { vmId: 'sb-0000000000000001' }, poddAddress: '' } as unknown as SandboxRecord;
    const calls: string[] = [];
    const c = {
      locks: new KeyedMutex(),
      log,
      requireState: () => rec,
      touch: () => calls.push(`touch ${rec.state}`),
      podd: { forget: () => undefined },
      vms: {
        pause: async (id: string) => (calls.push(`pause ${id}`), pause()),
        resume: async (id: string) => calls.push(`resume ${id}`),
        delete: async (id: string) => calls.push(`delete ${id}`),
      },
    } as unknown as CoreContext;
    return { c, rec, calls };
  }

  it('records the steps it goes through and ends DRAINED', async () => {
    const { c, rec, calls } = ctx(async () => undefined);
    const p: DrainProgress = { step: 'lock', abandoned: false };
    await drainOne(c, rec.sandboxId, p);
    expect([p.step, rec.state, calls]).toEqual(['done', 'DRAINED', [`pause ${rec.sandboxId}`, `delete ${rec.sandboxId}`, 'touch DRAINED']]);
  });

  it('undoes a freeze that ends after the drain gave up on the sandbox, so that "it keeps running" holds', async () => {
    let release!: () => void;
    const { c, rec, calls } = ctx(() => new Promise<void>((r) => (release = r)));
    const p: DrainProgress = { step: 'lock', abandoned: false };
    const done = drainOne(c, rec.sandboxId, p).catch((e: Error) => e);
    await waitFor('the freeze to start', () => p.step === 'freeze', 2000, 5);
    p.abandoned = true;
    release();
    expect(await done).toBeInstanceOf(AbortedError);
    expect([rec.state, calls]).toEqual(['RUNNING', [`pause ${rec.sandboxId}`, `resume ${rec.sandboxId}`]]);
  });
});
