/**
 * What the CLI prints and how it exits. Results go to stdout: JSON with `--json` (scripts and
 * the compat tests parse it; fields are only ever added), a table or a line otherwise. Errors
 * go to stderr: "sandnode: CODE: message" and maybe a hint line, or with `--json` one line
 * `{"error":{"code":"NOT_FOUND","grpcCode":5,"message":"...","exitCode":1}}`.
 *
 * Exit codes: {@link EXIT_OK} 0; {@link EXIT_FAILURE} 1 for every failure, whatever the gRPC
 * status (the code is in the message and in the JSON); {@link EXIT_USAGE} 2 for a command
 * line that is wrong (unknown option, missing or bad value, missing argument) or a node config
 * the command refuses (ConfigError: e.g. a run dir another user owns); {@link EXIT_NOT_RUNNING}
 * 3 for `status` when the node is not all up (as `systemctl status` and LSB init scripts: its
 * report is printed all the same). `sandbox exec` exits with the command's exit code.
 */
import { InvalidArgumentError, type Command } from 'commander';
import { ClientError, Status } from 'nice-grpc-common';
import { ConfigError } from '@sandnode/shared';
import { hintFor, targetOf, type CallTarget } from './hints';
import { jsonSafe, terminalSafe } from './terminal-safe';

/** Exit code of a command that did what it was asked. */
export const EXIT_OK = 0;
/** Exit code of a command that failed (any gRPC status, or a failure here). */
export const EXIT_FAILURE = 1;
/** Exit code of a wrong command line. */
export const EXIT_USAGE = 2;

/** Exit code of `status` when a component is down or no server is active (LSB: "program is not running"). */
export const EXIT_NOT_RUNNING = 3;

/** UsageError is a wrong command line found after parsing (e.g. two options that exclude each other): exit 2. */
export class UsageError extends Error {
  override readonly name = 'UsageError';
}

/**
 * CliError is a failure with a message of the CLI's own (exit 1); when it was caused by a
 * ClientError (`{ cause }`), the JSON report keeps that error's gRPC code.
 */
export class CliError extends Error {
  override readonly name = 'CliError';
}

/** The target of a call when the caller does not say: this node's server socket (its hints say `sandnode up`). */
const LOCAL: CallTarget = { address: 'unix:///run/sandnode/server.sock' };

/** What {@link describeError} makes of an error: the one description both output modes print. */
export interface ErrorReport {
  /** the gRPC code name ("NOT_FOUND"), "USAGE" for a usage error, "ERROR" for any other failure */
  code: string;
  /** the gRPC status number, for an error that came from a gRPC call */
  grpcCode?: number;
  /** one line for people, without the "sandnode: " prefix */
  message: string;
  /** what to try next, when there is something to say */
  hint?: string;
  /** the exit code: {@link EXIT_FAILURE} or {@link EXIT_USAGE} */
  exitCode: number;
}

/** describeError turns anything an action threw into the {@link ErrorReport} the CLI prints; target (where the call went) picks the hint (hints.ts). */
export function describeError(err: unknown, target: CallTarget = LOCAL): ErrorReport {
  // commander's InvalidArgumentError: an option parser (options.ts) used inside an action
  if (err instanceof UsageError || err instanceof InvalidArgumentError) return { code: 'USAGE', message: err.message, exitCode: EXIT_USAGE };
  if (err instanceof ConfigError) return { code: 'CONFIG', message: err.message, exitCode: EXIT_USAGE };
  if (err instanceof ClientError) {
    const code = Status[err.code] ?? `CODE_${err.code}`;
    // grpc-js ends connection errors with an empty "Resolution note: "; it tells a user nothing
    const details = err.details.replace(/\s*Resolution note:\s*$/, '');
    const hint = hintFor(err.code, details, target);
    return { code, grpcCode: err.code, message: `${code}: ${details}`, ...(hint ? { hint } : {}), exitCode: EXIT_FAILURE };
  }
  if (err instanceof CliError && err.cause instanceof ClientError) {
    return { code: Status[err.cause.code] ?? `CODE_${err.cause.code}`, grpcCode: err.cause.code, message: err.message, exitCode: EXIT_FAILURE };
  }
  return { code: 'ERROR', message: err instanceof Error ? err.message : String(err), exitCode: EXIT_FAILURE };
}

/**
 * formatError renders a report for stderr: JSON (one line) or "sandnode: ..." lines,
 * newline-terminated. The message may carry a server's, podd's or sandbox's text (a file name
 * in NOT_FOUND): its control characters are escaped (terminal-safe.ts).
 */
export function formatError(r: ErrorReport, json: boolean): string {
  if (json) return `${jsonSafe(JSON.stringify({ error: r }))}\n`;
  return terminalSafe(`sandnode: ${r.message}\n${r.hint ? `sandnode: ${r.hint}\n` : ''}`);
}

/**
 * jsonText is value as indented JSON for `--json`, without the `_unknownFields` key the proto
 * decoder puts in every message it decodes (an internal of ts-proto, not part of any output).
 */
export function jsonText(value: unknown): string {
  return JSON.stringify(value, (key, v: unknown) => (key === '_unknownFields' ? undefined : v), 2);
}

/** print writes a command's result to stdout: value as indented JSON ({@link jsonText}), or human() for people; control characters escaped either way (terminal-safe.ts). */
export function print(json: boolean, value: unknown, human: () => string): void {
  process.stdout.write(json ? `${jsonSafe(jsonText(value))}\n` : `${terminalSafe(human())}\n`);
}

/** wantsJsonErrors: whether a command's options ask for a document (`--json`, `-o json`, `-o yaml`): its errors are then one JSON line. */
export function wantsJsonErrors(o: { json?: unknown; output?: unknown } | undefined): boolean {
  return o?.json === true || o?.output === 'json' || o?.output === 'yaml';
}

/**
 * action wraps a command's action: whatever it throws is printed by {@link formatError} (JSON
 * when the command was given --json, -o json or -o yaml) and the CLI exits with the report's exit code. Commander
 * passes the command itself as the action's last argument.
 */
export function action<A extends unknown[]>(fn: (...args: A) => Promise<void>): (...args: A) => Promise<void> {
  return async (...args: A) => {
    try {
      await fn(...args);
    } catch (err) {
      const cmd = args[args.length - 1] as Command | undefined;
      const r = describeError(err, cmd?.optsWithGlobals ? targetOf(cmd) : LOCAL);
      process.stderr.write(formatError(r, wantsJsonErrors(cmd?.opts?.())));
      process.exit(r.exitCode);
    }
  };
}
