/**
 * LifecycleGate: held operations wait while the gate is closed, enter when it opens, fail
 * UNAVAILABLE after holdMs, and stop waiting when their caller goes away (signal).
 */
import { UnavailableError } from '@sandnode/shared';
import { DEFAULT_GATE_HOLD_MS, LifecycleGate } from './gate';

describe('LifecycleGate', () => {
  it('holds an operation while closed and runs it once opened', async () => {
    const g = new LifecycleGate();
    expect(g.holdMs).toBe(DEFAULT_GATE_HOLD_MS);
    await g.close();
    let ran = false;
    const p = g.run(async () => {
      ran = true;
      return 7;
    });
    await new Promise((r) => setTimeout(r, 20)); // the time under test: 20 ms closed, and it has not run
    expect(ran).toBe(false);
    g.open();
    await expect(p).resolves.toBe(7);
  });

  it('fails a held operation UNAVAILABLE after holdMs', async () => {
    const g = new LifecycleGate();
    g.holdMs = 30;
    await g.close();
    await expect(g.run(async () => 1)).rejects.toBeInstanceOf(UnavailableError);
  });

  it("stops a held operation's wait when its signal aborts, and never runs it", async () => {
    const g = new LifecycleGate();
    await g.close();
    const ac = new AbortController();
    let ran = false;
    const p = g.run(async () => {
      ran = true;
    }, ac.signal);
    ac.abort(new Error('caller went away'));
    await expect(p).rejects.toThrow('caller went away');
    g.open();
    await new Promise((r) => setTimeout(r, 10)); // the time under test: open for 10 ms, and it still has not run
    expect(ran).toBe(false);
    expect(g.inFlight).toBe(0);
    // an already aborted signal does not enter an open gate either
    await expect(g.run(async () => 1, ac.signal)).rejects.toThrow('caller went away');
  });

  it('a signal has no effect once the operation runs', async () => {
    const g = new LifecycleGate();
    const ac = new AbortController();
    const p = g.run(async () => {
      ac.abort();
      await new Promise((r) => setTimeout(r, 10)); // the operation runs on after the abort
      return 'done';
    }, ac.signal);
    await expect(p).resolves.toBe('done');
  });

  it('retire fails held operations at once', async () => {
    const g = new LifecycleGate();
    g.holdMs = 10_000;
    await g.close();
    const p = g.run(async () => 1);
    g.retire();
    await expect(p).rejects.toThrow(/handed the node over/);
  });
});
