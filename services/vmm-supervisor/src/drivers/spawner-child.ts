/**
 * The process a {@link CommandRunner} runs host commands in (runc, umount, mount): a small Node
 * process whose fork of each command costs little, so that the supervisor, whose heap grows with
 * its VMs, never forks on its event loop. Protocol: one JSON object a line on stdin
 * ({@link SpawnRequest}: run, or `{ cancel: id }`), one JSON object a line on stdout
 * ({@link SpawnReply}). Exits when stdin ends (its supervisor went away).
 */
import { execFile, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';

/** A command to run: argv without a shell, a timeout in ms (0: none), stdin text. */
export interface SpawnRequest {
  id: number;
  cmd: string;
  args: string[];
  timeoutMs: number;
  input?: string;
}

/** How a command ended: exit code (or -1 with how, e.g. a signal or ENOENT), its output. */
export interface SpawnReply {
  id: number;
  ok: boolean;
  exitCode: number;
  how: string;
  stdout: string;
  stderr: string;
}

/** Most output one command may give, bytes (as the supervisor's own `run`). */
const MAX_OUTPUT_BYTES = 64 * 1024 * 1024;

if (require.main === module) {
  const running = new Map<number, ChildProcess>();
  const reply = (r: SpawnReply) => process.stdout.write(`${JSON.stringify(r)}\n`);
  const lines = createInterface({ input: process.stdin });
  lines.on('line', (line) => {
    const m = JSON.parse(line) as SpawnRequest | { cancel: number };
    if ('cancel' in m) {
      running.get(m.cancel)?.kill('SIGKILL');
      return;
    }
    const child = execFile(m.cmd, m.args, { timeout: m.timeoutMs, maxBuffer: MAX_OUTPUT_BYTES }, (err, stdout, stderr) => {
      running.delete(m.id);
      const e = err as (NodeJS.ErrnoException & { code?: unknown }) | null;
      const exitCode = e ? (typeof e.code === 'number' ? e.code : -1) : 0;
      const how = e ? (typeof e.code === 'number' ? `exit ${e.code}` : String(e.code ?? e.message)) : '';
      reply({ id: m.id, ok: !e, exitCode, how, stdout: String(stdout), stderr: String(stderr) || (e && typeof e.code !== 'number' ? e.message : '') });
    });
    running.set(m.id, child);
    if (m.input !== undefined) child.stdin?.end(m.input);
  });
  lines.on('close', () => process.exit(0));
}
