/**
 * A reduced matrix as an integration test: two mixed cells (server N with the rest N-1, and
 * server N-1 with the rest N) and the upgrade/rollback run N-1 -> N -> N-1, on real processes.
 * Skips naming what is missing: root, runc, busybox-static, loop devices, a built working
 * tree, or a release build that cannot be made.
 */
import { existsSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { describeAssignment, runCell } from './matrix';
import { buildRelease, readReleases, workingTreeBuild } from './releases';
import type { Assignment, Build } from './types';
import { runUpgradeRun } from './upgrade-run';

jest.setTimeout(15 * 60_000);

/** prerequisites returns the builds (N-1, N) or what is missing. */
function prerequisites(): { missing: string[]; older?: Build; n?: Build } {
  const missing: string[] = [];
  if (process.getuid?.() !== 0) missing.push('root');
  if (spawnSync('runc', ['--version']).status !== 0) missing.push('runc (apt-get install runc)');
  if (!existsSync('/bin/busybox')) missing.push('busybox-static (apt-get install busybox-static)');
  if (!existsSync('/dev/loop-control')) missing.push('/dev/loop-control (loop devices)');
  if (missing.length) return { missing };
  let n: Build | undefined;
  try {
    n = workingTreeBuild();
  } catch (err) {
    missing.push(`a built working tree (${(err as Error).message})`);
  }
  let older: Build | undefined;
  try {
    const releases = readReleases();
    const latest = releases[releases.length - 1];
    if (!latest) throw new Error('releases.json lists no release');
    older = buildRelease(latest);
  } catch (err) {
    missing.push(`a release build (${(err as Error).message.split('\n')[0]})`);
  }
  return { missing, older, n };
}

const pre = prerequisites();
const suite = pre.missing.length ? describe.skip : describe;
if (pre.missing.length) {
  // eslint-disable-next-line no-console
  console.warn(`skipping "compat matrix": missing ${pre.missing.join(', ')}`);
}

suite('compat matrix (reduced): N/N-1 cells and the upgrade/rollback run', () => {
  const older = pre.older as Build;
  const n = pre.n as Build;
  const builds = (): Record<string, Build> => ({ [older.label]: older, N: n });
  const cells: Assignment[] = [
    { server: 'N', 'vmm-supervisor': '', 'ublk-manager': '', podd: '' },
    { server: '', 'vmm-supervisor': 'N', 'ublk-manager': 'N', podd: 'N' },
  ].map((a) => Object.fromEntries(Object.entries(a).map(([k, v]) => [k, v || older.label])) as Assignment);

  for (const a of cells) {
    it(`cell ${describeAssignment(a)} passes`, async () => {
      const cell = await runCell(a, builds(), n);
      const failed = cell.scenarios.filter((s) => s.result === 'fail').map((s) => `${s.name}: ${s.grpcStatus ?? ''} ${s.detail}\n${s.logExcerpt ?? ''}`);
      expect(failed).toEqual([]);
      expect(cell.result).not.toBe('fail');
      expect(cell.scenarios.find((s) => s.name === 'fork')?.result).toMatch(/^(n\/a|pass|fallback)$/);
    });
  }

  it('upgrade N-1 -> N and rollback to N-1 keep pids, the exec stream and the records', async () => {
    const run = await runUpgradeRun(older, n, n);
    const failed = run.steps.filter((s) => s.result === 'fail').map((s) => `${s.name}: ${s.detail}`);
    expect(failed).toEqual([]);
    expect(run.result).toBe('pass');
  });
});
