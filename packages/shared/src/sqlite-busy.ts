/**
 * SQLite lock contention without blocking the event loop (issue 11, SQLITE_BUSY finding).
 *
 * better-sqlite3 is synchronous: its busy handler (`timeout` option / `PRAGMA busy_timeout`,
 * 5000 ms by default) sleeps on the event loop while another process holds the database's lock,
 * which stalls every RPC of the component, health included. Every sandnode store therefore opens
 * its database with {@link SQLITE_BUSY_TIMEOUT_MS} (a few ms) and waits for a lock here instead:
 *
 * - {@link busyToUnavailable} runs one synchronous store step; SQLITE_BUSY / SQLITE_LOCKED
 *   becomes {@link StoreBusyError} (gRPC UNAVAILABLE with a retry delay), anything else passes.
 * - {@link waitWhileBusy} retries a step asynchronously (setTimeout, exponential backoff from
 *   {@link SQLITE_BUSY_FIRST_DELAY_MS} to {@link SQLITE_BUSY_MAX_DELAY_MS}) until it succeeds,
 *   the wait bound passes or the signal aborts; then it throws StoreBusyError.
 * - {@link gateWritesWhileBusy} wraps the writing methods of a service implementation: before a
 *   writing call runs, it waits (as above, inside the call's deadline) until the store can take
 *   a write lock. A call that gets UNAVAILABLE from the gate changed nothing.
 *
 * On the wire, StoreBusyError is UNAVAILABLE with the delay in the message and in the trailer
 * {@link RETRY_AFTER_MS_TRAILER} (decimal ms), set by createServiceServer's error middleware.
 */
import { UnavailableError } from './errors';
import { DEADLINE_METADATA_KEY } from './grpc-host';

/** busy_timeout of every sandnode SQLite connection, in ms: the longest one statement blocks the event loop for a lock. */
export const SQLITE_BUSY_TIMEOUT_MS = 2;
/** Longest a call waits (asynchronously) for a locked database before UNAVAILABLE, in ms (the call's deadline may cut it shorter). */
export const DEFAULT_SQLITE_BUSY_WAIT_MS = 2000;
/** First retry delay of {@link waitWhileBusy}, in ms; doubles up to {@link SQLITE_BUSY_MAX_DELAY_MS}. */
export const SQLITE_BUSY_FIRST_DELAY_MS = 5;
/** Largest retry delay of {@link waitWhileBusy}, in ms. */
export const SQLITE_BUSY_MAX_DELAY_MS = 200;
/** Delay a caller is told to wait before retrying, in ms (the trailer's value). */
export const SQLITE_RETRY_AFTER_MS = 500;
/** Trailer of an UNAVAILABLE answer that says how long to wait before a retry (decimal ms). */
export const RETRY_AFTER_MS_TRAILER = 'retry-after-ms';
/** Time kept back from the call's deadline, in ms, so that UNAVAILABLE reaches the caller before its deadline fires. */
const DEADLINE_MARGIN_MS = 50;

/** StoreBusyError: the store's database is locked by another process (or connection). UNAVAILABLE; retry after retryAfterMs. */
export class StoreBusyError extends UnavailableError {
  constructor(
    what: string,
    /** How long the caller should wait before retrying, in ms. */
    readonly retryAfterMs: number = SQLITE_RETRY_AFTER_MS,
    waitedMs = 0,
  ) {
    super(`${what}: the database is locked by another process${waitedMs > 0 ? ` (waited ${waitedMs} ms)` : ''}; nothing was changed; retry after ${retryAfterMs} ms`);
  }
}

/** retryAfterMsOf gives the retry delay (ms) an error carries, or undefined. */
export function retryAfterMsOf(err: unknown): number | undefined {
  if (err instanceof StoreBusyError) return err.retryAfterMs;
  // any UNAVAILABLE that says when to retry (e.g. the server's auto-resume wait, ResumeWaitError)
  const ms = err instanceof UnavailableError ? (err as { retryAfterMs?: unknown }).retryAfterMs : undefined;
  return typeof ms === 'number' ? ms : undefined;
}

/** isSqliteBusy says whether err is better-sqlite3's SqliteError for a held lock (SQLITE_BUSY*, SQLITE_LOCKED*) or a StoreBusyError. */
export function isSqliteBusy(err: unknown): boolean {
  if (err instanceof StoreBusyError) return true;
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' && (code.startsWith('SQLITE_BUSY') || code.startsWith('SQLITE_LOCKED'));
}

/** busyToUnavailable runs fn; a held lock becomes StoreBusyError naming what, other errors pass unchanged. */
export function busyToUnavailable<T>(what: string, fn: () => T): T {
  try {
    return fn();
  } catch (err) {
    if (isSqliteBusy(err)) throw new StoreBusyError(what);
    throw err;
  }
}

/** Options of {@link waitWhileBusy}. */
export interface BusyWaitOptions {
  /** Names the step in the error ("records.db: CreateSandbox"). */
  what: string;
  /** Longest wait, in ms (default DEFAULT_SQLITE_BUSY_WAIT_MS). */
  maxWaitMs?: number;
  /** Absolute deadline, Unix epoch ms: the wait ends DEADLINE_MARGIN_MS before it. */
  deadlineMs?: number;
  /** Stops the wait (the caller went away): the signal's reason is thrown. */
  signal?: AbortSignal;
}

/**
 * waitWhileBusy runs the synchronous step fn, and while it fails with a held lock retries it
 * after a growing setTimeout delay. Resolves with fn's result; throws StoreBusyError (UNAVAILABLE)
 * when the wait bound passes, the signal's reason when it aborts, and fn's other errors at once.
 * The event loop is blocked only for fn's own runs (each at most SQLITE_BUSY_TIMEOUT_MS on a lock).
 */
export async function waitWhileBusy<T>(fn: () => T, o: BusyWaitOptions): Promise<T> {
  const t0 = Date.now();
  const end = Math.min(t0 + (o.maxWaitMs ?? DEFAULT_SQLITE_BUSY_WAIT_MS), (o.deadlineMs ?? Infinity) - DEADLINE_MARGIN_MS);
  let delay = SQLITE_BUSY_FIRST_DELAY_MS;
  for (;;) {
    o.signal?.throwIfAborted();
    try {
      return fn();
    } catch (err) {
      if (!isSqliteBusy(err)) throw err;
    }
    const left = end - Date.now();
    if (left <= 0) throw new StoreBusyError(o.what, SQLITE_RETRY_AFTER_MS, Date.now() - t0);
    await sleep(Math.min(delay, left), o.signal);
    delay = Math.min(delay * 2, SQLITE_BUSY_MAX_DELAY_MS);
  }
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    const done = () => {
      signal?.removeEventListener('abort', abort);
      resolve();
    };
    const t = setTimeout(done, ms);
    const abort = () => {
      clearTimeout(t);
      reject(signal?.reason as Error);
    };
    signal?.addEventListener('abort', abort, { once: true });
  });
}

/** A store that can say whether it could take a write lock now: probeWrite throws SQLITE_BUSY when it cannot (and changes nothing). */
export interface WriteProbe {
  probeWrite(): void;
}

type Handler = (req: unknown, ctx: { signal: AbortSignal; metadata: { get(key: string): unknown } }) => unknown;

/**
 * gateWritesWhileBusy returns impl with each method named in `writing` (unary handlers) wrapped:
 * before the handler runs, the store's write lock is probed with {@link waitWhileBusy}, inside the
 * call's deadline (the shared deadline metadata) and at most maxWaitMs. A locked store answers
 * StoreBusyError (UNAVAILABLE, retry-after-ms) without running the handler: nothing changed.
 * Other methods (reads, health, streams that do not write) are left as they are.
 */
export function gateWritesWhileBusy<T extends object>(impl: T, writing: readonly (keyof T & string)[], store: WriteProbe, opts: { what: string; maxWaitMs?: number }): T {
  const out = { ...impl } as Record<string, Handler>;
  for (const name of writing) {
    const orig = out[name];
    if (typeof orig !== 'function') throw new Error(`gateWritesWhileBusy: ${name} is not a method of the implementation`);
    out[name] = async (req, ctx) => {
      const stamped = ctx.metadata.get(DEADLINE_METADATA_KEY);
      await waitWhileBusy(() => store.probeWrite(), { what: `${opts.what}: ${name}`, maxWaitMs: opts.maxWaitMs, deadlineMs: stamped === undefined ? undefined : Number(stamped), signal: ctx.signal });
      return orig.call(impl, req, ctx);
    };
  }
  return out as T;
}
