/**
 * `sandnode sandbox exec ID [options] -- CMD...`: run a command in a sandbox, stream its
 * output to this process's stdout and stderr, and exit with its exit code. Options of CMD
 * need the `--` (without it commander reads them as sandnode's; the usage hint says so).
 */
import type { Command } from 'commander';
import { dirsOf, keyValue, wholeNumber } from '../options';
import { EXIT_FAILURE, action } from '../output';
import { withServer } from '../server-calls';

/** readStdin reads this process's standard input to its end. */
async function readStdin(): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const c of process.stdin) chunks.push(c as Buffer);
  return Buffer.concat(chunks);
}

/** registerExecCommand adds `exec` to the sandbox command group. */
export function registerExecCommand(sandbox: Command): void {
  sandbox
    .command('exec <id> <cmd...>')
    .description('run a command in the sandbox, stream its output and exit with its exit code (use -- before the command)')
    .option('--cwd <dir>', 'working directory inside the sandbox', '')
    .option('--env <key=value>', 'environment variable (repeatable)', keyValue, {})
    .option('--timeout-ms <ms>', 'kill the command after this many ms (0: no limit)', wholeNumber, 0)
    .option('--stdin', 'pass this process standard input to the command')
    .action(
      action(async (id: string, argv: string[], o: { cwd: string; env: Record<string, string>; timeoutMs: number; stdin?: boolean }, cmd: Command) => {
        // a stream that ends without an exit event (the sandbox went away) is a failure
        let code = EXIT_FAILURE;
        await withServer(dirsOf(cmd), async (api) => {
          const stdin = o.stdin ? await readStdin() : Buffer.alloc(0);
          for await (const ev of api.sandboxes.exec({ sandboxId: id, argv, env: o.env, cwd: o.cwd, stdin, timeoutMs: o.timeoutMs })) {
            const e = ev.event;
            if (e?.$case === 'stdout') process.stdout.write(e.value);
            else if (e?.$case === 'stderr') process.stderr.write(e.value);
            else if (e?.$case === 'exit') code = e.value.exitCode;
          }
        });
        process.exitCode = code;
      }),
    );
}
