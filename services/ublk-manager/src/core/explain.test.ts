import {
  AbortedError,
  AlreadyExistsError,
  CommandError,
  DeadlineExceededError,
  FailedPreconditionError,
  InternalError,
  InvalidArgumentError,
  NotFoundError,
  ResourceExhaustedError,
  UnavailableError,
  type Logger,
} from '@sandnode/shared';
import { explain } from './explain';

function spyLog(): { log: Logger; errors: unknown[][] } {
  const errors: unknown[][] = [];
  const log = { error: (...args: unknown[]) => errors.push(args) } as unknown as Logger;
  return { log, errors };
}

describe('explain', () => {
  it.each([InvalidArgumentError, NotFoundError, AlreadyExistsError, FailedPreconditionError, AbortedError, UnavailableError, ResourceExhaustedError, DeadlineExceededError])(
    'keeps %p (its code, retryable or not) and adds the context',
    (Kind) => {
      const { log, errors } = spyLog();
      const out = explain(new Kind('why'), 'DeleteDevice "d"', log);
      expect(out).toBeInstanceOf(Kind);
      expect(out.message).toBe('DeleteDevice "d": why');
      expect(errors).toEqual([]);
    },
  );

  it('turns a host command failure into INTERNAL without its stderr, logging the whole error object', () => {
    const { log, errors } = spyLog();
    const cmd = new CommandError('losetup --find --show /images/d.img: exit 1: losetup: /images/d.img: failed to set up loop device: secret', 'losetup: secret', 1);
    const out = explain(cmd, 'CreateDevice "d": attach failed', log);
    expect(out).toBeInstanceOf(InternalError);
    expect(out.message).toBe('CreateDevice "d": attach failed: host command losetup failed (exit 1); details in the ublk-manager log');
    expect(out.message).not.toContain('secret');
    expect(errors).toHaveLength(1);
    expect(errors[0]?.[0]).toEqual({ err: cmd, context: 'CreateDevice "d": attach failed' });
  });

  it('summarises a file error by its code and anything else generically', () => {
    const { log, errors } = spyLog();
    const eio = Object.assign(new Error('EIO: i/o error, fsync /images/d.img'), { code: 'EIO', syscall: 'fsync' });
    expect(explain(eio, 'QuiesceDevice "d"', log).message).toBe('QuiesceDevice "d": EIO (fsync); details in the ublk-manager log');
    expect(explain('weird', 'x', log).message).toBe('x: internal error; details in the ublk-manager log');
    expect(explain(new InternalError('failpoint ublk.recover'), 'RecoverDevice "d"', log).message).toBe('RecoverDevice "d": failpoint ublk.recover; details in the ublk-manager log');
    expect(errors).toHaveLength(3);
  });
});
