/**
 * Node drain (ARCHITECTURE.md section 4 "Drain"; pod deletion / node shutdown): 30 running
 * sandboxes, `sandnode drain --deadline-ms 20000 --concurrency 8 --json` preserves all of them
 * within the deadline (records DRAINED, no sandbox process left, devices kept, device manager
 * stopped); after the device manager starts again every sandbox resumes with its id, metadata
 * and /workspace. Then the pod's pre-stop hook (deploy/prestop.sh) drains the local stack.
 */
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { mapLimit, processState } from '@sandnode/shared';
import { SandboxState, type Sandbox } from '@sandnode/shared/proto/server/v1/sandbox';
import { findRunning, startComponent } from '@sandnode/node-stack';
import { describeNode, startNode, waitFor, type TestNode } from '@sandnode/testkit';

jest.setTimeout(300_000);

const COUNT = 30;
const DEADLINE_MS = 20_000;
const REPO = path.join(__dirname, '..', '..', '..', '..');

interface DrainJson {
  sandboxes: { id: string; outcome: string; resume: string; ms: number; error: string }[];
  durationMs: number;
  deviceManagerStopped: boolean;
}

function runcContainers(runDir: string): string[] {
  const r = spawnSync('runc', ['--root', path.join(runDir, 'runc'), 'list', '--format', 'json'], { encoding: 'utf8' });
  return r.status === 0 ? ((JSON.parse(r.stdout || '[]') as { id: string }[] | null) ?? []).map((c) => c.id) : [];
}

/** backing files of the sandboxes' loop devices attached below root (the ublk-manager's image pool file, `<root>/ublk-manager/pool/`, is no sandbox's device) */
function loopBackingFiles(root: string): string[] {
  const r = spawnSync('losetup', ['--list', '--noheadings', '--output', 'BACK-FILE'], { encoding: 'utf8' });
  return r.stdout
    .split('\n')
    .map((l) => l.trim().replace(/ \(deleted\)$/, ''))
    .filter((l) => l.startsWith(`${root}/`) && !l.startsWith(`${root}/ublk-manager/pool/`));
}

describeNode('node drain', () => {
  let node: TestNode;
  let sandboxes: Sandbox[] = [];

  beforeAll(async () => {
    node = await startNode();
  });
  afterAll(async () => {
    // the device manager must run for the deletes in stop()
    if (node && !findRunning(node.dirs, 'ublk-manager')) await startComponent(node.dirs, 'ublk-manager').catch(() => undefined);
    await node?.stop();
  });

  it(`preserves ${COUNT} running sandboxes within the deadline and resumes each intact`, async () => {
    const { api } = node;
    const t0 = Date.now();
    sandboxes = await mapLimit(
      Array.from({ length: COUNT }, (_, i) => i),
      6,
      async (i) => {
        const s = (await api.sandboxes.createSandbox({ template: 'base', metadata: { drain: String(i), team: 'd' }, requestId: `drain-${i}` })).sandbox!;
        await api.sandboxes.writeFile({ sandboxId: s.sandboxId, path: 'before-drain.txt', data: Buffer.from(`sandbox ${i} ${s.sandboxId}`) });
        return s;
      },
    );
    console.log(`${COUNT} sandboxes created in ${Date.now() - t0} ms`);
    const images = loopBackingFiles(node.dirs.stateDir);
    expect(images).toHaveLength(2 * COUNT);

    const r = node.cli(['drain', '--deadline-ms', String(DEADLINE_MS), '--concurrency', '8', '--json']);
    expect({ status: r.status, stderr: r.stderr }).toEqual({ status: 0, stderr: '' });
    const drained = JSON.parse(r.stdout) as DrainJson;
    const slowest = Math.max(...drained.sandboxes.map((s) => s.ms));
    console.log(`drain: ${drained.sandboxes.length} sandboxes in ${drained.durationMs} ms (slowest ${slowest} ms); device manager stopped: ${drained.deviceManagerStopped}`);
    expect(drained.sandboxes.map((s) => s.id).sort()).toEqual(sandboxes.map((s) => s.sandboxId).sort());
    for (const s of drained.sandboxes) expect({ id: s.id, outcome: s.outcome, resume: s.resume, error: s.error }).toEqual({ id: s.id, outcome: 'PRESERVED', resume: 'cold-start', error: '' });
    expect(drained.durationMs).toBeLessThanOrEqual(DEADLINE_MS);
    expect(drained.deviceManagerStopped).toBe(true);

    // records DRAINED; no sandbox process or container left; the devices and images stay
    for (const s of sandboxes) {
      const now = (await api.sandboxes.getSandbox({ sandboxId: s.sandboxId })).sandbox!;
      expect([now.sandboxId, now.state]).toEqual([s.sandboxId, SandboxState.SANDBOX_STATE_DRAINED]);
      expect([undefined, 'Z']).toContain(processState(s.pid));
    }
    expect(runcContainers(node.dirs.runDir)).toEqual([]);
    await waitFor('ublk-manager to exit after the drain', () => !findRunning(node.dirs, 'ublk-manager'), 15_000, 100);
    expect(loopBackingFiles(node.dirs.stateDir).sort()).toEqual([...images].sort());
    for (const f of images) expect(existsSync(f)).toBe(true);

    // the device manager starts again; every sandbox resumes on its own disks
    await startComponent(node.dirs, 'ublk-manager');
    const t1 = Date.now();
    const resumed = await mapLimit(sandboxes, 6, async (s) => (await api.sandboxes.resumeSandbox({ sandboxId: s.sandboxId })).sandbox!);
    console.log(`${COUNT} drained sandboxes resumed in ${Date.now() - t1} ms`);
    for (const [i, s] of resumed.entries()) {
      expect(s.sandboxId).toBe(sandboxes[i]!.sandboxId);
      expect(s.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
      expect(s.metadata).toEqual({ drain: String(i), team: 'd' });
      expect(s.pid).toBeGreaterThan(0);
      const f = await api.sandboxes.readFile({ sandboxId: s.sandboxId, path: '/workspace/before-drain.txt' });
      expect(Buffer.from(f.data).toString()).toBe(`sandbox ${i} ${s.sandboxId}`);
    }
    expect(runcContainers(node.dirs.runDir)).toHaveLength(COUNT);
  });

  it('drains the local stack through the pre-stop hook (deploy/prestop.sh), exit 0, reporting every sandbox preserved', async () => {
    const r = spawnSync('bash', [path.join(REPO, 'deploy', 'prestop.sh'), 'drain'], {
      encoding: 'utf8',
      timeout: 120_000,
      env: {
        PATH: `${path.dirname(process.execPath)}:${process.env.PATH ?? '/usr/bin:/bin'}`,
        SANDNODE_RUN_DIR: node.dirs.runDir,
        SANDNODE_STATE_DIR: node.dirs.stateDir,
        SANDNODE_PRESTOP_DEADLINE_S: '40',
        SANDNODE_GRACE_PERIOD_S: '60',
      },
    });
    console.log(`prestop.sh exit ${r.status}:\n${r.stderr}`);
    expect(r.status).toBe(0);
    expect(r.stderr).toContain(`preserved ${COUNT}, failed 0 of ${COUNT} sandboxes; device manager stopped: yes`);
    expect(r.stderr).not.toMatch(/ERROR|DRAIN INCOMPLETE/);
    const api = node.reconnect();
    const all = (await api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes;
    expect(all).toHaveLength(COUNT);
    for (const s of all) expect(s.state).toBe(SandboxState.SANDBOX_STATE_DRAINED);
    expect(runcContainers(node.dirs.runDir)).toEqual([]);
  });

  it('with a deadline too short for all, reports each sandbox as it really ended (none lost, none misreported)', async () => {
    // bring the drained sandboxes back first: the drain stopped ublk-manager (SIGTERM); wait
    // until it is gone, then start it as an operator would
    await waitFor('ublk-manager to be gone', () => !findRunning(node.dirs, 'ublk-manager'), 10_000, 50);
    await startComponent(node.dirs, 'ublk-manager');
    const api = node.reconnect();
    const all = (await api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes;
    await mapLimit(all, 6, (s) => api.sandboxes.resumeSandbox({ sandboxId: s.sandboxId }));
    const r = node.cli(['drain', '--deadline-ms', '150', '--concurrency', '2', '--json']);
    const out = JSON.parse(r.stdout) as { sandboxes: { id: string; outcome: string; error: string }[] };
    expect(out.sandboxes).toHaveLength(all.length);
    const preserved = out.sandboxes.filter((x) => x.outcome === 'PRESERVED');
    const failed = out.sandboxes.filter((x) => x.outcome === 'FAILED');
    expect(failed.length).toBeGreaterThan(0); // 150 ms cannot drain 30 sandboxes two at a time
    expect(r.status).toBe(1);
    // the time under test: for 1 s after the report, nothing finishes behind its back
    await new Promise((res) => setTimeout(res, 1000));
    for (const x of preserved) expect((await api.sandboxes.getSandbox({ sandboxId: x.id })).sandbox!.state).toBe(SandboxState.SANDBOX_STATE_DRAINED);
    for (const x of failed) {
      expect(x.error).toMatch(/not reached before the drain deadline/);
      expect((await api.sandboxes.getSandbox({ sandboxId: x.id })).sandbox!.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    }
  });
});
