/**
 * Errors of the server's peers (vmm-supervisor, ublk-manager, podd), mapped before they reach
 * core or a public caller. A peer's status with a stable meaning (INVALID_ARGUMENT, NOT_FOUND,
 * ALREADY_EXISTS, FAILED_PRECONDITION, ABORTED, UNAVAILABLE, RESOURCE_EXHAUSTED,
 * DEADLINE_EXCEEDED, UNIMPLEMENTED) becomes the domain error of that code with the peer's
 * message, so retryable codes stay retryable and `isCode` works. Anything else (INTERNAL,
 * UNKNOWN, DATA_LOSS, ...: where a driver's host-command output lands) becomes InternalError
 * with a message that names the peer and the RPC only; the peer's text goes to the server log
 * (`{ err }`), never to a public caller. Cancellations pass unchanged.
 */
import { fromClientError, InternalError, Status, type Logger } from '@sandnode/shared';

/** Peer codes whose messages are written for callers and pass through with their code. */
const STABLE_CODES: ReadonlySet<Status> = new Set([
  Status.INVALID_ARGUMENT,
  Status.NOT_FOUND,
  Status.ALREADY_EXISTS,
  Status.FAILED_PRECONDITION,
  Status.ABORTED,
  Status.UNAVAILABLE,
  Status.RESOURCE_EXHAUSTED,
  Status.DEADLINE_EXCEEDED,
  Status.UNIMPLEMENTED,
]);

/** How a podd's UNAVAILABLE / DEADLINE_EXCEEDED message starts (the CLI's hint keys on it). */
export const PODD_PREFIX = "the sandbox's podd did not answer ";

/**
 * mapPeerError maps err, thrown by a call of rpc on peer ("vmm-supervisor"), as described in
 * the file header; logs the original of an unstable code at warn with `{ err }`.
 */
export function mapPeerError(peer: string, rpc: string, err: unknown, log?: Logger): unknown {
  // a nice-grpc ClientError (matched by its brand: this package does not depend on nice-grpc-common)
  if (!(err instanceof Error) || err.name !== 'ClientError' || typeof (err as { code?: unknown }).code !== 'number') return err; // abort errors, local errors
  const code = (err as Error & { code: Status }).code;
  if (code === Status.CANCELLED) return err;
  // a podd that does not answer is the sandbox's own agent, not the node: its transport text
  // ("Connection attempt timed out", "Protocol error") is named so, or the CLI took it for the
  // node's socket and said "is the node up?" (attacker: a sandbox that replaced its podd)
  if ((code === Status.UNAVAILABLE || code === Status.DEADLINE_EXCEEDED) && peer === 'podd') {
    const e = err as Error & { details?: string };
    if (!e.details?.startsWith(PODD_PREFIX)) e.details = `${PODD_PREFIX}${rpc}: ${e.details ?? e.message}`;
  }
  if (STABLE_CODES.has(code)) return fromClientError(err);
  log?.warn({ err, peer, rpc, code: Status[code] }, 'peer call failed');
  return new InternalError(`${peer} ${rpc} failed (${Status[code]}); the server log has the details`);
}

/**
 * withMappedErrors wraps a nice-grpc client so that every call's error (unary: the promise;
 * server streams: the iteration) goes through {@link mapPeerError}. Other properties pass.
 */
export function withMappedErrors<C extends object>(client: C, peer: string, log?: Logger): C {
  return new Proxy(client, {
    get(target, prop, receiver) {
      const v: unknown = Reflect.get(target, prop, receiver);
      if (typeof v !== 'function' || typeof prop !== 'string') return v;
      return (...args: unknown[]) => {
        const out: unknown = (v as (...a: unknown[]) => unknown).apply(target, args);
        if (out instanceof Promise) return out.catch((err: unknown) => Promise.reject(mapPeerError(peer, prop, err, log)));
        if (out !== null && typeof out === 'object' && Symbol.asyncIterator in out) return mapStream(out as AsyncIterable<unknown>, peer, prop, log);
        return out;
      };
    },
  });
}

async function* mapStream<T>(stream: AsyncIterable<T>, peer: string, rpc: string, log?: Logger): AsyncIterable<T> {
  try {
    yield* stream;
  } catch (err) {
    throw mapPeerError(peer, rpc, err, log);
  }
}
