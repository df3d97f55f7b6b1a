/**
 * What the compat integration tests need on this machine, and the builds they compare.
 */
import { existsSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { buildRelease, readReleases, workingTreeBuild } from './releases';
import type { Build } from './types';

/**
 * compatBuilds returns the working tree build (N) and the release build `older` ("latest" =
 * the last in releases.json), built from git if needed, or the list of what is missing: root,
 * runc, busybox-static, loop devices, a built working tree, the release build.
 */
export function compatBuilds(older: string): { missing: string[]; older?: Build; n?: Build } {
  const missing: string[] = [];
  if (process.getuid?.() !== 0) missing.push('root');
  if (spawnSync('runc', ['--version']).status !== 0) missing.push('runc (apt-get install runc)');
  if (!existsSync('/bin/busybox')) missing.push('busybox-static (apt-get install busybox-static)');
  if (!existsSync('/dev/loop-control')) missing.push('/dev/loop-control (loop devices)');
  if (missing.length) return { missing };
  const out: { missing: string[]; older?: Build; n?: Build } = { missing };
  try {
    out.n = workingTreeBuild();
  } catch (err) {
    missing.push(`a built working tree (${(err as Error).message})`);
  }
  try {
    const releases = readReleases();
    const r = older === 'latest' ? releases[releases.length - 1] : releases.find((x) => x.version === older);
    if (!r) throw new Error(`releases.json lists no ${older === 'latest' ? 'release' : older}`);
    out.older = buildRelease(r);
  } catch (err) {
    missing.push(`the ${older} release build (${(err as Error).message.split('\n')[0]})`);
  }
  return out;
}
