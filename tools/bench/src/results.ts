/** Where `npm run bench` writes its results: `<repo>/bench/results/<name>.json`. */
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';

/** writeBenchResults writes results as `bench/results/<name>.json` (pretty JSON) and returns the path. */
export function writeBenchResults(name: string, results: unknown): string {
  const outDir = path.resolve(__dirname, '..', '..', '..', 'bench', 'results');
  mkdirSync(outDir, { recursive: true });
  const out = path.join(outDir, `${name}.json`);
  writeFileSync(out, `${JSON.stringify(results, null, 2)}\n`);
  return out;
}
