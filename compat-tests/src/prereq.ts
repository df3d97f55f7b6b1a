/**
 * What the compat integration tests need on this machine, and the builds they compare. The
 * suites go through testkit's describeWith: a missing part or build skips naming it, and fails
 * under CI=true (`.ci/run` installs the parts, builds the tree and fetches the release commits).
 */
import { PARTS, type Part } from '@sandnode/testkit';
import { buildRelease, readReleases, workingTreeBuild } from './releases';
import type { Build } from './types';

/** The machine parts every compat suite needs (a whole node: runc containers, loop devices with ext4). */
export const COMPAT_PARTS: Part[] = [PARTS.root, PARTS.runc, PARTS.busybox, PARTS.loop, PARTS.e2fsprogs];

/**
 * compatBuilds returns the working tree build (N) and the release build `older` ("latest" =
 * the last in releases.json), built from git if needed, with `missing` naming what could not
 * be had (a built working tree, the release build: pass it as describeWith's `extra`). When a
 * COMPAT_PARTS part is missing it builds nothing and returns no builds (describeWith names the part).
 */
export function compatBuilds(older: string): { missing: string[]; older?: Build; n?: Build } {
  const out: { missing: string[]; older?: Build; n?: Build } = { missing: [] };
  if (COMPAT_PARTS.some((p) => !p.present())) return out;
  try {
    out.n = workingTreeBuild();
  } catch (err) {
    out.missing.push(`a built working tree (${(err as Error).message})`);
  }
  try {
    const releases = readReleases();
    const r = older === 'latest' ? releases[releases.length - 1] : releases.find((x) => x.version === older);
    if (!r) throw new Error(`releases.json lists no ${older === 'latest' ? 'release' : older}`);
    out.older = buildRelease(r);
  } catch (err) {
    out.missing.push(`the ${older} release build (${(err as Error).message.split('\n')[0]})`);
  }
  return out;
}
