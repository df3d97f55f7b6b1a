/**
 * Host failures never reach a caller raw: a failed host command (runc, firecracker, mount,
 * fsfreeze) carries its stderr and paths, which are the supervisor's business, not the
 * caller's. {@link hostFailure} logs the whole error (pino `{ err }`: message, stack, stderr,
 * exit code) and gives the caller a short INTERNAL that names the operation and points at the
 * log. Domain errors with another meaning (NOT_FOUND, FAILED_PRECONDITION, ...) pass unchanged.
 */
import { CommandError, InternalError, SandnodeError, type Logger } from '@sandnode/shared';

/**
 * HostStepError is a failed step of a driver operation: `step` is our own words for it (and
 * the caller's input, e.g. "create vm vm-1: mount rootfs upper drive /dev/loop3"), safe to
 * answer; `detail` is what the host said (stderr, console lines), for the log only.
 */
export class HostStepError extends InternalError {
  constructor(
    readonly step: string,
    readonly detail: string,
  ) {
    super(`${step} failed: ${detail}`);
  }
}

/**
 * hostFailure returns what to throw for err, which happened while doing `what` ("pause vm
 * vm-1"): err itself when it is a domain error other than INTERNAL or an AbortError; else a new InternalError
 * "<what> failed on the host[ (exit N)] (see the vmm-supervisor log)", after logging err; for a
 * {@link HostStepError} its step takes the place of what.
 */
export function hostFailure(log: Logger, err: unknown, what: string): Error {
  if (err instanceof SandnodeError && !(err instanceof InternalError)) return err;
  // The caller went away (ctx.signal): the shared middleware answers CANCELLED.
  if (typeof err === 'object' && err !== null && (err as { name?: unknown }).name === 'AbortError') return err as Error;
  log.error({ err }, `${what} failed`);
  const exit = err instanceof CommandError && err.exitCode >= 0 ? ` (exit ${err.exitCode})` : '';
  const step = err instanceof HostStepError ? err.step : what;
  return new InternalError(`${step} failed on the host${exit} (see the vmm-supervisor log)`);
}
