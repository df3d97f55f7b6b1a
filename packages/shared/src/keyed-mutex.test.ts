import { KeyedMutex, mapLimit } from './keyed-mutex';

describe('KeyedMutex', () => {
  it('serializes operations on one key and runs different keys concurrently', async () => {
    const m = new KeyedMutex();
    const log: string[] = [];
    const op = (key: string, name: string, ms: number) =>
      m.run(key, async () => {
        log.push(`start ${name}`);
        await new Promise((r) => setTimeout(r, ms)); // the operation's own duration (the overlap under test)
        log.push(`end ${name}`);
      });
    await Promise.all([op('a', 'a1', 30), op('a', 'a2', 1), op('b', 'b1', 5)]);
    expect(log.indexOf('end a1')).toBeLessThan(log.indexOf('start a2'));
    expect(log.indexOf('start b1')).toBeLessThan(log.indexOf('end a1'));
    expect(m.busy('a')).toBe(false);
  });

  it('releases the key when an operation throws', async () => {
    const m = new KeyedMutex();
    await expect(m.run('k', async () => Promise.reject(new Error('boom')))).rejects.toThrow('boom');
    await expect(m.run('k', async () => 1)).resolves.toBe(1);
  });
});

describe('mapLimit', () => {
  it('keeps order and the limit', async () => {
    let running = 0;
    let peak = 0;
    const out = await mapLimit([1, 2, 3, 4, 5, 6], 2, async (x) => {
      running++;
      peak = Math.max(peak, running);
      await new Promise((r) => setTimeout(r, 5)); // each call takes a while, so the limit shows
      running--;
      return x * 10;
    });
    expect(out).toEqual([10, 20, 30, 40, 50, 60]);
    expect(peak).toBe(2);
  });
});
