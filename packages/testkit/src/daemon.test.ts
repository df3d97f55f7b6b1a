import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { startDaemon } from './daemon';
import { useTempDir } from './temp-dir';

const FAKE = path.join(__dirname, '__tests__', 'fake-daemon.cjs');

/** fakeChildren lists live child processes of this jest worker running the fake daemon. */
function fakeChildren(): number[] {
  return readdirSync('/proc')
    .filter((n) => /^\d+$/.test(n))
    .filter((n) => {
      try {
        const stat = readFileSync(`/proc/${n}/stat`, 'utf8');
        const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
        return Number(f[1]) === process.pid && f[0] !== 'Z' && readFileSync(`/proc/${n}/cmdline`, 'utf8').includes('fake-daemon.cjs');
      } catch {
        return false;
      }
    })
    .map(Number);
}

describe('startDaemon', () => {
  const dir = useTempDir('testkit-daemon');
  const sock = () => path.join(dir(), 'd.sock');

  it('waits until GetVersion answers, logs stdout and stderr to a file, stop() ends it with SIGTERM', async () => {
    const d = await startDaemon({ main: FAKE, socket: sock(), env: { FAKE_DAEMON_SOCKET: sock(), FAKE_DAEMON_DELAY_MS: '300', FAKE_DAEMON_SAY: 'hello out' } });
    expect(d.address).toBe(`unix://${sock()}`);
    expect(d.running()).toBe(true);
    expect(d.log()).toContain('hello out');
    expect(d.log()).toContain('fake daemon ready');
    expect(existsSync(d.logFile)).toBe(true);
    expect(await d.stop()).toEqual({ code: 0, signal: null });
    expect(d.running()).toBe(false);
    expect(await d.stop()).toEqual({ code: 0, signal: null }); // stopping again is a no-op
  });

  it('writes the log where told; env undefined removes a var; kill() defaults to SIGKILL', async () => {
    process.env.FAKE_DAEMON_SAY = 'inherited';
    try {
      const logFile = path.join(dir(), 'my.log');
      const d = await startDaemon({ main: FAKE, socket: sock(), logFile, env: { FAKE_DAEMON_SOCKET: sock(), FAKE_DAEMON_SAY: undefined } });
      expect(d.logFile).toBe(logFile);
      expect(readFileSync(logFile, 'utf8')).not.toContain('inherited');
      expect(await d.kill()).toEqual({ code: null, signal: 'SIGKILL' });
    } finally {
      delete process.env.FAKE_DAEMON_SAY;
    }
  });

  it('stop() escalates to SIGKILL after the grace period', async () => {
    const d = await startDaemon({ main: FAKE, socket: sock(), env: { FAKE_DAEMON_SOCKET: sock(), FAKE_DAEMON_IGNORE_TERM: '1' } });
    expect(await d.stop(200)).toEqual({ code: null, signal: 'SIGKILL' });
  });

  it('a daemon that exits at start fails with its exit and log', async () => {
    await expect(startDaemon({ main: FAKE, socket: sock(), env: { FAKE_DAEMON_EXIT: '3', FAKE_DAEMON_SAY: 'bad config' } })).rejects.toThrow(
      /fake-daemon\.cjs exited at start \(\{"code":3,"signal":null\}\); log:\nbad config/,
    );
  });

  it('a daemon not ready in time fails naming the socket, with its log, and is killed', async () => {
    const err = (await startDaemon({ main: FAKE, socket: sock(), readyTimeoutMs: 2000, env: { FAKE_DAEMON_SOCKET: sock(), FAKE_DAEMON_DELAY_MS: '60000', FAKE_DAEMON_SAY: 'slow' } }).catch(
      (e: unknown) => e,
    )) as Error;
    expect(err.message).toMatch(new RegExp(`timed out after 2000 ms waiting for fake-daemon\\.cjs to answer GetVersion on ${sock()}.*; log:\\nslow`, 's'));
    expect(fakeChildren()).toEqual([]);
  });

  it('kills, in an afterAll, a daemon the test file never stopped (child jest)', () => {
    const root = path.resolve(__dirname, '..', '..', '..');
    const pidFile = path.join(dir(), 'pid');
    const config = {
      rootDir: root,
      roots: ['<rootDir>/packages/testkit/src/__tests__'],
      testMatch: ['**/daemon-forgot-probe.ts'],
      transform: { '^.+\\.ts$': ['ts-jest', { tsconfig: '<rootDir>/tsconfig.json' }] },
      testEnvironment: 'node',
      moduleNameMapper: {
        '^@sandnode/shared/proto/(.*)$': '<rootDir>/packages/shared/src/gen/sandnode/$1',
        '^@sandnode/shared$': '<rootDir>/packages/shared/src/index.ts',
      },
    };
    const r = spawnSync(process.execPath, [require.resolve('jest/bin/jest'), '--config', JSON.stringify(config), '--ci'], {
      cwd: root,
      env: { ...process.env, PROBE_DIR: dir(), PROBE_PID_FILE: pidFile },
      encoding: 'utf8',
      timeout: 90_000,
    });
    expect({ status: r.status, out: r.status === 0 ? '' : r.stderr }).toEqual({ status: 0, out: '' });
    const pid = Number(readFileSync(pidFile, 'utf8'));
    expect(pid).toBeGreaterThan(0);
    expect(existsSync(`/proc/${pid}`)).toBe(false);
  });
});
