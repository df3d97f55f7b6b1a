/**
 * Owner-only SQLite files (issue 10): records.db, the vmm-supervisor's vm table and the
 * ublk-manager's devices.db hold every sandbox's record, device paths and API token hashes. They
 * are made 0600 (root) whatever the process umask, so that the state dir's 0700 is not their only
 * guard. SQLite gives the `-wal` and `-shm` files it creates the mode of the database file.
 */
import { chmodSync, closeSync, fchmodSync, openSync } from 'node:fs';

/** The mode of every sandnode SQLite file and its -wal/-shm: read and write for the owner only. */
export const DB_FILE_MODE = 0o600;

/**
 * privateDbFile prepares file for a writing SQLite connection: call it before `new Database(file)`.
 * It creates the file (empty, 0600) when missing, and sets file and the `-wal`/`-shm` files
 * that exist (left by an older release or another open connection) to 0600, so that the first
 * write never lands in a file another user may open. Errors: the fs error (EACCES, ENOENT of the dir).
 */
export function privateDbFile(file: string): void {
  const fd = openSync(file, 'a', DB_FILE_MODE);
  try {
    fchmodSync(fd, DB_FILE_MODE);
  } finally {
    closeSync(fd);
  }
  for (const sidecar of [`${file}-wal`, `${file}-shm`]) {
    try {
      chmodSync(sidecar, DB_FILE_MODE);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    }
  }
}
