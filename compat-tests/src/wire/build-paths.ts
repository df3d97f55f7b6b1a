/**
 * The one place that knows where the wire tests find things inside a build's tree.
 *
 * The working tree is moving `shared/` to `packages/shared/`; release builds keep the layout
 * they were cut with. Every path is tried in the new layout first, then the old one.
 */
import { existsSync } from 'node:fs';
import path from 'node:path';
import type { Build } from '../releases';

/** The layouts of the shared package, newest first (relative to a build's root). */
const SHARED_DIRS = [path.join('packages', 'shared'), 'shared'];

/**
 * sharedPath is `<b.dir>/<shared package>/<rel>`: the first layout in which it exists, else the
 * newest layout's path (so an error names where it was expected).
 */
export function sharedPath(b: Build, rel: string): string {
  const candidates = SHARED_DIRS.map((d) => path.join(b.dir, d, rel));
  return candidates.find((p) => existsSync(p)) ?? candidates[0]!;
}

/** descriptorPath is the build's `buf build` output (a binary FileDescriptorSet). */
export function descriptorPath(b: Build): string {
  return sharedPath(b, path.join('descriptor', 'sandnode.binpb'));
}

/** genDir is the build's compiled ts-proto modules (`sandnode/<pkg>/v1/<file>.js` below it). */
export function genDir(b: Build): string {
  return sharedPath(b, path.join('dist', 'gen'));
}

/** missingParts names every part a build lacks for the wire tests (empty when complete). */
export function missingParts(b: Build): string[] {
  const out: string[] = [];
  const tried = (rel: string) => SHARED_DIRS.map((d) => path.join(b.dir, d, rel)).join(' or ');
  if (!existsSync(descriptorPath(b))) out.push(`build ${b.label} lacks its descriptor set (${tried(path.join('descriptor', 'sandnode.binpb'))})`);
  if (!existsSync(genDir(b))) out.push(`build ${b.label} lacks its generated modules (${tried(path.join('dist', 'gen'))})`);
  return out;
}

/** ciStrict says whether a missing part must fail instead of being reported as skipped (CI=true). */
export function ciStrict(env: NodeJS.ProcessEnv = process.env): boolean {
  return env.CI === 'true' || env.CI === '1';
}
