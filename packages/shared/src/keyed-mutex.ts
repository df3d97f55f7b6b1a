/**
 * KeyedMutex serializes operations per key (a sandbox, VM or device id): a second operation on the same key
 * waits for the first to finish (operations on different ids run concurrently).
 */
export class KeyedMutex {
  private readonly tails = new Map<string, Promise<void>>();

  /** run calls fn once every earlier operation on key has settled. */
  async run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.tails.get(key) ?? Promise.resolve();
    let release!: () => void;
    const mine = new Promise<void>((r) => (release = r));
    const tail = prev.then(() => mine);
    this.tails.set(key, tail);
    try {
      await prev;
      return await fn();
    } finally {
      release();
      if (this.tails.get(key) === tail) this.tails.delete(key);
    }
  }

  /** busy says whether an operation on key is running or waiting. */
  busy(key: string): boolean {
    return this.tails.has(key);
  }
}

/** mapLimit runs fn over items with at most `limit` running at once; results keep item order. */
export async function mapLimit<T, R>(items: readonly T[], limit: number, fn: (item: T) => Promise<R>): Promise<R[]> {
  const out: R[] = new Array<R>(items.length);
  let next = 0;
  const workers = Array.from({ length: Math.max(1, Math.min(limit, items.length)) }, async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i] as T);
    }
  });
  await Promise.all(workers);
  return out;
}
