/** Temp dirs that tests remove after themselves. */
import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

/**
 * makeTempDir creates `<tmpdir>/sandnode-<prefix>-XXXXXX`, mode 0711 (others may pass, not
 * list: a runDir below it must let the sandboxes' user namespace root pass, and the
 * vmm-supervisor no longer opens a parent of its runDir itself), and returns its path.
 */
export function makeTempDir(prefix: string): string {
  return passableTempDir(`sandnode-${prefix}-`);
}

/** passableTempDir creates `<tmpdir>/<prefix>XXXXXX` with mode 0711 (see {@link makeTempDir}) and returns its path. */
export function passableTempDir(prefix: string): string {
  const dir = mkdtempSync(path.join(os.tmpdir(), prefix));
  chmodSync(dir, 0o711);
  return dir;
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
