/** podd's command-line flags. */
import { ConfigError } from '@sandnode/shared';

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
 * also as `--flag=VALUE`) and `--help`. Throws ConfigError naming an unknown argument or a flag
 * without its value (a missing value, an empty one, or the next flag in its place): podd then
 * exits 2 with the usage.
 */
export function parseFlags(args: string[]): PoddFlags {
  const out: PoddFlags = {};
  for (let i = 0; i < args.length; i++) {
    const a = args[i] as string;
    const [flag, inline] = a.startsWith('--') && a.includes('=') ? [a.slice(0, a.indexOf('=')), a.slice(a.indexOf('=') + 1)] : [a, undefined];
    const value = () => {
      const v = inline ?? args[++i];
      if (v === undefined || v === '' || (inline === undefined && v.startsWith('--'))) throw new ConfigError(`flag ${flag} needs a value`);
      return v;
    };
    if (flag === '--config') out.config = value();
    else if (flag === '--socket') out.socket = value();
    else if (flag === '--listen-fd') out.listenFd = value();
    else if (flag === '--log-level') out.logLevel = value();
    else if (flag === '--help' || flag === '-h') out.help = true;
    else throw new ConfigError(`unknown argument ${JSON.stringify(a)}`);
  }
  return out;
}
