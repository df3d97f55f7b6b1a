import { readFileSync } from 'node:fs';
import path from 'node:path';
import { useTempDir } from '@sandnode/testkit';
import { nodeLockFile, withNodeLock } from './node-lock';

/** a promise and its resolve, to hold a lock until the test lets go */
function deferred(): { promise: Promise<void>; resolve: () => void } {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}

describe('withNodeLock: one `up` / `down` at a time on a node', () => {
  const tempDir = useTempDir('node-lock');

  it('runs a second holder only after the first one settled', async () => {
    const runDir = path.join(tempDir(), 'run');
    const events: string[] = [];
    const hold = deferred();
    const first = withNodeLock(runDir, 60_000, async () => {
      events.push('first in');
      await hold.promise;
      events.push('first out');
    });
    const second = withNodeLock(runDir, 60_000, async () => {
      events.push('second in');
    });
    await new Promise((r) => setImmediate(r));
    expect(events).toEqual(['first in']);
    hold.resolve();
    await Promise.all([first, second]);
    expect(events).toEqual(['first in', 'first out', 'second in']);
  });

  it('gives up after waitMs naming the lock file and its holder, and leaves the holder alone', async () => {
    const runDir = path.join(tempDir(), 'run');
    const hold = deferred();
    const first = withNodeLock(runDir, 0, () => hold.promise);
    await new Promise((r) => setImmediate(r));
    expect(readFileSync(nodeLockFile(runDir), 'utf8')).toBe(`${process.pid}\n`);
    await expect(withNodeLock(runDir, 0, async () => 'ran')).rejects.toThrow(`another \`sandnode up\` or \`down\` (pid ${process.pid}) holds ${nodeLockFile(runDir)} for more than 0 ms`);
    hold.resolve();
    await first;
    await expect(withNodeLock(runDir, 0, async () => 'ran')).resolves.toBe('ran');
  });

  it('releases the lock when fn throws', async () => {
    const runDir = path.join(tempDir(), 'run');
    await expect(withNodeLock(runDir, 0, async () => Promise.reject(new Error('boom')))).rejects.toThrow('boom');
    await expect(withNodeLock(runDir, 0, async () => 'ran')).resolves.toBe('ran');
  });
});
