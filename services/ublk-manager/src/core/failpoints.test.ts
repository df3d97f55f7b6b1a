import { InternalError } from '@sandnode/shared';
import { activeFailpoints, failpoint, failpointAsync, FAILPOINTS_ENV, parseFailpoints, setFailpoints } from './failpoints';

describe('failpoints', () => {
  afterEach(() => setFailpoints(undefined));
  it('parses name=action lists and refuses unknown names or actions', () => {
    expect([...parseFailpoints('ublk.recover=error, ublk.release.after=kill')]).toEqual([
      ['ublk.recover', 'error'],
      ['ublk.release.after', 'kill'],
    ]);
    expect(() => parseFailpoints('ublk.nope=error')).toThrow(/unknown failpoint "ublk.nope"/);
    expect(() => parseFailpoints('ublk.recover=explode')).toThrow(/unknown action "explode"/);
  });
  it("reads its own env var (not the server's SANDNODE_FAILPOINTS); a bare name means error", () => {
    expect(FAILPOINTS_ENV).toBe('SANDNODE_UBLK_MANAGER_FAILPOINTS');
    expect([...parseFailpoints('ublk.recover')]).toEqual([['ublk.recover', 'error']]);
    expect(() => parseFailpoints('handover.after-lease=kill')).toThrow(/SANDNODE_UBLK_MANAGER_FAILPOINTS: unknown failpoint "handover.after-lease"/);
  });
  it('error throws InternalError naming the failpoint; unset and off do nothing', () => {
    expect(() => failpoint('ublk.recover')).not.toThrow();
    setFailpoints('ublk.recover=error,ublk.quiesce.after=off');
    expect(activeFailpoints()).toEqual(['ublk.recover=error']);
    expect(() => failpoint('ublk.recover')).toThrow(new InternalError('failpoint ublk.recover'));
    expect(() => failpoint('ublk.quiesce.after')).not.toThrow();
  });
  it('pause (handover-all failpoints only) waits for SIGUSR2', async () => {
    expect(() => parseFailpoints('ublk.recover=pause')).toThrow(/pause is only for/);
    setFailpoints('ublk.handover-all.after-first-move=pause');
    let paused = false;
    let done = false;
    const p = failpointAsync('ublk.handover-all.after-first-move', () => (paused = true)).then(() => (done = true));
    await Promise.resolve();
    expect([paused, done]).toEqual([true, false]);
    process.emit('SIGUSR2', 'SIGUSR2'); // (a real signal would reach jest's own process)
    await p;
    expect(done).toBe(true);
    await failpointAsync('ublk.handover-all.after-list'); // not set: returns at once
  });
});
