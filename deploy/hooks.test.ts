/**
 * The pod's hooks: deploy/health-probe.js against a real gRPC health server, and
 * deploy/prestop.sh (ARCHITECTURE.md section 4 "Drain") with a fake CLI.
 */
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createServer } from 'nice-grpc';
import { HealthDefinition, HealthServiceImpl, HealthState } from 'nice-grpc-server-health';

const ROOT = path.resolve(__dirname, '..');
const PRESTOP = path.join(ROOT, 'deploy/prestop.sh');
const PROBE = path.join(ROOT, 'deploy/health-probe.js');

// ---------------------------------------------------------------- deploy/health-probe.js

function runAsync(cmd: string, args: string[], env: NodeJS.ProcessEnv = {}): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const p = spawn(cmd, args, { env: { PATH: process.env.PATH, ...env } });
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    p.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    p.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

describe('deploy/health-probe.js', () => {
  let dir: string;
  beforeAll(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-probe-'));
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  test('exits 0 when SERVING, 1 when NOT_SERVING, 1 when nothing listens', async () => {
    const health = HealthState();
    const server = createServer();
    server.add(HealthDefinition, HealthServiceImpl(health));
    const address = `unix://${path.join(dir, 'd.sock')}`;
    await server.listen(address);
    try {
      health.setStatus('healthy');
      expect((await runAsync('node', [PROBE, address])).code).toBe(0);
      health.setStatus('unhealthy');
      const r = await runAsync('node', [PROBE, address]);
      expect(r.code).toBe(1);
      expect(r.stderr).toMatch(/not serving/);
    } finally {
      await server.shutdown();
    }
    const gone = await runAsync('node', [PROBE, `unix://${path.join(dir, 'missing.sock')}`, '--timeout-ms', '1000']);
    expect(gone.code).toBe(1);
    expect(gone.stderr).toMatch(/missing\.sock/);
  });
});

// ---------------------------------------------------------------- deploy/prestop.sh

describe('deploy/prestop.sh', () => {
  let dir: string;
  let fakeCli: string;
  beforeAll(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-prestop-'));
    // a stand-in for `sandnode drain`: FAKE_DRAIN=ok|fail|hang|crash; records its argv
    fakeCli = path.join(dir, 'fake-cli.js');
    writeFileSync(
      fakeCli,
      `const fs = require('fs');
fs.writeFileSync(process.env.FAKE_ARGV, JSON.stringify(process.argv.slice(2)));
const mode = process.env.FAKE_DRAIN;
if (mode === 'hang') setInterval(() => {}, 1000);
else if (mode === 'crash') { process.stderr.write('sandnode: UNAVAILABLE: no server\\n'); process.exit(1); }
else process.stdout.write(JSON.stringify({
  sandboxes: [
    { sandbox_id: 'sb-1', outcome: 'DRAIN_OUTCOME_PRESERVED', resume_method: 'cold-start' },
    ...(mode === 'fail' ? [{ sandbox_id: 'sb-2', outcome: 'DRAIN_OUTCOME_FAILED', error: 'pause timed out' }] : []),
  ],
  duration_ms: 12, device_manager_stopped: true }));
`,
    );
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  function prestop(env: Record<string, string>, mode = 'drain') {
    const run = mkdtempSync(path.join(dir, 'run-'));
    const env2 = {
      PATH: process.env.PATH,
      SANDNODE_RUN_DIR: path.join(run, 'run'),
      SANDNODE_STATE_DIR: path.join(run, 'state'),
      SANDNODE_CLI: `node ${fakeCli}`,
      FAKE_ARGV: path.join(run, 'argv.json'),
      ...env,
    };
    const t0 = Date.now();
    const r = spawnSync('bash', [PRESTOP, mode], { env: env2, encoding: 'utf8', timeout: 30_000 });
    return { ...r, ms: Date.now() - t0, run, argv: existsSync(env2.FAKE_ARGV) ? (JSON.parse(readFileSync(env2.FAKE_ARGV, 'utf8')) as string[]) : undefined };
  }

  test.each([
    ['45', '45'],
    ['60', '45'],
  ])('refuses to start (exit 2, no drain) when the deadline %s >= the grace period %s', (deadline, grace) => {
    const r = prestop({ SANDNODE_PRESTOP_DEADLINE_S: deadline, SANDNODE_GRACE_PERIOD_S: grace });
    expect(r.status).toBe(2);
    expect(r.stderr).toMatch(/refusing to start: SANDNODE_PRESTOP_DEADLINE_S=\d+ must be below SANDNODE_GRACE_PERIOD_S=\d+/);
    expect(r.argv).toBeUndefined();
  });

  test('refuses the default deadline (45 s) against a shorter grace period, and non-numbers', () => {
    expect(prestop({ SANDNODE_GRACE_PERIOD_S: '30' }).status).toBe(2);
    expect(prestop({ SANDNODE_PRESTOP_DEADLINE_S: '4x' }).stderr).toMatch(/SANDNODE_PRESTOP_DEADLINE_S=4x is not a whole number/);
  });

  test('drains with a deadline below its own and reports what was preserved', () => {
    const r = prestop({ SANDNODE_PRESTOP_DEADLINE_S: '20', SANDNODE_GRACE_PERIOD_S: '30', FAKE_DRAIN: 'ok' });
    expect(r.status).toBe(0);
    expect(r.argv?.slice(0, 2)).toEqual(['drain', '--deadline-ms']);
    const ms = Number(r.argv?.[2]);
    expect(ms).toBeGreaterThan(10_000);
    expect(ms).toBeLessThanOrEqual(15_000); // deadline 20 s - margin 5 s
    expect(r.stderr).toMatch(/drain done .*preserved 1, failed 0 of 1 sandboxes; device manager stopped: yes/);
    expect(r.stderr).toMatch(/preserved sb-1 \(resume: cold-start\)/);
    expect(readFileSync(path.join(r.run, 'state', 'prestop.log'), 'utf8')).toMatch(/preserved 1/);
  });

  test('a drain that reports failures exits 0 and says loudly what was lost', () => {
    const r = prestop({ SANDNODE_PRESTOP_DEADLINE_S: '20', SANDNODE_GRACE_PERIOD_S: '30', FAKE_DRAIN: 'fail' });
    expect(r.status).toBe(0);
    expect(r.stderr).toMatch(/ERROR: !!! DRAIN INCOMPLETE: the drain reported failures/);
    expect(r.stderr).toMatch(/FAILED {4}sb-2: pause timed out/);
  });

  test('a failing CLI exits 0 with its error logged', () => {
    const r = prestop({ SANDNODE_PRESTOP_DEADLINE_S: '20', SANDNODE_GRACE_PERIOD_S: '30', FAKE_DRAIN: 'crash' });
    expect(r.status).toBe(0);
    expect(r.stderr).toMatch(/DRAIN INCOMPLETE: the drain command failed \(exit 1\)/);
    expect(r.stderr).toMatch(/drain stderr: sandnode: UNAVAILABLE: no server/);
  });

  test('a drain that hangs is killed before the deadline and the hook exits 0', () => {
    const r = prestop({ SANDNODE_PRESTOP_DEADLINE_S: '4', SANDNODE_GRACE_PERIOD_S: '10', SANDNODE_PRESTOP_MARGIN_S: '1', FAKE_DRAIN: 'hang' });
    expect(r.status).toBe(0);
    expect(r.ms).toBeLessThan(4_500);
    expect(r.stderr).toMatch(/DRAIN INCOMPLETE: the drain did not return within \ds and was killed \(exit 124\)/);
  });

  test('a second drain during the same stop (the other server slot) does not drain again', () => {
    const first = prestop({ SANDNODE_PRESTOP_DEADLINE_S: '20', SANDNODE_GRACE_PERIOD_S: '30', FAKE_DRAIN: 'ok' });
    rmSync(path.join(first.run, 'argv.json'));
    const r = spawnSync('bash', [PRESTOP, 'drain'], {
      env: {
        PATH: process.env.PATH,
        SANDNODE_RUN_DIR: path.join(first.run, 'run'),
        SANDNODE_STATE_DIR: path.join(first.run, 'state'),
        SANDNODE_CLI: `node ${fakeCli}`,
        FAKE_ARGV: path.join(first.run, 'argv.json'),
        SANDNODE_PRESTOP_DEADLINE_S: '20',
        SANDNODE_GRACE_PERIOD_S: '30',
      },
      encoding: 'utf8',
    });
    expect(r.status).toBe(0);
    expect(r.stderr).toMatch(/another server slot already drained/);
    expect(existsSync(path.join(first.run, 'argv.json'))).toBe(false);
  });

  test('wait returns once the drain is done, and soon when nobody drains', () => {
    const first = prestop({ SANDNODE_PRESTOP_DEADLINE_S: '20', SANDNODE_GRACE_PERIOD_S: '30', FAKE_DRAIN: 'ok' });
    const env = {
      PATH: process.env.PATH,
      SANDNODE_RUN_DIR: path.join(first.run, 'run'),
      SANDNODE_STATE_DIR: path.join(first.run, 'state'),
      SANDNODE_PRESTOP_DEADLINE_S: '20',
      SANDNODE_GRACE_PERIOD_S: '30',
    };
    const done = spawnSync('bash', [PRESTOP, 'wait'], { env, encoding: 'utf8' });
    expect(done.status).toBe(0);
    expect(done.stderr).toMatch(/drain finished after \d+s: .*preserved 1/);

    const old = new Date(Date.now() - 3600_000);
    utimesSync(path.join(first.run, 'run', 'prestop.done'), old, old); // an old drain does not count
    const t0 = Date.now();
    const none = spawnSync('bash', [PRESTOP, 'wait'], { env, encoding: 'utf8' });
    expect(none.status).toBe(0);
    expect(none.stderr).toMatch(/no drain is running/);
    expect(Date.now() - t0).toBeLessThan(8_000);
  });
});
