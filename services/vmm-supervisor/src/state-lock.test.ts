import { readFileSync } from 'node:fs';
import path from 'node:path';
import { acquireStateLock, StateLockHeldError } from './state-lock';
import { useTempDir } from '@sandnode/testkit';

describe('acquireStateLock', () => {
  const tmp = useTempDir('vmm-lock');
  test('a second holder is refused with a message naming the file and the holder pid; free again after release', () => {
    const dir = path.join(tmp(), 'vmm-supervisor');
    const first = acquireStateLock(dir);
    expect(readFileSync(first.file, 'utf8').trim()).toBe(String(process.pid));
    let err: unknown;
    try {
      acquireStateLock(dir);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(StateLockHeldError);
    expect((err as Error).message).toBe(`another vmm-supervisor already runs on this state dir: ${first.file} is locked by pid ${process.pid}; stop it first`);
    first.release();
    acquireStateLock(dir).release();
  });
});
