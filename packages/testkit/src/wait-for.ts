/** Waiting on a condition instead of a fixed sleep. */

/** Default time {@link waitFor} waits, ms. */
export const DEFAULT_WAIT_MS = 10_000;
/** Default poll interval of {@link waitFor}, ms. */
export const DEFAULT_POLL_MS = 25;

/**
 * waitFor polls cond (sync or async) every pollMs until it returns a truthy value, and
 * returns that value; throws Error "timed out after N ms waiting for <what>" (with the last
 * error cond threw, if any) after timeoutMs.
 */
export async function waitFor<T>(what: string, cond: () => T | Promise<T>, timeoutMs = DEFAULT_WAIT_MS, pollMs = DEFAULT_POLL_MS): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await cond();
      if (v) return v as NonNullable<T>;
    } catch (err) {
      last = err;
    }
    if (Date.now() >= deadline) {
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: last error: ${(last as Error).message}` : ''}`);
    }
    await new Promise((r) => setTimeout(r, pollMs));
  }
}
