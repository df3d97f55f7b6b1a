/**
 * A reduced matrix as an integration test: two mixed cells (server N with the rest N-1, and
 * server N-1 with the rest N) and the upgrade/rollback run N-1 -> N -> N-1, on real processes.
 * Skips naming what is missing (root, runc, busybox-static, loop devices, e2fsprogs, a built
 * working tree, or a release build that cannot be made); fails instead under CI=true.
 */
import { describeAssignment, runCell } from './matrix';
import { describeWith } from '@sandnode/testkit';
import { COMPAT_PARTS, compatBuilds } from './prereq';
import type { Assignment, Build } from './types';
import { runUpgradeRun } from './upgrade-run';

jest.setTimeout(15 * 60_000);

const pre = compatBuilds('latest');

describeWith(
  'compat matrix (reduced): N/N-1 cells and the upgrade/rollback run',
  COMPAT_PARTS,
  () => {
    const older = pre.older as Build;
    const n = pre.n as Build;
    const builds = (): Record<string, Build> => ({ [older.label]: older, N: n });
    const cells: Assignment[] = [
      { server: 'N', 'vmm-supervisor': '', 'ublk-manager': '', podd: '' },
      { server: '', 'vmm-supervisor': 'N', 'ublk-manager': 'N', podd: 'N' },
    ].map((a) => Object.fromEntries(Object.entries(a).map(([k, v]) => [k, v || (pre.older?.label ?? 'N-1')])) as Assignment); // named even when skipped

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
  },
  pre.missing,
);
