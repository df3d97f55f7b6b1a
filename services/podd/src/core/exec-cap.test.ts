/**
 * podd's cap on running commands (issue 10 §5: 500 Exec streams made podd run out of file
 * descriptors): at most maxRunning at once, fewer when the open-file limit leaves room for
 * fewer; one more is RESOURCE_EXHAUSTED before anything is spawned, and its slot comes back
 * when a command's pipes close.
 */
import { tmpdir } from 'node:os';
import { ResourceExhaustedError } from '@sandnode/shared';
import { ExecRunner } from './exec';
import { execCap, openFileLimit } from './limits';

describe('podd exec cap', () => {
  it('execCap: maxExecs, fewer under a small open-file limit, at least 1', () => {
    expect(execCap(256, undefined)).toBe(256);
    expect(execCap(256, Infinity)).toBe(256);
    expect(execCap(256, 1024)).toBe(224);
    expect(execCap(256, 100)).toBe(1);
    expect(execCap(8, 1_000_000)).toBe(8);
  });

  it('openFileLimit reads the soft limit of /proc/self/limits', () => {
    const text = 'Limit                     Soft Limit           Hard Limit           Units\nMax open files            1024                 8192                 files\n';
    expect(openFileLimit(text)).toBe(1024);
    expect(openFileLimit(text.replace('1024 ', 'unlimited '))).toBe(Infinity);
    expect(openFileLimit()).toBeGreaterThan(0);
  });

  it('one command above maxRunning is RESOURCE_EXHAUSTED and spawns nothing; a slot comes back when one ends', async () => {
    const runner = new ExecRunner({ defaultCwd: tmpdir(), maxChunkBytes: 1000, maxRunning: 3 });
    const aborts = [0, 1, 2].map(() => new AbortController());
    const runs = aborts.map((a) => runner.run({ argv: ['sleep', '30'] }, a.signal));
    for (const r of runs) expect((await r.next()).value).toMatchObject({ kind: 'started' });
    expect(runner.running).toBe(3);
    await expect(runner.run({ argv: ['true'] }).next()).rejects.toBeInstanceOf(ResourceExhaustedError);
    expect(runner.running).toBe(3);
    // the open-file limit bounds it too: room for 1 command only
    const tight = new ExecRunner({ defaultCwd: tmpdir(), maxChunkBytes: 1000, maxRunning: 3, openFiles: () => 128 + 4 });
    const one = tight.run({ argv: ['sleep', '30'] });
    expect((await one.next()).value).toMatchObject({ kind: 'started' });
    await expect(tight.run({ argv: ['true'] }).next()).rejects.toBeInstanceOf(ResourceExhaustedError);
    await one.return(undefined);
    // end one of the three: its slot is free once its pipes closed
    aborts[0]!.abort();
    await runs[0]!.next().catch(() => undefined);
    let evs: unknown[] = [];
    for (let i = 0; i < 100 && evs.length === 0; i++) {
      try {
        for await (const ev of runner.run({ argv: ['true'] })) evs.push(ev);
      } catch (err) {
        if (!(err instanceof ResourceExhaustedError)) throw err;
        evs = [];
        await new Promise((r) => setTimeout(r, 20));
      }
    }
    expect(evs.at(-1)).toMatchObject({ kind: 'exit', exitCode: 0 });
    for (const a of aborts) a.abort();
    await Promise.all(runs.map((r) => r.return(undefined)));
  });
});
