/** KeyedMutex runs async sections one at a time per key (here: per device id). */
export class KeyedMutex {
  private readonly tails = new Map<string, Promise<unknown>>();

  /** run waits for earlier sections of key to settle, then runs fn; resolves with its result. */
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
