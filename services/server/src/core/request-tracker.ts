/**
 * RequestTracker: request_id idempotency of CreateSandbox and ForkSandbox while the call runs.
 * A retry with the same request_id joins the call in flight (same result); an id in use by a
 * different call (a create vs a fork, or a fork of another parent) is INVALID_ARGUMENT. Once
 * the call has settled, the record store answers a repeated request_id (the record keeps it:
 * see SandboxManager.create / fork.ts), so this only covers the window before that.
 */
import { InvalidArgumentError } from '@sandnode/shared';

/** A create or fork in flight: what it is ("a fork of sb-...") and its result. */
interface Inflight {
  what: string;
  p: Promise<unknown>;
}

export class RequestTracker {
  private readonly inflight = new Map<string, Inflight>();

  /**
   * join returns the call in flight under requestId when it is the same call (`what`),
   * undefined when none runs (or requestId is empty). InvalidArgumentError when the id is in
   * use by another call.
   */
  join<T>(requestId: string, what: string): Promise<T> | undefined {
    if (!requestId) return undefined;
    const f = this.inflight.get(requestId);
    if (f && f.what !== what) throw new InvalidArgumentError(`request_id: ${requestId} is in use by ${f.what}, in progress`);
    return f?.p as Promise<T> | undefined;
  }

  /**
   * track registers p as `what` under requestId until it settles and returns p; an empty
   * requestId is not tracked. Call it before the first await of the call, so that a parallel
   * retry joins it.
   */
  track<T>(requestId: string, what: string, p: Promise<T>): Promise<T> {
    if (!requestId) return p;
    this.inflight.set(requestId, { what, p });
    p.finally(() => this.inflight.delete(requestId)).catch(() => undefined);
    return p;
  }

  /** has says whether a call runs under requestId (the reaper leaves its CREATING record alone). */
  has(requestId: string): boolean {
    return requestId !== '' && this.inflight.has(requestId);
  }
}
