import { useTempDir } from '@sandnode/testkit';
import { readSlotHolder, SlotBusyError, SlotLock, slotLockFile } from './slot-lock';

const dir = useTempDir('slot-lock-');

describe('SlotLock', () => {
  it('gives the slot to one holder; a second one gets SlotBusyError naming the holder, and the slot once it is released', async () => {
    const file = slotLockFile(dir(), 'b');
    const first = new SlotLock(file);
    await first.acquire('b');
    expect(readSlotHolder(file)).toBe(process.pid);
    const second = new SlotLock(file);
    const err = await second.acquire('b').catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SlotBusyError);
    expect((err as SlotBusyError).message).toBe(`slot b is held by another server (pid ${process.pid}): another standby of this slot is starting or taking over`);
    expect(second.held).toBe(false);
    first.release();
    await second.acquire('b');
    expect(second.held).toBe(true);
    second.release();
  });

  it('a probe without a pid leaves the recorded holder alone', () => {
    const file = slotLockFile(dir(), 'a');
    const probe = new SlotLock(file);
    expect(probe.tryAcquire(false)).toBe(true);
    probe.release();
    expect(readSlotHolder(file)).toBe(0);
  });
});
