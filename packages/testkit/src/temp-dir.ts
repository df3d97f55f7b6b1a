/** Temp dirs that tests remove after themselves. */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

/** makeTempDir creates `<tmpdir>/sandnode-<prefix>-XXXXXX` and returns its path. */
export function makeTempDir(prefix: string): string {
  return mkdtempSync(path.join(os.tmpdir(), `sandnode-${prefix}-`));
}

/**
 * useTempDir registers a fresh temp dir per test (beforeEach) that is removed after it
 * (afterEach, recursively, even when the test failed); returns a getter for the current one.
 */
export function useTempDir(prefix: string): () => string {
  let dir: string | undefined;
  beforeEach(() => {
    dir = makeTempDir(prefix);
  });
  afterEach(() => {
    if (dir) rmSync(dir, { recursive: true, force: true });
    dir = undefined;
  });
  return () => {
    if (!dir) throw new Error('useTempDir: only inside a test');
    return dir;
  };
}
