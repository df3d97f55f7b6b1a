/**
 * What the CLI shows only to a person at a terminal: colour and progress. Colour is used only
 * when the stream is a TTY and NO_COLOR is not set (https://no-color.org: any value, even
 * empty, turns it off); progress goes to stderr only when stderr is a TTY and the command does
 * not print a document (--json, -o json|yaml). Piped output is never changed by either.
 */
import { styleText } from 'node:util';
import { terminalSafe } from './terminal-safe';

/** The styles the CLI uses (node:util styleText names). */
export type Style = 'green' | 'red' | 'yellow' | 'bold' | 'dim';

/** A stream the CLI may colour or draw progress on. */
export interface TermStream {
  isTTY?: boolean;
  write(s: string): unknown;
}

/** colorOn: whether text written to stream may carry colour (a TTY, and NO_COLOR not set in env). */
export function colorOn(stream: TermStream = process.stdout, env: NodeJS.ProcessEnv = process.env): boolean {
  return stream.isTTY === true && env.NO_COLOR === undefined;
}

/** paint is text in style when {@link colorOn} says so for stream, else text unchanged. */
export function paint(style: Style, text: string, stream: TermStream = process.stdout, env: NodeJS.ProcessEnv = process.env): string {
  // styleText would judge process.stdout (not stream) by itself: the decision is made here
  return colorOn(stream, env) ? styleText(style, text, { validateStream: false }) : text;
}

/** How often a {@link Progress} line is redrawn, ms. */
export const PROGRESS_REDRAW_MS = 250;

/**
 * Progress is one status line on stderr for a long call: `label (12.3 s)` redrawn in place, and
 * lines of finished steps printed above it. Off (every method does nothing) unless stderr is a
 * TTY and `quiet` (the command prints a document) is false.
 */
export class Progress {
  private readonly on: boolean;
  private readonly t0 = Date.now();
  private timer: NodeJS.Timeout | undefined;
  private label: string;

  constructor(
    label: string,
    quiet: boolean,
    private readonly out: TermStream = process.stderr,
  ) {
    this.on = !quiet && out.isTTY === true;
    this.label = label;
    if (this.on) {
      this.draw();
      this.timer = setInterval(() => this.draw(), PROGRESS_REDRAW_MS);
      this.timer.unref();
    }
  }

  /** shown: whether this progress is drawn (stderr is a TTY and not quiet), so its step lines were printed. */
  get shown(): boolean {
    return this.on;
  }

  /** set changes the status line's text. */
  set(label: string): void {
    this.label = label;
    if (this.on) this.draw();
  }

  /** step prints a finished step on a line of its own (above the status line). */
  step(line: string): void {
    if (!this.on) return;
    this.out.write(`\r\x1b[2K${terminalSafe(line)}\n`);
    this.draw();
  }

  /** stop clears the status line; the command's own output follows. */
  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    if (this.on) this.out.write('\r\x1b[2K');
  }

  private draw(): void {
    const s = ((Date.now() - this.t0) / 1000).toFixed(1);
    this.out.write(`\r\x1b[2K${paint('dim', terminalSafe(`${this.label} (${s} s)`), this.out)}`);
  }
}

/** withProgress runs fn with a {@link Progress} of label and stops it however fn ends. */
export async function withProgress<T>(label: string, quiet: boolean, fn: (p: Progress) => Promise<T>): Promise<T> {
  const p = new Progress(label, quiet);
  try {
    return await fn(p);
  } finally {
    p.stop();
  }
}
