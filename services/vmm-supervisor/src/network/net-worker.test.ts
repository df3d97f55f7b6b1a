/** Unit: SANDNODE_SLOT_SETUP parsing, and a worker whose entry file is missing is broken at once (its callers take the spawn path). */
import { NetWorker, slotSetupFromEnv, WorkerBrokenError } from './net-worker';

describe('slot setup path', () => {
  test('SANDNODE_SLOT_SETUP: unset or netlink -> netlink, spawn -> spawn, anything else names the variable', () => {
    expect(slotSetupFromEnv({})).toBe('netlink');
    expect(slotSetupFromEnv({ SANDNODE_SLOT_SETUP: 'netlink' })).toBe('netlink');
    expect(slotSetupFromEnv({ SANDNODE_SLOT_SETUP: ' spawn ' })).toBe('spawn');
    expect(() => slotSetupFromEnv({ SANDNODE_SLOT_SETUP: 'ip' })).toThrow(/SANDNODE_SLOT_SETUP: "ip" is not "netlink" or "spawn"/);
  });

  test('a worker that cannot start rejects with WorkerBrokenError and stays broken with the reason', async () => {
    const w = new NetWorker();
    (w as unknown as { start: () => never }).start = () => {
      throw new WorkerBrokenError('/nowhere/net-worker-main.js is missing (build the supervisor)');
    };
    await expect(w.nft('list tables')).rejects.toBeInstanceOf(WorkerBrokenError);
    expect(w.broken).toMatch(/is missing/);
    await expect(w.links('sn')).rejects.toThrow(/network worker: .*is missing/);
  });
});
