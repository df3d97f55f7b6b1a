import { FailedPreconditionError, InvalidArgumentError } from '@sandnode/shared';
import { checkThawToken, clampFreezeMs, FREEZE_RECORD_SCHEMA, newFreezeToken, statusOf, validateMachineId, windowMs, type FreezeRecord } from './freeze';

const rec = (over: Partial<FreezeRecord> = {}): FreezeRecord => ({
  schema: FREEZE_RECORD_SCHEMA,
  token: 'a'.repeat(32),
  mounts: [{ host: '/x/upper-dev', guest: '/' }],
  maxFreezeMs: 1000,
  startedAtMs: 10_000,
  deadlineMs: 11_000,
  watchdogPid: 1,
  watchdogStartTicks: 1,
  watchdogEndFile: '/x/end',
  freezeMs: 2,
  ...over,
});

describe('clampFreezeMs', () => {
  it.each([
    [0, 1500],
    [1, 100],
    [100, 100],
    [2500, 2500],
    [5000, 5000],
    [5001, 5000],
    [4294967295, 5000],
  ])('%p -> %p', (req, want) => expect(clampFreezeMs(req)).toBe(want));
});

describe('freeze tokens', () => {
  it('are 32 hex digits and differ', () => {
    const a = newFreezeToken();
    expect(a).toMatch(/^[0-9a-f]{32}$/);
    expect(newFreezeToken()).not.toBe(a);
  });

  it('empty -> INVALID_ARGUMENT; none or another -> FAILED_PRECONDITION; the latest -> its record', () => {
    expect(() => checkThawToken('', rec())).toThrow(InvalidArgumentError);
    expect(() => checkThawToken('b'.repeat(32), undefined)).toThrow(FailedPreconditionError);
    expect(() => checkThawToken('b'.repeat(32), rec())).toThrow(FailedPreconditionError);
    expect(checkThawToken('a'.repeat(32), rec()).token).toBe('a'.repeat(32));
  });
});

describe('statusOf', () => {
  it('none', () => expect(statusOf(undefined, 0)).toEqual({ frozen: false, token: '', maxFreezeMs: 0, remainingMs: 0, endedBy: undefined, frozenMs: 0, frozenAtMs: 0 }));
  it('holding: remaining until the deadline, never negative', () => {
    expect(statusOf(rec(), 10_400)).toMatchObject({ frozen: true, remainingMs: 600, endedBy: undefined, frozenMs: 0 });
    expect(statusOf(rec(), 12_000).remainingMs).toBe(0);
  });
  it('ended: how and how long', () => expect(statusOf(rec({ endedBy: 'watchdog', frozenMs: 1003 }), 20_000)).toMatchObject({ frozen: false, remainingMs: 0, endedBy: 'watchdog', frozenMs: 1003 }));
  it('windowMs counts from the start', () => {
    expect(windowMs(rec(), 10_250.4)).toBe(250);
    expect(windowMs(rec(), 9000)).toBe(0);
  });
});

describe('validateMachineId', () => {
  it('accepts empty, undefined and 32 lowercase hex digits', () => {
    expect(() => validateMachineId('')).not.toThrow();
    expect(() => validateMachineId(undefined)).not.toThrow();
    expect(() => validateMachineId('0123456789abcdef0123456789abcdef')).not.toThrow();
  });
  it.each(['0123456789ABCDEF0123456789ABCDEF', 'abc', '0123456789abcdef0123456789abcdef0', 'g123456789abcdef0123456789abcdef', '0123456789abcdef0123456789abcde\n'])(
    'rejects %p naming spec.machine_id',
    (id) => expect(() => validateMachineId(id)).toThrow(/spec\.machine_id/),
  );
});
