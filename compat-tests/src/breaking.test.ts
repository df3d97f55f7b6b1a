/** buf breaking against the releases: clean against each release of releases.json, and a real break is found and named. */
import { cpSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { useTempDir } from '@sandnode/testkit';
import { bufBreaking, runBufBreaking } from './breaking';
import { readReleases, REPO_ROOT } from './releases';
import type { Build } from './types';

describe('buf breaking against the releases', () => {
  const tmp = useTempDir('sandnode-breaking-');
  const releases = readReleases();
  const latest = releases[releases.length - 1]!;

  it.each(releases.map((r) => [r.version, r.commit]))("N's contracts are clean against %s", (version, commit) => {
    const r = bufBreaking(version, commit);
    expect(r.findings).toEqual([]);
    expect(r.status).toBe(0);
  });

  it('finds a field renumbered since the latest release and names it', () => {
    const dir = tmp();
    cpSync(path.join(REPO_ROOT, 'buf.yaml'), path.join(dir, 'buf.yaml'));
    cpSync(path.join(REPO_ROOT, 'proto'), path.join(dir, 'proto'), { recursive: true });
    const f = path.join(dir, 'proto', 'sandnode', 'server', 'v1', 'sandbox.proto');
    const text = readFileSync(f, 'utf8');
    writeFileSync(f, text.replace(/optional SandboxNetworkRequest network = 6;/, 'optional SandboxNetworkRequest network = 60;').replace('string request_id = 5;', 'string request_id = 50;'));
    const r = bufBreaking(latest.version, latest.commit, dir);
    expect(r.status).not.toBe(0);
    expect(r.findings.some((l) => l.includes('sandbox.proto') && l.includes('request_id'))).toBe(true);
  });

  it('runBufBreaking gives one passing row per older build of the run', async () => {
    const builds: Record<string, Build> = Object.fromEntries(releases.map((r) => [r.version, { label: r.version, version: r.version, commit: r.commit, dir: '' }]));
    const s = await runBufBreaking({ builds, order: [...releases.map((r) => r.version), 'N'], quick: true, workDir: tmp(), log: () => undefined });
    expect(s.result).toBe('pass');
    expect(s.rows?.map((x) => x.result)).toEqual(releases.map(() => 'pass'));
  });
});
