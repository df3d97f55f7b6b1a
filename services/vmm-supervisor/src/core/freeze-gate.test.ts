import { existsSync } from 'node:fs';
import path from 'node:path';
import { FailedPreconditionError } from '@sandnode/shared';
import { useTempDir } from '@sandnode/testkit';
import { clampArmWindowMs, FREEZE_ARM_EPOCH_FILE, FreezeGate, FreezeRateError } from './freeze-gate';

describe('FreezeGate', () => {
  const tmp = useTempDir('freeze-gate-');
  let now = 0;
  let epoch = 5;
  const gate = (o: { burst?: number; perSecond?: number } = {}) => new FreezeGate({ dir: tmp(), currentEpoch: () => epoch, now: () => now, rateBurst: o.burst ?? 2, ratePerSecond: o.perSecond ?? 1 });
  beforeEach(() => {
    now = 1000;
    epoch = 5;
  });

  test('before any server armed: unarmed freezes are let in within the rate, then RESOURCE_EXHAUSTED with a retry delay', () => {
    const g = gate();
    expect(g.required).toBe(false);
    expect(g.admit('a')).toBe('unarmed');
    expect(g.admit('a')).toBe('unarmed');
    let err: unknown;
    try {
      g.admit('a');
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(FreezeRateError);
    expect((err as FreezeRateError).retryAfterMs).toBe(1000);
    // another VM has its own bucket; the first one gets a token back after a second
    expect(g.admit('b')).toBe('unarmed');
    now += 1000;
    expect(g.admit('a')).toBe('unarmed');
  });

  test('an arm admits exactly one freeze within its window; after the first arm, unarmed freezes are FAILED_PRECONDITION', () => {
    const g = gate();
    expect(g.arm('a', 5000)).toEqual({ windowMs: 5000, expiresAtMs: 6000 });
    expect(g.required).toBe(true);
    expect(existsSync(path.join(tmp(), FREEZE_ARM_EPOCH_FILE))).toBe(true);
    expect(g.admit('a')).toBe('armed');
    expect(() => g.admit('a')).toThrow(FailedPreconditionError);
    expect(() => g.admit('b')).toThrow(FailedPreconditionError);
    g.arm('a', 1000);
    now += 1000; // expired
    expect(() => g.admit('a')).toThrow(FailedPreconditionError);
    g.arm('a', 1000);
    expect(g.disarm('a')).toBe(true);
    expect(g.disarm('a')).toBe(false);
    expect(() => g.admit('a')).toThrow(FailedPreconditionError);
  });

  test('the requirement is persisted, and lapses when a server of a higher epoch takes over (0.2.0 never arms)', () => {
    gate().requireArming(5);
    const again = gate();
    expect(again.required).toBe(true);
    epoch = 6;
    expect(again.required).toBe(false);
    expect(again.admit('a')).toBe('unarmed');
    again.requireArming(6);
    expect(again.required).toBe(true);
  });

  test('clampArmWindowMs: 0 -> 30000, into [1000, 120000]', () => {
    expect(clampArmWindowMs(0)).toBe(30_000);
    expect(clampArmWindowMs(1)).toBe(1000);
    expect(clampArmWindowMs(10 ** 9)).toBe(120_000);
  });
});
