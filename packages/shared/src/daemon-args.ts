/**
 * The command line of every sandnode daemon: `--config FILE` (the service's config file),
 * `--help`, and the daemon's own `--flag VALUE` options, each also as `--flag=VALUE`.
 * Anything else, or a flag without its value (none, empty, or the next flag in its place),
 * is a {@link UsageError}: the daemon exits 2 with its usage line.
 */

/** A bad command line; the message names the argument and ends with the usage line. */
export class UsageError extends Error {
  override name = 'UsageError';
}

/** What {@link parseDaemonArgs} read. */
export interface DaemonArgs {
  /** `--config FILE` */
  config?: string;
  /** `--help` / `-h` */
  help: boolean;
  /** the daemon's own flags by name without dashes ("listen-fd" -> value) */
  values: Record<string, string>;
}

/**
 * parseDaemonArgs reads argv (without node and the script) against the daemon's usage line and
 * its own flag names (without `--`); `--config` and `--help` are always known. Throws
 * UsageError "--config needs a value (usage: ...)" / "unknown argument "x" (usage: ...)".
 */
export function parseDaemonArgs(argv: readonly string[], usage: string, flags: readonly string[] = []): DaemonArgs {
  const out: DaemonArgs = { help: false, values: {} };
  const known = new Set(['config', ...flags]);
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] ?? '';
    if (a === '--help' || a === '-h') {
      out.help = true;
      continue;
    }
    const eq = a.indexOf('=');
    const name = a.startsWith('--') ? a.slice(2, eq < 0 ? undefined : eq) : '';
    if (!known.has(name)) throw new UsageError(`unknown argument ${JSON.stringify(a)} (${usage})`);
    const v = eq < 0 ? argv[++i] : a.slice(eq + 1);
    if (v === undefined || v === '' || (eq < 0 && v.startsWith('-'))) {
      throw new UsageError(`--${name} needs a value${v ? ` (got ${JSON.stringify(v)})` : ''} (${usage})`);
    }
    if (name === 'config') out.config = v;
    else out.values[name] = v;
  }
  return out;
}
