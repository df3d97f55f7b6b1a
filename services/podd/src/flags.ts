/** podd's command-line flags. */
import { ConfigError } from '@sandnode/shared';

/** PoddFlags are the parsed flags; they override env and config file. */
export interface PoddFlags {
  socket?: string;
  listenFd?: string;
  logLevel?: string;
  help?: boolean;
}

/**
 * parseFlags reads `--socket PATH` / `--socket=PATH`, `--listen-fd N`, `--log-level LEVEL` and `--help`.
 * Throws ConfigError naming an unknown flag or a flag without its value. */
export function parseFlags(args: string[]): PoddFlags {
  const out: PoddFlags = {};
  for (let i = 0; i < args.length; i++) {
    const a = args[i] as string;
    const [flag, inline] = a.startsWith('--') && a.includes('=') ? [a.slice(0, a.indexOf('=')), a.slice(a.indexOf('=') + 1)] : [a, undefined];
    const value = () => {
      if (inline !== undefined) return inline;
      const v = args[++i];
      if (v === undefined) throw new ConfigError(`flag ${flag} needs a value`);
      return v;
    };
    if (flag === '--socket') out.socket = value();
    else if (flag === '--listen-fd') out.listenFd = value();
    else if (flag === '--log-level') out.logLevel = value();
    else if (flag === '--help' || flag === '-h') out.help = true;
    else throw new ConfigError(`unknown flag ${a}`);
  }
  return out;
}

