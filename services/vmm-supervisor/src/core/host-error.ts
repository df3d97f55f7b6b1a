/**
 * Host failures never reach a caller raw: a failed host command (runc, firecracker, mount,
 * fsfreeze) carries its stderr and paths, which are the supervisor's business, not the
 * caller's. {@link hostFailure} logs the whole error (pino `{ err }`: message, stack, stderr,
 * exit code) and gives the caller a short INTERNAL that names the operation and points at the
 * log. Domain errors with another meaning (NOT_FOUND, FAILED_PRECONDITION, ...) pass unchanged.
 */
import { CommandError, InternalError, SandnodeError, type Logger } from '@sandnode/shared';

/**
 * hostFailure returns what to throw for err, which happened while doing `what` ("pause vm
 * vm-1"): err itself when it is a domain error other than INTERNAL; else a new InternalError
 * "<what> failed on the host[ (exit N)] (see the vmm-supervisor log)", after logging err.
 */
export function hostFailure(log: Logger, err: unknown, what: string): Error {
  if (err instanceof SandnodeError && !(err instanceof InternalError)) return err;
  log.error({ err }, `${what} failed`);
  const exit = err instanceof CommandError && err.exitCode >= 0 ? ` (exit ${err.exitCode})` : '';
  return new InternalError(`${what} failed on the host${exit} (see the vmm-supervisor log)`);
}
