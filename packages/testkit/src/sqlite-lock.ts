/**
 * holdSqliteLock: another process (the sqlite3 CLI) holding a SQLite database locked, for tests
 * of lock contention (issue 11, SQLITE_BUSY). Needs `sqlite3` on PATH (Debian: apt-get install sqlite3).
 */
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';

/** A held lock: release() ends the transaction and waits for the process to exit. */
export interface HeldSqliteLock {
  readonly pid: number;
  release(): Promise<void>;
}

/**
 * holdSqliteLock starts `sqlite3 file` in `BEGIN EXCLUSIVE` (the write lock: in WAL mode readers
 * go on); with exclusive it first sets `locking_mode = EXCLUSIVE`, so even readers are locked
 * out. Resolves once the lock is held; rejects when sqlite3 cannot take it (it prints an error).
 */
export async function holdSqliteLock(file: string, opts: { exclusive?: boolean } = {}): Promise<HeldSqliteLock> {
  const p: ChildProcessWithoutNullStreams = spawn('sqlite3', [file], { stdio: 'pipe' });
  let out = '';
  await new Promise<void>((resolve, reject) => {
    const failed = (why: string) => {
      p.kill('SIGKILL');
      reject(new Error(`sqlite3 could not lock ${file}: ${why}`));
    };
    p.on('error', (err) => failed(err.message));
    p.on('exit', (code) => failed(`exited ${code}: ${out}`));
    p.stdout.on('data', (b: Buffer) => {
      out += b.toString();
      if (out.includes('sandnode-locked')) resolve();
    });
    p.stderr.on('data', (b: Buffer) => failed((out += b.toString())));
    if (opts.exclusive) p.stdin.write('PRAGMA locking_mode = EXCLUSIVE;\n');
    // creating a table inside the transaction takes the write lock at once
    p.stdin.write("BEGIN EXCLUSIVE; CREATE TABLE IF NOT EXISTS sandnode_test_lock (x); SELECT 'sandnode-locked';\n");
  });
  p.removeAllListeners('exit');
  return {
    pid: p.pid ?? 0,
    async release() {
      if (p.exitCode !== null || p.signalCode !== null) return;
      const gone = new Promise((r) => p.once('exit', r));
      p.stdin.end('ROLLBACK;\n.quit\n');
      await gone;
    },
  };
}
