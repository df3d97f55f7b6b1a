/**
 * Container mode end to end: N-1 (the latest release in releases.json, from the build cache)
 * -> N (this checkout) -> N-1 in containers laid out by deploy/k8s/base, as `npm run compat`
 * runs it. Without a Docker engine, root or a build it skips naming what is missing; under
 * CI=true (where .ci/run provides them) it fails naming it instead.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describeWith } from '@sandnode/testkit';
import { containerModeMissing, runContainerMode } from './containers';
import { buildRelease, readReleases, workingTreeBuild } from './releases';
import type { Build } from './types';

jest.setTimeout(15 * 60_000);

const missing = containerModeMissing((l) => console.log(l));
let n: Build | undefined;
let old: Build | undefined;
if (!missing.length) {
  try {
    n = workingTreeBuild();
    const releases = readReleases();
    old = buildRelease(releases[releases.length - 1]!);
  } catch (err) {
    missing.push(`the builds (${(err as Error).message.split('\n')[0]})`);
  }
}

describeWith(
  'container mode',
  [],
  () => {
    test('upgrade and rollback in pod-shaped containers', async () => {
      const workDir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-compat-ct-'));
      try {
        const section = await runContainerMode({ builds: { [old!.label]: old!, [n!.label]: n! }, order: [old!.label, n!.label], quick: true, workDir, log: (l) => console.log(l) });
        console.log(`${section.summary}\n${section.markdown ?? ''}\n${JSON.stringify(section.rows, null, 1)}`);
        expect(section.result).toBe('pass');
      } finally {
        rmSync(workDir, { recursive: true, force: true });
      }
    });
  },
  missing,
);
