/**
 * explain: how a failure inside a DeviceManager step reaches a public caller. A typed domain
 * error keeps its gRPC code (a retryable UNAVAILABLE / ABORTED / DEADLINE_EXCEEDED /
 * RESOURCE_EXHAUSTED stays retryable) and gets the step as context. Anything else (a host
 * command, a file operation, a bug) becomes INTERNAL with a short message; the full error
 * object (message, stderr, stack) goes to the log only, never to the wire.
 */
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

type DomainErrorClass = new (message: string) => Error;

/**
 * The domain errors whose code a caller can act on; explain keeps them as they are (with
 * context). Their messages are written by sandnode code, never a host command's stderr.
 */
const KEPT: readonly DomainErrorClass[] = [
  InvalidArgumentError,
  NotFoundError,
  AlreadyExistsError,
  FailedPreconditionError,
  AbortedError,
  UnavailableError,
  ResourceExhaustedError,
  DeadlineExceededError,
];

/**
 * internalSummary is the short public text of an internal failure: "host command losetup
 * failed (exit 1)", "EIO (fsync)", or the text of a sandnode InternalError (written by
 * sandnode code, e.g. "failpoint ublk.recover").
 */
function internalSummary(err: unknown): string {
  if (err instanceof CommandError) {
    const cmd = err.message.split(' ', 1)[0] ?? 'a host command';
    return `host command ${cmd} failed (exit ${err.exitCode})`;
  }
  if (err instanceof InternalError) return err.message;
  const e = err as NodeJS.ErrnoException | undefined;
  if (e && typeof e.code === 'string') return e.syscall ? `${e.code} (${e.syscall})` : e.code;
  return 'internal error';
}

/**
 * explain wraps err with context ("CreateDevice \"x\": attach failed") for a public caller.
 * Typed domain errors (INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, FAILED_PRECONDITION,
 * ABORTED, UNAVAILABLE, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED) keep their class. Anything
 * else becomes InternalError (INTERNAL) with a short summary and no stderr; when log is given
 * the full error object (stack, stderr) is logged at error level with the context.
 */
export function explain(err: unknown, context: string, log?: Logger): Error {
  for (const Kept of KEPT) {
    if (err instanceof Kept) return new Kept(`${context}: ${err.message}`);
  }
  log?.error({ err, context }, `${context}: internal failure`);
  return new InternalError(`${context}: ${internalSummary(err)}; details in the ublk-manager log`);
}
