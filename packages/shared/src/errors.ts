/**
 * One error vocabulary for every sandnode component (after containerd's errdefs + errgrpc).
 *
 * Core code throws these typed domain errors; the server middleware in `server.ts` maps them
 * to gRPC statuses with a stable meaning (ARCHITECTURE.md section 2). Anything else becomes
 * UNKNOWN with a generic message on the wire and the stack in the log. Clients map
 * `ClientError` back with {@link fromClientError}.
 */
import { ClientError, ServerError, Status } from 'nice-grpc-common';

/** Base class: a domain error that carries the gRPC status it maps to. */
export abstract class SandnodeError extends Error {
  abstract readonly code: Status;
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

/** Bad input; nothing was changed. Maps to INVALID_ARGUMENT. The message names the field. */
export class InvalidArgumentError extends SandnodeError {
  readonly code = Status.INVALID_ARGUMENT;
}
/** The named thing does not exist. Maps to NOT_FOUND. */
export class NotFoundError extends SandnodeError {
  readonly code = Status.NOT_FOUND;
}
/** The thing exists already (with a different spec). Maps to ALREADY_EXISTS. */
export class AlreadyExistsError extends SandnodeError {
  readonly code = Status.ALREADY_EXISTS;
}
/** Wrong state, or a peer lacks a feature. Maps to FAILED_PRECONDITION. */
export class FailedPreconditionError extends SandnodeError {
  readonly code = Status.FAILED_PRECONDITION;
}
/** Stale epoch or lost race: the caller must re-read. Maps to ABORTED. */
export class AbortedError extends SandnodeError {
  readonly code = Status.ABORTED;
}
/** Try again later (a peer restarts, a handover runs). Maps to UNAVAILABLE. */
export class UnavailableError extends SandnodeError {
  readonly code = Status.UNAVAILABLE;
}
/** A limit was hit (devices, disk, sandboxes). Maps to RESOURCE_EXHAUSTED. */
export class ResourceExhaustedError extends SandnodeError {
  readonly code = Status.RESOURCE_EXHAUSTED;
}
/** A deadline passed. Maps to DEADLINE_EXCEEDED. */
export class DeadlineExceededError extends SandnodeError {
  readonly code = Status.DEADLINE_EXCEEDED;
}
/** The RPC is not built in this version. Maps to UNIMPLEMENTED. */
export class UnimplementedError extends SandnodeError {
  readonly code = Status.UNIMPLEMENTED;
}
/** Something broke that the caller cannot fix (a driver command failed). Maps to INTERNAL. */
export class InternalError extends SandnodeError {
  readonly code = Status.INTERNAL;
}

/**
 * toServerError turns any thrown value into the `ServerError` to send, or undefined when the
 * value is not a known error (the caller then logs it and sends UNKNOWN). A `ServerError` or a
 * peer's `ClientError` passes through with its code, so errors of a downstream component
 * (podd, ublk-manager) reach the caller unchanged.
 */
export function toServerError(err: unknown): ServerError | undefined {
  if (err instanceof ServerError) return Buffer.byteLength(err.details) > MAX_STATUS_DETAILS_BYTES ? new ServerError(err.code, boundDetails(err.details)) : err;
  if (err instanceof SandnodeError) return new ServerError(err.code, boundDetails(err.message));
  if (err instanceof ClientError) return new ServerError(err.code, boundDetails(err.details));
  return undefined;
}

/**
 * The longest status message a sandnode component sends, in UTF-8 bytes. Messages name the
 * bad input, and the input can be megabytes (a 300 KB path): sent whole, its `grpc-message`
 * trailer (percent-encoded, up to 3 bytes per byte) passes the peer's header limit (grpc-js:
 * 8 KiB) and the client kills the whole HTTP/2 connection ("Protocol error"), failing every
 * other call on it. 1024 bytes stay below 3 KiB encoded.
 */
export const MAX_STATUS_DETAILS_BYTES = 1024;

/** boundDetails cuts a status message to MAX_STATUS_DETAILS_BYTES, saying how much was cut. */
export function boundDetails(details: string): string {
  const b = Buffer.from(details);
  if (b.length <= MAX_STATUS_DETAILS_BYTES) return details;
  const keep = MAX_STATUS_DETAILS_BYTES - 40;
  // cut on a character boundary: drop a partial UTF-8 sequence at the end
  let end = keep;
  while (end > 0 && (b[end]! & 0xc0) === 0x80) end--;
  return `${b.subarray(0, end).toString()}... (${b.length - end} more bytes cut)`;
}

/** fromClientError maps a peer's `ClientError` back to the domain error class of its code. */
export function fromClientError(err: unknown): unknown {
  if (!(err instanceof ClientError)) return err;
  const msg = err.details;
  switch (err.code) {
    case Status.INVALID_ARGUMENT:
      return new InvalidArgumentError(msg);
    case Status.NOT_FOUND:
      return new NotFoundError(msg);
    case Status.ALREADY_EXISTS:
      return new AlreadyExistsError(msg);
    case Status.FAILED_PRECONDITION:
      return new FailedPreconditionError(msg);
    case Status.ABORTED:
      return new AbortedError(msg);
    case Status.UNAVAILABLE:
      return new UnavailableError(msg);
    case Status.RESOURCE_EXHAUSTED:
      return new ResourceExhaustedError(msg);
    case Status.DEADLINE_EXCEEDED:
      return new DeadlineExceededError(msg);
    case Status.UNIMPLEMENTED:
      return new UnimplementedError(msg);
    default:
      return err;
  }
}

/** isCode says whether err is a domain error, ServerError or ClientError with that status. */
export function isCode(err: unknown, code: Status): boolean {
  if (err instanceof SandnodeError || err instanceof ServerError || err instanceof ClientError) {
    return err.code === code;
  }
  return false;
}

export { Status };
