/**
 * Usage errors: a command line commander rejects (unknown option, option without its value,
 * bad value, missing or excess argument, a command group without its subcommand) exits 2 with
 * commander's own message and one hint line. `sandbox exec ID ls -la` is the common case: the
 * command's options are read as sandnode's; the hint shows the line with `--` before it.
 */
import type { Command, CommanderError } from 'commander';
import { EXIT_OK, EXIT_USAGE } from './output';
import { safeLine } from './terminal-safe';

/** commandWords are the command's names from the program down: ["sandnode", "sandbox", "exec"]. */
function commandWords(cmd: Command): string[] {
  const names: string[] = [];
  for (let c: Command | null = cmd; c; c = c.parent) names.unshift(c.name());
  return names;
}

/** commandPath is the command's words from the program down: "sandnode sandbox exec". */
export function commandPath(cmd: Command): string {
  return commandWords(cmd).join(' ');
}

/** argsOf is what follows cmd's own name in argv (the command line after `node main.js`); undefined when its words are not all there. */
export function argsOf(cmd: Command, argv: readonly string[]): readonly string[] | undefined {
  let at = 0;
  for (const w of commandWords(cmd).slice(1)) {
    const i = argv.indexOf(w, at);
    if (i < 0) return undefined;
    at = i + 1;
  }
  return argv.slice(at);
}

/** shellWord quotes an argument for a command line shown to people (single quotes when it needs any). */
export function shellWord(s: string): string {
  return /^[A-Za-z0-9_./:=@%+,-]+$/.test(s) ? s : `'${s.replace(/'/g, `'\\''`)}'`;
}

/**
 * dashDashHint: for the arguments of a command that runs a command line after its first
 * operand (`sandbox exec`'s argv after "exec"), where commander rejected flag as unknown, the
 * same line with `--` put after the first operand, as "sandnode sandbox exec ID -- ls -la";
 * undefined when flag does not come after the first operand or the line already has a `--`
 * (then the flag was meant for sandnode: a plain typo). Options of cmd itself before the
 * first operand (and their values) stay where they are.
 */
export function dashDashHint(cmd: Command, args: readonly string[], flag: string): string | undefined {
  if (args.includes('--')) return undefined;
  const takesValue = new Map<string, boolean>();
  for (const o of cmd.options) {
    for (const f of [o.short, o.long]) if (f) takesValue.set(f, o.required || o.optional);
  }
  let i = 0;
  while (i < args.length && args[i]!.startsWith('-') && args[i] !== '-') i += takesValue.get(args[i]!) ? 2 : 1;
  if (i >= args.length) return undefined;
  const rest = args.slice(i + 1);
  if (!rest.some((a) => a === flag || a.startsWith(`${flag}=`))) return undefined;
  return [...commandWords(cmd), ...[...args.slice(0, i + 1), '--', ...rest].map(shellWord)].join(' ');
}

/** The flag in commander's "error: unknown option '-la'" message. */
const UNKNOWN_OPTION_RE = /unknown option '([^']+)'/;

/**
 * usageHint is the hint line printed under commander's message for err, a CommanderError of
 * cmd; argv is the whole command line after `node main.js`.
 */
export function usageHint(cmd: Command, err: CommanderError, argv: readonly string[]): string {
  const flag = err.code === 'commander.unknownOption' ? UNKNOWN_OPTION_RE.exec(err.message)?.[1] : undefined;
  if (flag && cmd.registeredArguments.some((a) => a.variadic)) {
    const args = argsOf(cmd, argv);
    const line = args ? dashDashHint(cmd, args, flag) : undefined;
    if (line) return `put -- before the command so that its options are not read as sandnode's: ${line}`;
  }
  if (flag && (/^-o/.test(flag) || /^--output(=|$)/.test(flag))) {
    const json = cmd.options.some((o) => o.long === '--json');
    if (cmd.parent) {
      return json
        ? `this command has no -o/--output (read commands have it: sandbox list|get|ps, template list, status); its JSON is --json: ${commandPath(cmd)} --json`
        : `this command has no -o/--output; see: ${commandPath(cmd)} --help`;
    }
    return `-o/--output goes after the command (read commands: sandbox list|get|ps, template list, status), e.g. sandnode status -o json; see: ${commandPath(cmd)} --help`;
  }
  return `see: ${commandPath(cmd)} --help`;
}

/**
 * installUsageErrors makes every command of program exit 2 on a usage error, after
 * commander's message, with the hint from {@link usageHint}; help and --version exit 0.
 * Call it once the program holds all its commands.
 */
export function installUsageErrors(program: Command, argv: readonly string[] = process.argv.slice(2)): void {
  const walk = (cmd: Command): void => {
    cmd.exitOverride((err) => {
      if (err.exitCode === EXIT_OK || err.code === 'commander.helpDisplayed' || err.code === 'commander.version') process.exit(EXIT_OK);
      // commander.help: a command group without its subcommand, whose help was just printed
      if (err.code !== 'commander.help') process.stderr.write(safeLine(`sandnode: ${usageHint(cmd, err, argv)}`));
      process.exit(EXIT_USAGE);
    });
    cmd.commands.forEach(walk);
  };
  walk(program);
}
