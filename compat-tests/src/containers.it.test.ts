/**
 * Container mode end to end: N-1 (the latest release in releases.json, from the build cache)
 * -> N (this checkout) -> N-1 in Docker containers laid out by deploy/k8s/base, as
 * `npm run compat` runs it. Skips, naming what is missing, when
 * no Docker engine can run, when not root, or when a build is missing.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { dockerMissing, runContainerMode } from './containers';
import { buildRelease, readReleases, workingTreeBuild } from './releases';
import type { Build } from './types';

jest.setTimeout(15 * 60_000);

test('container mode: upgrade and rollback in pod-shaped containers', async () => {
  const why: string[] = [];
  const missing = await dockerMissing();
  if (missing) why.push(missing);
  if (process.getuid?.() !== 0) why.push('not root');
  let n: Build | undefined;
  let old: Build | undefined;
  try {
    n = workingTreeBuild();
    const releases = readReleases();
    old = buildRelease(releases[releases.length - 1]!);
  } catch (err) {
    why.push(`builds: ${(err as Error).message.split('\n')[0]}`);
  }
  if (why.length || !n || !old) {
    console.warn(`container mode skipped: ${why.join('; ')}`);
    return;
  }
  const workDir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-compat-ct-'));
  try {
    const section = await runContainerMode({ builds: { [old.label]: old, [n.label]: n }, order: [old.label, n.label], quick: true, workDir, log: (l) => console.log(l) });
    console.log(`${section.summary}\n${section.markdown ?? ''}\n${JSON.stringify(section.rows, null, 1)}`);
    expect(section.result).toBe('pass');
  } finally {
    rmSync(workDir, { recursive: true, force: true });
  }
});
