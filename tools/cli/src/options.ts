/**
 * The CLI's options that are not one command's: the global dir and address options every
 * command reads, and the parsers of option values (a bad value is a usage error, exit 2).
 */
import { closeSync, fstatSync, openSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { InvalidArgumentError, Option, type Command } from 'commander';
import { DEFAULT_RUN_DIR, DEFAULT_STATE_DIR, socketPath, unixAddress, type ClientAuth } from '@sandnode/shared';
import type { StackDirs } from '@sandnode/node-stack';
import { UsageError } from './output';
import { safeLine } from './terminal-safe';

/** Default TCP listen address of the server that `up` starts: none (the unix socket is the API; docs/security.md). */
export const DEFAULT_LISTEN = '';

/** The global options as commander parses them. */
interface GlobalOpts {
  stateDir: string;
  runDir: string;
  listen: string;
  address?: string;
  token?: string;
  tokenFile?: string;
  tlsCa?: string;
  tlsCert?: string;
  tlsKey?: string;
}

/** addGlobalOptions gives program the options every command reads: --state-dir, --run-dir, --listen, --address, --token, --token-file, --tls-ca/--tls-cert/--tls-key (each with its env var). */
export function addGlobalOptions(program: Command): Command {
  return program
    .addOption(new Option('--state-dir <dir>', 'state dir (records, images, templates)').env('SANDNODE_STATE_DIR').default(DEFAULT_STATE_DIR))
    .addOption(new Option('--run-dir <dir>', 'runtime dir (sockets, sandbox dirs)').env('SANDNODE_RUN_DIR').default(DEFAULT_RUN_DIR))
    .addOption(
      new Option('--listen <host:port>', 'server TCP listen address of the gRPC API for `up` ("": none, the unix socket only; the ingress is the server key ingressListen)')
        .env('SANDNODE_LISTEN')
        .default(DEFAULT_LISTEN),
    )
    .addOption(new Option('--address <addr>', 'server address (default: its unix socket in the runtime dir)').env('SANDNODE_ADDRESS'))
    .addOption(
      new Option('--token <secret>', 'bearer token for a TCP --address (sandnode token create); other local users can read it in the process list: prefer --token-file or SANDNODE_TOKEN').env(
        'SANDNODE_TOKEN',
      ),
    )
    .addOption(new Option('--token-file <file>', 'file holding the bearer token (mode 0600 or stricter)').env('SANDNODE_TOKEN_FILE'))
    .addOption(new Option('--tls-ca <file>', 'CA of the server certificate: TLS to a TCP --address').env('SANDNODE_TLS_CA'))
    .addOption(new Option('--tls-cert <file>', 'client certificate for mutual TLS').env('SANDNODE_TLS_CERT'))
    .addOption(new Option('--tls-key <file>', 'client key for mutual TLS').env('SANDNODE_TLS_KEY'));
}

/** The node a command talks to: the stack's dirs (absolute) and the server's gRPC address. */
export interface CliDirs extends StackDirs {
  /** the server's public API address: --address, else "unix://<runDir>/server.sock" */
  address: string;
  /** credentials for a TCP address (--token, --tls-*) */
  auth: ClientAuth;
}

/** dirsOf reads the global options as cmd (any command of the program) sees them. */
export function dirsOf(cmd: Command): CliDirs {
  const o = cmd.optsWithGlobals<GlobalOpts>();
  return {
    stateDir: path.resolve(o.stateDir),
    runDir: path.resolve(o.runDir),
    listen: o.listen,
    address: o.address ?? unixAddress(socketPath(o.runDir, 'server')),
    auth: { token: tokenOf(cmd, o), tlsCa: o.tlsCa, tlsCert: o.tlsCert, tlsKey: o.tlsKey },
  };
}

/** the programs (root commands) that printed the --token warning already */
const warnedArgvToken = new WeakSet<Command>();

/**
 * tokenOf: the bearer secret of --token / SANDNODE_TOKEN or --token-file / SANDNODE_TOKEN_FILE
 * (one given on the command line wins over one from the environment). `--token` on the command
 * line gets a warning on stderr (once per program): every local user can read a process's
 * argv (/proc/<pid>/cmdline). Errors (UsageError, exit 2): both given the same way, a token
 * file that cannot be read, is empty, or is accessible by group or others (mode & 0077).
 */
export function tokenOf(cmd: Command, o: Pick<GlobalOpts, 'token' | 'tokenFile'>, warn: (line: string) => void = (l) => process.stderr.write(safeLine(l))): string | undefined {
  const fromArgv = (key: string) => cmd.getOptionValueSourceWithGlobals(key) === 'cli';
  if (o.token !== undefined && o.tokenFile !== undefined && fromArgv('token') === fromArgv('tokenFile')) {
    throw new UsageError('give only one of --token (SANDNODE_TOKEN) and --token-file (SANDNODE_TOKEN_FILE)');
  }
  if (o.tokenFile !== undefined && (o.token === undefined || fromArgv('tokenFile'))) return readTokenFile(o.tokenFile);
  let root = cmd;
  while (root.parent) root = root.parent;
  if (o.token !== undefined && fromArgv('token') && !warnedArgvToken.has(root)) {
    warnedArgvToken.add(root);
    warn('sandnode: warning: --token puts the secret in the process list, readable by every local user; use --token-file FILE (mode 0600) or SANDNODE_TOKEN');
  }
  return o.token;
}

/** readTokenFile reads a token file (surrounding whitespace dropped). Errors: UsageError (unreadable, empty, or mode & 0077 not 0). */
function readTokenFile(file: string): string {
  let mode: number;
  let text: string;
  try {
    const fd = openSync(file, 'r');
    try {
      mode = fstatSync(fd).mode;
      text = readFileSync(fd, 'utf8');
    } finally {
      closeSync(fd);
    }
  } catch (err) {
    throw new UsageError(`--token-file: cannot read ${file} (${(err as Error).message})`, { cause: err });
  }
  if (mode & 0o077) throw new UsageError(`--token-file: ${file} has mode ${(mode & 0o777).toString(8).padStart(4, '0')}: other users may read the secret; run: chmod 600 ${file}`);
  const secret = text.trim();
  if (!secret) throw new UsageError(`--token-file: ${file} is empty`);
  return secret;
}

/** wholeNumber parses a numeric option value; anything but 0, 1, 2, ... is a usage error naming the option. */
export function wholeNumber(v: string): number {
  if (!/^\d+$/.test(v) || !Number.isSafeInteger(Number(v))) throw new InvalidArgumentError('expected a whole number (0, 1, 2, ...)');
  return Number(v);
}

/** keyValue parses a repeatable KEY=VALUE option value into acc (a later KEY wins); anything else is a usage error. */
export function keyValue(v: string, acc: Record<string, string>): Record<string, string> {
  const i = v.indexOf('=');
  if (i <= 0) throw new InvalidArgumentError('expected KEY=VALUE');
  return { ...acc, [v.slice(0, i)]: v.slice(i + 1) };
}

/** oneOf makes a parser that accepts the names given (any case) and returns the upper-case name; anything else is a usage error listing them. */
export function oneOf(names: readonly string[]): (v: string) => string {
  return (v: string) => {
    const up = v.toUpperCase();
    if (!names.includes(up)) throw new InvalidArgumentError(`expected one of ${names.join(', ')}`);
    return up;
  };
}
