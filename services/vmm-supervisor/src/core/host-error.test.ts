import { CommandError, FailedPreconditionError, InternalError, type Logger } from '@sandnode/shared';
import { HostStepError, hostFailure } from './host-error';

function captureLog() {
  const errors: Array<{ obj: unknown; msg: string }> = [];
  const log = { error: (obj: unknown, msg: string) => errors.push({ obj, msg }) } as unknown as Logger;
  return { log, errors };
}

describe('hostFailure', () => {
  test('a failed host command becomes a short INTERNAL; the full error goes to the log', () => {
    const { log, errors } = captureLog();
    const cmd = new CommandError('runc --root /run/x pause vm-1: exit 1: container "vm-1" cgroup at /sys/fs/cgroup/secret: EBUSY', 'EBUSY', 1);
    const out = hostFailure(log, cmd, 'pause vm vm-1');
    expect(out).toBeInstanceOf(InternalError);
    expect(out.message).toBe('pause vm vm-1 failed on the host (exit 1) (see the vmm-supervisor log)');
    expect(out.message).not.toMatch(/cgroup|EBUSY|\/run\/x/);
    expect(errors).toEqual([{ obj: { err: cmd }, msg: 'pause vm vm-1 failed' }]);
  });

  test('any INTERNAL or unknown error is shortened too; other domain errors pass unchanged and unlogged', () => {
    const { log, errors } = captureLog();
    expect(hostFailure(log, new InternalError('mount /dev/loop9: wrong fs type'), 'create vm a').message).toBe('create vm a failed on the host (see the vmm-supervisor log)');
    expect(hostFailure(log, new TypeError('x is undefined'), 'stop vm a')).toBeInstanceOf(InternalError);
    const pre = new FailedPreconditionError('vm a is CREATING');
    expect(hostFailure(log, pre, 'stop vm a')).toBe(pre);
    expect(errors).toHaveLength(2);
  });

  test('a HostStepError answers its step (our words) but never its detail (the host output)', () => {
    const { log, errors } = captureLog();
    const e = new HostStepError('create vm vm-1: mount rootfs upper drive /dev/loop3', 'mount: /run/x/upper-dev: wrong fs type, bad superblock');
    const out = hostFailure(log, e, 'create vm vm-1');
    expect(out.message).toBe('create vm vm-1: mount rootfs upper drive /dev/loop3 failed on the host (see the vmm-supervisor log)');
    expect(errors[0]?.obj).toEqual({ err: e });
  });
});
