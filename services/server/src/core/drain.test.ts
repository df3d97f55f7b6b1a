/**
 * drainNode with scripted parts: defaults when the request says 0, the bounded concurrency,
 * the report in domain terms, and a caller who goes away (no further sandbox is started and
 * the device manager is not stopped).
 */
import { createLogger, DEFAULT_DRAIN_CONCURRENCY, DEFAULT_DRAIN_DEADLINE_MS, FailedPreconditionError } from '@sandnode/shared';
import { drainNode, type DrainDeps } from './drain';
import type { RecordStore, SandboxRecord, SandboxState } from './types';

const log = createLogger('test', '0', 'silent');

function deps(states: SandboxState[], drainOne: (id: string) => Promise<void>): DrainDeps & { asked: number } {
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
