/**
 * Durable small-file writes: what a component persists before it acknowledges (an epoch, a
 * freeze record) must survive a crash at any point, never torn.
 */
import { closeSync, fsyncSync, openSync, renameSync, writeSync } from 'node:fs';
import path from 'node:path';

/** fsyncDir fsyncs a directory, so that a rename or unlink in it is durable. */
export function fsyncDir(dir: string): void {
  const fd = openSync(dir, 'r');
  try {
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

/**
 * writeFileAtomic replaces file with data: written to `<file>.tmp-<pid>` (mode), fsynced,
 * renamed over file, then the directory fsynced. A reader sees the old or the new content.
 */
export function writeFileAtomic(file: string, data: string, mode = 0o600): void {
  const tmp = `${file}.tmp-${process.pid}`;
  const fd = openSync(tmp, 'w', mode);
  try {
    writeSync(fd, data);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  renameSync(tmp, file);
  fsyncDir(path.dirname(file));
}
