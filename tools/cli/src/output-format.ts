/**
 * `-o json|yaml|wide` of the read commands, beside the `--json` they had before.
 *
 * - `--json` prints what it always printed (the CLI's snake_case view: `SandboxJson`, ...;
 *   scripts use it and its fields are only ever added).
 * - `-o json` prints the proto JSON mapping of the response message (ts-proto `toJSON`:
 *   lowerCamelCase field names, enums by name, int64 as strings, default values left out), the
 *   same shape grpcurl prints. A command whose answer is made of several calls (`status`) has
 *   no one message: its `-o json` is its `--json` document.
 * - `-o yaml` is the `-o json` document as YAML (npm `yaml`).
 * - `-o wide` is the table with more columns.
 *
 * Errors of a command given `--json`, `-o json` or `-o yaml` are one JSON line on stderr that
 * keeps the gRPC code (output.ts formatError).
 */
import { Option, type Command } from 'commander';
import { stringify } from 'yaml';
import { UsageError, jsonText } from './output';
import { jsonSafe, terminalSafe, yamlSafe } from './terminal-safe';

/** The formats `-o` takes. */
export const OUTPUT_FORMATS = ['json', 'yaml', 'wide'] as const;
/** One of {@link OUTPUT_FORMATS}. */
export type OutputFormat = (typeof OUTPUT_FORMATS)[number];

/** The options {@link addOutputOptions} adds, as commander parses them. */
export interface OutputOpts {
  json?: boolean;
  output?: OutputFormat;
}

/** addOutputOptions gives a read command `--json` (the CLI's JSON, unchanged) and `-o, --output json|yaml|wide`. */
export function addOutputOptions(cmd: Command, jsonHelp = "print JSON (the CLI's fields; see -o json for the proto mapping)"): Command {
  return cmd
    .option('--json', jsonHelp)
    .addOption(new Option('-o, --output <format>', 'json: the proto JSON mapping of the response; yaml: the same as YAML; wide: more columns').choices(OUTPUT_FORMATS));
}

/** What a read command can print; {@link render} picks one. */
export interface Rendering {
  /** the `--json` document */
  json: unknown;
  /** the `-o json` / `-o yaml` document: the response message's proto JSON; default json */
  proto?: () => unknown;
  /** the table or lines for people */
  human: () => string;
  /** the `-o wide` table; default human */
  wide?: () => string;
}

/**
 * renderText is what {@link render} prints for o (newline-terminated), its control characters
 * escaped the way the format allows (terminal-safe.ts: the names and argv in it are a
 * sandbox's). UsageError when `--json` and a `-o` other than json are both given.
 */
export function renderText(o: OutputOpts, r: Rendering): string {
  if (o.json && o.output && o.output !== 'json') throw new UsageError(`give either --json or -o ${o.output}, not both`);
  if (o.output === 'json') return `${jsonSafe(r.proto ? JSON.stringify(r.proto(), null, 2) : jsonText(r.json))}\n`;
  if (o.output === 'yaml') return yamlSafe(stringify(r.proto ? r.proto() : r.json === undefined ? r.json : JSON.parse(jsonText(r.json))));
  if (o.json) return `${jsonSafe(jsonText(r.json))}\n`;
  if (o.output === 'wide') return `${terminalSafe((r.wide ?? r.human)())}\n`;
  return `${terminalSafe(r.human())}\n`;
}

/** render writes a read command's result to stdout in the format o asks for ({@link renderText}). */
export function render(o: OutputOpts, r: Rendering): void {
  process.stdout.write(renderText(o, r));
}
