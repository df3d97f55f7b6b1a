/**
 * Adversarial finding (issue 11, two operators at once): two `sandnode up` processes on the same
 * fresh dirs at the same time. Seen on a real node, 2 of 2 tries: one exits 0 and lists all
 * three components as running ("already running" for those the other one started); the other
 * fails (its ublk-manager or server finds the slot taken) and "undoes" by stopping the
 * vmm-supervisor (and ublk-manager) it started, which the first `up` had just reported. The node
 * is left without a vmm-supervisor although an `up` succeeded. When an `up` exits 0, every
 * component must run afterwards. Also seen: both exit 1, and a ublk-manager whose pid file the
 * failing `up` removed keeps running unseen by `down` (an orphan holding the slot lock).
 */
import { spawn } from 'node:child_process';
import { rmSync } from 'node:fs';
import path from 'node:path';
import { COMPONENTS, findRunning, purgeNode, sandnodeProcesses, stopComponent } from '@sandnode/node-stack';
import { describeNode, killProcesses, makeTempDir } from '@sandnode/testkit';

jest.setTimeout(400_000);

function up(dirs: { stateDir: string; runDir: string }): Promise<number> {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, [require.resolve('@sandnode/cli/dist/main.js'), '--state-dir', dirs.stateDir, '--run-dir', dirs.runDir, '--listen', '', 'up'], { stdio: 'ignore' });
    p.on('exit', (code) => resolve(code ?? -1));
  });
}

describeNode('two `sandnode up` at once', () => {
  const dirs = { stateDir: '', runDir: '', listen: '' };
  afterEach(async () => {
    for (const c of [...COMPONENTS].reverse()) await stopComponent(dirs, c);
    // a daemon whose pid file the other `up` removed (seen: an orphan ublk-manager) is found by its run dir
    await killProcesses(sandnodeProcesses(dirs.runDir).map((p) => p.pid));
    await purgeNode(dirs);
    rmSync(path.dirname(dirs.runDir), { recursive: true, force: true });
  });

  it.each([1, 2, 3])('on fresh dirs (try %i): when one exits 0, every component runs', async () => {
    const root = makeTempDir('attack-parallel-up');
    Object.assign(dirs, { stateDir: path.join(root, 'state'), runDir: path.join(root, 'run') });
    const codes = await Promise.all([up(dirs), up(dirs)]);
    const running = Object.fromEntries(COMPONENTS.map((c) => [c, findRunning(dirs, c) !== undefined]));
    expect({ anyUpSucceeded: codes.includes(0), running }).toEqual({ anyUpSucceeded: true, running: Object.fromEntries(COMPONENTS.map((c) => [c, true])) });
  });
});
