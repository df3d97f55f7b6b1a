/**
 * Terminal-safe text: every string the CLI prints may have been chosen by a sandbox (a file
 * name in `cp`/`ls`, a process's argv in `ps`, an error detail of podd, a console line) or by
 * a hostile server, and a terminal obeys the control sequences in it: ESC[2J clears the
 * screen, OSC 52 writes the clipboard, OSC 0 retitles the window, CR and backspace hide what
 * came before on the line, and C1 CSI (U+009B) is ESC[ for terminals that take 8-bit controls.
 * So the CLI's output paths (output.ts print/formatError, output-format.ts render, the
 * warning lines of the commands) pass what they write through one of these, the way
 * less(1) shows control characters (and `ls -b`, git's sanitized progress lines):
 *
 * - {@link terminalSafe} for people: C0 (U+0000–U+001F) except newline and tab, DEL (U+007F)
 *   and C1 (U+0080–U+009F, as code points) become `\xNN`.
 * - {@link jsonSafe} for `--json` / `-o json` text: JSON.stringify escapes C0 already but
 *   not DEL and C1; they become `\u00NN`, so the document is the same JSON value.
 * - {@link yamlSafe} for `-o yaml` text: the yaml package writes a string with DEL/C1 in
 *   double quotes but leaves them raw; they become the YAML escape `\xNN` (same value).
 *
 * The bytes of `sandbox exec` stdout/stderr and of files copied out are data, not messages:
 * they are written as they are (like `docker exec`, `cat`).
 */

/** What a terminal acts on: C0 but newline and tab, DEL, C1. */
// eslint-disable-next-line no-control-regex
const TERMINAL_CONTROLS = /[\x00-\x08\x0b-\x1f\x7f-\x9f]/g;
/** What JSON.stringify leaves raw that a terminal acts on: DEL and C1. */
const RAW_IN_JSON = /[\x7f-\x9f]/g;

const hex2 = (c: string) => c.charCodeAt(0).toString(16).padStart(2, '0');

/** terminalSafe is text with every control character a terminal acts on (not \n, \t) written as `\xNN`. */
export function terminalSafe(text: string): string {
  return text.replace(TERMINAL_CONTROLS, (c) => `\\x${hex2(c)}`);
}

/** jsonSafe is JSON text (as JSON.stringify writes it) with DEL and C1 written as `\u00NN`: the same JSON value. */
export function jsonSafe(json: string): string {
  return json.replace(RAW_IN_JSON, (c) => `\\u00${hex2(c)}`);
}

/**
 * yamlSafe is YAML text (as the yaml package writes it) with the control characters it leaves
 * raw written as `\xNN`: yaml puts every string holding one in double quotes, where `\xNN`
 * is the same character.
 */
export const yamlSafe: (yaml: string) => string = terminalSafe;

/** safeLine is terminalSafe(line) + "\n" for stderr notes that carry text from elsewhere (one place for the newline). */
export function safeLine(line: string): string {
  return `${terminalSafe(line)}\n`;
}
