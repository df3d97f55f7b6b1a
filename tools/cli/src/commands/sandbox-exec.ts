/**
 * `sandnode sandbox exec ID [options] -- CMD...`: run a command in a sandbox through ExecStream,
 * stream its output to this process's stdout and stderr, and exit with its exit code; `-i`
 * sends this process's stdin as it is typed, `-t` runs the command on a pseudo-terminal (raw
 * mode here, window size followed), `-it ID -- sh` is an interactive shell. Options of CMD need
 * the `--` (without it commander reads them as sandnode's; the usage hint says so). Against a
 * server without ExecStream, `exec` without -t falls back to Exec (stdin read to its end first).
 * `sandbox ps ID` and `sandbox kill ID PID|EXEC_ID [--signal]` list and signal those commands;
 * `sandbox attach ID EXEC_ID` reattaches to one (after this CLI left it, or another client went away).
 */
import type { Command } from 'commander';
import { ClientError, Status } from 'nice-grpc-common';
import { table } from '@sandnode/node-stack';
import { SIGNAL_PROCESS_SIGNALS } from '@sandnode/shared';
import { dirsOf, keyValue, wholeNumber } from '../options';
import { CliError, EXIT_FAILURE, UsageError, action, describeError, formatError } from '../output';
import { withServer } from '../server-calls';
import { argsOf, commandPath, shellWord } from '../usage';
import { isUnimplemented, runExecSession } from './exec-session';
import { shownName } from './sandbox-files';
import { ListProcessesResponse, type ProcessInfo } from '@sandnode/shared/proto/server/v1/sandbox';
import { addOutputOptions, render, type OutputOpts } from '../output-format';

/** readStdin reads this process's standard input to its end. */
async function readStdin(): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const c of process.stdin) chunks.push(c as Buffer);
  return Buffer.concat(chunks);
}

/** Most stdin bytes one Exec carries (the server's limit, SandboxService.Exec: 3 MiB); ExecStream streams stdin without a limit. */
export const MAX_EXEC_STDIN_BYTES = 3 * 1024 * 1024;

/**
 * stdinTooLarge: the human error for an Exec refused because its stdin (n bytes) passed the
 * limit (INVALID_ARGUMENT from the server, or RESOURCE_EXHAUSTED from gRPC's message limit);
 * the gRPC code stays in --json (CliError's cause). Other errors pass. Only a server without
 * ExecStream (the fallback to Exec) has the limit.
 */
export function stdinTooLarge(err: unknown, n: number, id: string): unknown {
  if (n <= MAX_EXEC_STDIN_BYTES || !(err instanceof ClientError) || (err.code !== Status.RESOURCE_EXHAUSTED && err.code !== Status.INVALID_ARGUMENT)) return err;
  return new CliError(
    `stdin is limited to ${MAX_EXEC_STDIN_BYTES} bytes (3 MiB) per exec by this server (it has no ExecStream), this was ${n}; to move a file in, use: sandnode sandbox cp FILE ${id}:/workspace/FILE`,
    { cause: err },
  );
}

/**
 * ownFlagAfterCommand: the line with `--` before the command when one of exec's own options
 * (-i, -t, --cwd ...) comes after the command's first word without a `--` (commander took it
 * for sandnode's: `exec ID ls -t` would run `ls` on a pty); undefined otherwise. args is what
 * follows "exec" on the command line.
 */
export function ownFlagAfterCommand(cmd: Command, args: readonly string[]): string | undefined {
  if (args.includes('--')) return undefined;
  const takesValue = new Map<string, boolean>();
  for (const o of cmd.options) for (const f of [o.short, o.long]) if (f) takesValue.set(f, o.required || o.optional);
  const isOwn = (a: string) => takesValue.has(a.split('=')[0]!) || /^-[it]{2}$/.test(a);
  // the sandbox id, then the command's first word, each after the options before them
  let i = 0;
  let operands = 0;
  for (; i < args.length; i++) {
    const a = args[i]!;
    if (a.startsWith('-') && a !== '-') {
      if (takesValue.get(a)) i++;
      continue;
    }
    if (++operands === 2) break;
  }
  const rest = args.slice(i + 1);
  if (i >= args.length || !rest.some(isOwn)) return undefined;
  const before = args.slice(0, i);
  return [commandPath(cmd), ...before.map(shellWord), '--', ...[args[i]!, ...rest].map(shellWord)].join(' ');
}

interface ExecOpts {
  cwd: string;
  env: Record<string, string>;
  timeoutMs: number;
  stdin?: boolean;
  interactive?: boolean;
  tty?: boolean;
}

/** registerExecCommand adds `exec`, `ps` and `kill` to the sandbox command group. */
/** Exit code of `sandbox exec` when the command is not found in the sandbox (as sh and docker exec). */
export const EXIT_COMMAND_NOT_FOUND = 127;

/** commandNotFound: err is podd's NOT_FOUND for a missing argv[0] ("argv[0]: X: command not found"). */
export function commandNotFound(err: unknown): boolean {
  return err instanceof ClientError && err.code === Status.NOT_FOUND && /^argv\[0\]: .*: command not found$/.test(err.details);
}

/**
 * processRows are the table rows of `sandbox ps`: exec id, pid, status, start (ISO), tty, command.
 * Every string comes from the sandbox's podd, so control characters are shown escaped (shownName):
 * a command line holding escape sequences must not drive the operator's terminal.
 */
export function processRows(processes: readonly ProcessInfo[], wide = false, nowMs = Date.now()): (string | number)[][] {
  return processes.map((p) => [
    shownName(p.execId),
    p.pid,
    p.running ? 'running' : p.signal ? `killed (${shownName(p.signal)})` : `exited ${p.exitCode}`,
    new Date(p.startedAtMs).toISOString(),
    p.pty ? 'tty' : '',
    ...(wide ? [p.attached ? 'yes' : 'no', ageText(nowMs - p.startedAtMs), endedText(p)] : []),
    shownName(p.argv.join(' ')),
  ]);
}

/** The columns of `sandbox ps` (wide: ATTACHED, whether a client's stream is attached, AGE since the start, and ENDED). */
export const processColumns = (wide: boolean): string[] => ['EXEC ID', 'PID', 'STATUS', 'STARTED', 'TTY', ...(wide ? ['ATTACHED', 'AGE', 'ENDED'] : []), 'COMMAND'];

/** endedText is the ENDED cell: '-' while the command runs, its exit time (ISO) and run time, or "not told" when an older podd gave no end time. */
export function endedText(p: Pick<ProcessInfo, 'running' | 'startedAtMs' | 'endedAtMs'>): string {
  if (p.running) return '-';
  if (!p.endedAtMs) return 'not told (older podd)';
  return `${new Date(p.endedAtMs).toISOString()} (ran ${ageText(p.endedAtMs - p.startedAtMs)})`;
}

/** ageText is a duration as kubectl's AGE column shows it: 45s, 12m, 3h20m, 2d4h (ms; below 0 counts as 0). */
export function ageText(ms: number): string {
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m`;
  const h = Math.floor(m / 60);
  if (h < 24) return m % 60 ? `${h}h${m % 60}m` : `${h}h`;
  const d = Math.floor(h / 24);
  return h % 24 ? `${d}d${h % 24}h` : `${d}d`;
}

export function registerExecCommand(sandbox: Command): void {
  sandbox
    .command('exec <id> <cmd...>')
    .description('run a command in the sandbox, stream its output and exit with its exit code (use -- before the command; -it ID -- sh for a shell)')
    .option('--cwd <dir>', 'working directory inside the sandbox', '')
    .option('--env <key=value>', 'environment variable (repeatable)', keyValue, {})
    .option('--timeout-ms <ms>', 'kill the command after this many ms (0: no limit)', wholeNumber, 0)
    .option('-i, --interactive', 'send this process standard input to the command as it is typed')
    .option('--stdin', 'the same as -i')
    .option('-t, --tty', 'run the command on a pseudo-terminal (raw mode here, resize followed; implies -i)')
    .action(
      action(async (id: string, argv: string[], o: ExecOpts, cmd: Command) => {
        const raw = argsOf(cmd, process.argv.slice(2));
        const line = raw ? ownFlagAfterCommand(cmd, raw) : undefined;
        if (line) throw new UsageError(`an option of sandbox exec after the command is read as sandnode's; put -- before the command: ${line}`);
        const sendStdin = !!(o.interactive || o.stdin || o.tty);
        if (o.tty && !process.stdin.isTTY) process.stderr.write('sandnode: warning: -t: stdin is not a terminal: the command gets a pty in the sandbox, but this side is not put in raw mode\n');
        process.exitCode = await withServer(dirsOf(cmd), async (api) => {
          const start = { sandboxId: id, argv, env: o.env, cwd: o.cwd, timeoutMs: o.timeoutMs, pty: !!o.tty, detachKeepMs: 0 };
          try {
            return await runExecSession(api, { start, stdin: sendStdin, raw: !!o.tty });
          } catch (err) {
            if (!isUnimplemented(err) || o.tty) throw err;
          }
          // a server of an older release: Exec, stdin read to its end first
          let code = EXIT_FAILURE;
          const stdin = sendStdin ? await readStdin() : Buffer.alloc(0);
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
          return code;
        }).catch((err: unknown) => {
          // as a shell and docker exec: a command that is not there exits 127, not the 1 a command may exit with itself
          if (!commandNotFound(err)) throw err;
          process.stderr.write(formatError(describeError(err), false));
          return EXIT_COMMAND_NOT_FOUND;
        });
        // stdin may still hold the event loop (a terminal); the answer is complete
        if (sendStdin) process.stdin.destroy();
      }),
    );

  sandbox
    .command('attach <id> <exec-id>')
    .description('reattach to a command exec started (its output since the last client left, then live; a pty command gets this terminal) and exit with its exit code')
    .option('--no-stdin', 'do not send this process standard input')
    .action(
      action(async (id: string, execId: string, o: { stdin: boolean }, cmd: Command) => {
        process.exitCode = await withServer(dirsOf(cmd), (api) => runExecSession(api, { attach: { sandboxId: id, execId }, stdin: o.stdin, raw: false }));
        if (o.stdin) process.stdin.destroy();
      }),
    );

  addOutputOptions(sandbox.command('ps <id>').description('list the commands exec started in the sandbox (running, or ended in the last minute; -o wide: attached, age)')).action(
    action(async (id: string, o: OutputOpts, cmd: Command) => {
      const r = await withServer(dirsOf(cmd), (api) => api.sandboxes.listProcesses({ sandboxId: id }));
      render(o, {
        json: { processes: r.processes.map(({ _unknownFields, ...p }) => p) },
        proto: () => ListProcessesResponse.toJSON(r),
        human: () => table(processColumns(false), processRows(r.processes)),
        wide: () => table(processColumns(true), processRows(r.processes, true)),
      });
    }),
  );

  sandbox
    .command('kill <id> <pid>')
    .description('send a signal to a command exec started (by its pid in the sandbox or its exec id)')
    .option('--signal <name>', 'SIGINT, SIGTERM, SIGKILL, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGSTOP, SIGCONT or SIGWINCH (the SIG may be left out)', 'SIGTERM')
    .action(
      action(async (id: string, target: string, o: { signal: string }, cmd: Command) => {
        const byPid = /^\d+$/.test(target);
        if (!byPid && !target.startsWith('ex-')) throw new UsageError(`kill: ${JSON.stringify(target)} is neither a pid nor an exec id (ex-...)`);
        const signal = killSignal(o.signal);
        await withServer(dirsOf(cmd), (api) => api.sandboxes.signalProcess({ sandboxId: id, pid: byPid ? Number(target) : 0, execId: byPid ? '' : target, signal }));
      }),
    );
}

/** killSignal is --signal's name as SignalProcess takes it ("term" -> "SIGTERM"); UsageError (exit 2) for a name not in SIGNAL_PROCESS_SIGNALS. */
export function killSignal(name: string): string {
  const up = name.toUpperCase();
  const signal = up.startsWith('SIG') ? up : `SIG${up}`;
  if (!(SIGNAL_PROCESS_SIGNALS as readonly string[]).includes(signal))
    throw new UsageError(`kill: --signal ${JSON.stringify(name)} is not one of ${SIGNAL_PROCESS_SIGNALS.join(', ')} (the SIG may be left out)`);
  return signal;
}
