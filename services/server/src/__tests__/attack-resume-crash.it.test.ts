/**
 * Attacker finding (fixed): kill -9 of the server while `sandbox resume` boots a DRAINED
 * sandbox, after the VM started and before RUNNING was committed, then `sandnode up`: the
 * record stays DRAINED (pid 0) while its runc container runs on (init + podd, its cgroup,
 * devices mounted, network slot) for good (seen 30 s+ after up; a later resume adopts that VM).
 * Now the next server's adoption stops that VM (disks and slot kept: the resume was never
 * answered), so the record holds, and a retried resume boots the sandbox again.
 */
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { describeNode, killProcesses, serverProcesses, startNode, waitFor, type TestNode } from '@sandnode/testkit';

jest.setTimeout(180_000);

function runcContainers(runDir: string): string[] {
  const r = spawnSync('runc', ['--root', path.join(runDir, 'runc'), 'list', '--format', 'json'], { encoding: 'utf8' });
  return r.status === 0 ? ((JSON.parse(r.stdout || '[]') as { id: string }[] | null) ?? []).map((c) => c.id) : [];
}

describeNode('kill -9 of the server during the resume of a DRAINED sandbox', () => {
  let node: TestNode;
  beforeAll(async () => {
    node = await startNode();
  });
  afterAll(async () => node?.stop());

  it('after up, a DRAINED record has no running container (or the record says RUNNING)', async () => {
    const s = (await node.api.sandboxes.createSandbox({ template: 'base', requestId: 'attack-resume-crash' })).sandbox!;
    const d = node.cli(['drain', '--json']);
    expect(d.status).toBe(0);
    expect(node.cli(['up']).status).toBe(0); // the drain stopped the device manager
    expect(runcContainers(node.dirs.runDir)).not.toContain(s.sandboxId);
    // resume without waiting; kill the server once the container exists
    void node.api.sandboxes.resumeSandbox({ sandboxId: s.sandboxId }).catch(() => undefined);
    await waitFor('the resumed container', () => runcContainers(node.dirs.runDir).includes(s.sandboxId) || undefined, 20_000, 10);
    await killProcesses(serverProcesses(node.dirs.runDir), 0);
    expect(node.cli(['up']).status).toBe(0);
    const api = node.reconnect();
    // give adoption and a few reaper passes
    await new Promise((r) => setTimeout(r, 15_000));
    const rec = (await api.sandboxes.getSandbox({ sandboxId: s.sandboxId })).sandbox!;
    const running = runcContainers(node.dirs.runDir).includes(s.sandboxId);
    expect({ state: rec.state, container: running }).not.toEqual({ state: SandboxState.SANDBOX_STATE_DRAINED, container: true });
    if (running) expect(rec.pid).toBeGreaterThan(0);
    // the resume, retried, boots it again and it runs commands
    const back = (await api.sandboxes.resumeSandbox({ sandboxId: s.sandboxId })).sandbox!;
    expect(back.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    expect(runcContainers(node.dirs.runDir)).toContain(s.sandboxId);
  });
});
