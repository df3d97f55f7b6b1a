/** Where `npm run bench` writes its results: `<repo>/bench/results/<name>.json`. */
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { benchReportHtml } from './report';

/**
 * writeBenchResults writes results as `bench/results/<name>.json` (pretty JSON) and, beside it,
 * the HTML report of those results (`<name>.html`, report.ts); returns the JSON's path.
 */
export function writeBenchResults(name: string, results: Record<string, unknown>): string {
  const outDir = path.resolve(__dirname, '..', '..', '..', 'bench', 'results');
  mkdirSync(outDir, { recursive: true });
  const out = path.join(outDir, `${name}.json`);
  writeFileSync(out, `${JSON.stringify(results, null, 2)}\n`);
  writeFileSync(path.join(outDir, `${name}.html`), benchReportHtml(results, `${name}.json`));
  return out;
}

/** samples rounds raw samples to 0.01 (their unit kept) so the JSON stays readable; the HTML report plots them (report.ts). */
export function samples(xs: readonly number[]): number[] {
  return xs.map((x) => Math.round(x * 100) / 100);
}

/** Spread of one figure over its repetitions (rounds or samples), same unit as the figure. */
export interface Spread {
  n: number;
  min: number;
  p50: number;
  max: number;
  /** "min–max (n=N)", what the table's SPREAD column shows */
  text: string;
}

/** spreadOf summarises xs (NaN entries dropped); n=0 gives NaNs and text "-". */
export function spreadOf(xs: readonly number[]): Spread {
  const s = xs.filter((x) => !Number.isNaN(x)).sort((a, b) => a - b);
  const r1 = (x: number) => Math.round(x * 10) / 10;
  if (s.length === 0) return { n: 0, min: NaN, p50: NaN, max: NaN, text: '-' };
  const min = r1(s[0] as number);
  const max = r1(s[s.length - 1] as number);
  return { n: s.length, min, p50: r1(s[Math.floor(s.length / 2)] as number), max, text: `${min}–${max} (n=${s.length})` };
}
