/**
 * KeyedMutex serialises async operations per key (one VM id at a time) while letting
 * operations on different keys run concurrently.
 */
export class KeyedMutex {
  private readonly tails = new Map<string, Promise<unknown>>();

  /** isLocked says whether an operation on key is running or queued. */
  isLocked(key: string): boolean {
    return this.tails.has(key);
  }

  /** run waits for earlier operations on key, then runs fn. */
  async run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.tails.get(key) ?? Promise.resolve();
    const next = prev.then(fn, fn);
    const tail = next.catch(() => undefined);
    this.tails.set(key, tail);
    try {
      return await next;
    } finally {
      if (this.tails.get(key) === tail) this.tails.delete(key);
    }
  }
}
