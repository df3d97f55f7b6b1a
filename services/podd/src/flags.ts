/** podd's command-line flags. */
import { parseDaemonArgs } from '@sandnode/shared';

/** The usage line podd prints with a usage error or `--help`. */
export const USAGE = 'usage: podd [--config FILE] [--socket PATH | --listen-fd N] [--log-level LEVEL]';

/** PoddFlags are the parsed flags; they override env and config file. */
export interface PoddFlags {
  config?: string;
  socket?: string;
  listenFd?: string;
  logLevel?: string;
  help?: boolean;
}

/**
 * parseFlags reads `--config FILE`, `--socket PATH`, `--listen-fd N`, `--log-level LEVEL` (each
 * also as `--flag=VALUE`) and `--help`. Throws UsageError naming an unknown argument or a flag
 * without its value (a missing value, an empty one, or the next flag in its place): podd then
 * exits 2 with the usage.
 */
export function parseFlags(args: string[]): PoddFlags {
  const a = parseDaemonArgs(args, USAGE, ['socket', 'listen-fd', 'log-level']);
  return { config: a.config, socket: a.values.socket, listenFd: a.values['listen-fd'], logLevel: a.values['log-level'], help: a.help || undefined };
}
