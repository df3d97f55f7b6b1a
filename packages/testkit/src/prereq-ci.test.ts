/**
 * The CI rule of describeWith, end to end: a child jest runs __tests__/prereq-probe.ts (a suite
 * whose one part is missing) and its exit status and output say whether the suite skipped or failed.
 */
import { spawnSync } from 'node:child_process';
import path from 'node:path';

const ROOT = path.resolve(__dirname, '..', '..', '..');

function runProbe(env: Record<string, string | undefined>): { status: number | null; out: string } {
  const config = {
    rootDir: ROOT,
    roots: ['<rootDir>/packages/testkit/src/__tests__'],
    testMatch: ['**/prereq-probe.ts'],
    transform: { '^.+\\.ts$': ['ts-jest', { tsconfig: '<rootDir>/tsconfig.json' }] },
    testEnvironment: 'node',
  };
  const childEnv: NodeJS.ProcessEnv = { ...process.env };
  for (const [k, v] of Object.entries(env)) {
    if (v === undefined) delete childEnv[k];
    else childEnv[k] = v;
  }
  const r = spawnSync(process.execPath, [require.resolve('jest/bin/jest'), '--config', JSON.stringify(config), '--ci', '--colors=false'], {
    cwd: ROOT,
    env: childEnv,
    encoding: 'utf8',
    timeout: 90_000,
  });
  return { status: r.status, out: `${r.stdout}${r.stderr}` };
}

describe('describeWith in a child jest', () => {
  it('skips naming the missing part without CI', () => {
    const r = runProbe({ CI: undefined, PROBE_CI_PROVIDES: '1' });
    expect(r.out).toContain('skipping "probe suite": missing probe-part (apt-get install probe)');
    expect(r.out).toMatch(/Tests:\s+1 skipped, 1 total/);
    expect(r.status).toBe(0);
  });

  it('fails naming the missing part under CI=true when CI provides it', () => {
    const r = runProbe({ CI: 'true', PROBE_CI_PROVIDES: '1' });
    expect(r.out).toContain('missing under CI=true: probe-part (apt-get install probe)');
    expect(r.out).toMatch(/Tests:\s+1 failed, 1 total/);
    expect(r.status).toBe(1);
  });

  it('still skips under CI=true a part CI cannot provide', () => {
    const r = runProbe({ CI: 'true', PROBE_CI_PROVIDES: '0' });
    expect(r.out).toContain('skipping "probe suite": missing probe-part');
    expect(r.status).toBe(0);
  });
});
