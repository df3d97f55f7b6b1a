/**
 * `sandnode sandbox exec ID [options] -- CMD...`: run a command in a sandbox, stream its
 * output to this process's stdout and stderr, and exit with its exit code. Options of CMD
 * need the `--` (without it commander reads them as sandnode's; the usage hint says so).
 */
import type { Command } from 'commander';
import { ClientError, Status } from 'nice-grpc-common';
import { dirsOf, keyValue, wholeNumber } from '../options';
import { CliError, EXIT_FAILURE, action } from '../output';
import { withServer } from '../server-calls';

/** readStdin reads this process's standard input to its end. */
async function readStdin(): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const c of process.stdin) chunks.push(c as Buffer);
  return Buffer.concat(chunks);
}

/** Most stdin bytes one Exec carries (the server's limit, SandboxService.Exec: 3 MiB). */
export const MAX_EXEC_STDIN_BYTES = 3 * 1024 * 1024;

/**
 * stdinTooLarge: the human error for an Exec refused because its stdin (n bytes) passed the
 * limit (INVALID_ARGUMENT from the server, or RESOURCE_EXHAUSTED from gRPC's message limit);
 * the gRPC code stays in --json (CliError's cause). Other errors pass.
 */
export function stdinTooLarge(err: unknown, n: number, id: string): unknown {
  if (n <= MAX_EXEC_STDIN_BYTES || !(err instanceof ClientError) || (err.code !== Status.RESOURCE_EXHAUSTED && err.code !== Status.INVALID_ARGUMENT)) return err;
  return new CliError(`stdin is limited to ${MAX_EXEC_STDIN_BYTES} bytes (3 MiB) per exec, this was ${n}; to move a file in, use: sandnode sandbox cp FILE ${id}:/workspace/FILE`, { cause: err });
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
          try {
            for await (const ev of api.sandboxes.exec({ sandboxId: id, argv, env: o.env, cwd: o.cwd, stdin, timeoutMs: o.timeoutMs })) {
              const e = ev.event;
              if (e?.$case === 'stdout') process.stdout.write(e.value);
              else if (e?.$case === 'stderr') process.stderr.write(e.value);
              else if (e?.$case === 'exit') code = e.value.exitCode;
            }
          } catch (err) {
            throw stdinTooLarge(err, stdin.length, id);
          }
        });
        process.exitCode = code;
      }),
    );
}
