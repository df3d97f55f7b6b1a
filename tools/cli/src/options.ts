/**
 * The CLI's options that are not one command's: the global dir and address options every
 * command reads, and the parsers of option values (a bad value is a usage error, exit 2).
 */
import path from 'node:path';
import { InvalidArgumentError, Option, type Command } from 'commander';
import { DEFAULT_RUN_DIR, DEFAULT_STATE_DIR, socketPath, unixAddress, type ClientAuth } from '@sandnode/shared';
import type { StackDirs } from '@sandnode/node-stack';

/** Default TCP listen address of the server that `up` starts: none (the unix socket is the API; docs/security.md). */
export const DEFAULT_LISTEN = '';

/** The global options as commander parses them. */
interface GlobalOpts {
  stateDir: string;
  runDir: string;
  listen: string;
  address?: string;
  token?: string;
  tlsCa?: string;
  tlsCert?: string;
  tlsKey?: string;
}

/** addGlobalOptions gives program the options every command reads: --state-dir, --run-dir, --listen, --address, --token, --tls-ca/--tls-cert/--tls-key (each with its env var). */
export function addGlobalOptions(program: Command): Command {
  return program
    .addOption(new Option('--state-dir <dir>', 'state dir (records, images, templates)').env('SANDNODE_STATE_DIR').default(DEFAULT_STATE_DIR))
    .addOption(new Option('--run-dir <dir>', 'runtime dir (sockets, sandbox dirs)').env('SANDNODE_RUN_DIR').default(DEFAULT_RUN_DIR))
    .addOption(new Option('--listen <host:port>', 'server TCP listen address for `up` (default none: the unix socket only)').env('SANDNODE_LISTEN').default(DEFAULT_LISTEN))
    .addOption(new Option('--address <addr>', 'server address (default: its unix socket in the runtime dir)').env('SANDNODE_ADDRESS'))
    .addOption(new Option('--token <secret>', 'bearer token for a TCP --address (sandnode token create)').env('SANDNODE_TOKEN'))
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
    auth: { token: o.token, tlsCa: o.tlsCa, tlsCert: o.tlsCert, tlsKey: o.tlsKey },
  };
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
