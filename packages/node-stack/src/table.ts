/** Aligned text tables, how the CLI, the demo and the bench print rows for people. */
import { stripVTControlCharacters } from 'node:util';

/** table renders rows under headers as columns padded to their widest cell, two spaces apart, trailing blanks trimmed. */
export function table(headers: string[], rows: (string | number)[][]): string {
  const cells = [headers, ...rows.map((r) => r.map(String))];
  // widths as shown: colour escapes (terminal.ts paint) take no columns
  const shown = (c: string) => stripVTControlCharacters(c).length;
  const widths = headers.map((_, i) => Math.max(...cells.map((r) => shown(r[i] ?? ''))));
  return cells
    .map((r) =>
      r
        .map((c, i) => c + ' '.repeat(Math.max(0, (widths[i] ?? 0) - shown(c))))
        .join('  ')
        .trimEnd(),
    )
    .join('\n');
}
