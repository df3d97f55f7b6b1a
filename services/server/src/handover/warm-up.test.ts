import { mkdirSync, mkdtempSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import os from 'node:os';
import path from 'node:path';
import { sweepWarmUpDirs } from './warm-up';

/** a pid that ran and is gone (a child that exited and was reaped) */
function deadPid(): number {
  const r = spawnSync('true');
  return r.pid!;
}

describe('sweepWarmUpDirs', () => {
  let runDir: string;
  beforeEach(() => {
    runDir = mkdtempSync(path.join(os.tmpdir(), 'warm-sweep-'));
  });
  afterEach(() => rmSync(runDir, { recursive: true, force: true }));

  it('removes the dirs of servers killed in their warm-up and of the old unnamed form, keeps live ones', () => {
    const dead = `warm-${deadPid()}-abc123`;
    const live = `warm-${process.pid}-def456`;
    for (const d of [dead, live, 'warm-Zx81Qa']) {
      mkdirSync(path.join(runDir, d));
      writeFileSync(path.join(runDir, d, 's.sock'), '');
    }
    mkdirSync(path.join(runDir, 'records'));
    expect(sweepWarmUpDirs(runDir).sort()).toEqual([dead, 'warm-Zx81Qa'].sort());
    expect(readdirSync(runDir).sort()).toEqual([live, 'records'].sort());
  });

  it('never follows a symlink named like a warm-up dir', () => {
    const outside = mkdtempSync(path.join(os.tmpdir(), 'warm-target-'));
    try {
      writeFileSync(path.join(outside, 'keep'), 'x');
      symlinkSync(outside, path.join(runDir, `warm-${deadPid()}-lnk000`));
      expect(sweepWarmUpDirs(runDir)).toEqual([]);
      expect(readdirSync(outside)).toEqual(['keep']);
    } finally {
      rmSync(outside, { recursive: true, force: true });
    }
  });

  it('is quiet when runDir does not exist', () => {
    expect(sweepWarmUpDirs(path.join(runDir, 'nope'))).toEqual([]);
  });
});
