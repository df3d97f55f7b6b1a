/**
 * Attack (issue 10 §2): what code inside a runc sandbox can reach. Seccomp filter on (mode 2),
 * no new namespaces, no mount family, its own cgroup namespace, and a pids limit that stops a
 * fork bomb inside the sandbox while the node keeps serving.
 */
import { readFileSync } from 'node:fs';
import type { ServerApi } from '@sandnode/shared';
import { SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { describeNode, execCollect, expectCode, startNode, type TestNode } from '@sandnode/testkit';
import { Status } from 'nice-grpc-common';

jest.setTimeout(300_000);

async function run(api: ServerApi, id: string, script: string): Promise<{ exitCode: number; stdout: string; stderr: string }> {
  const r = await execCollect(api, id, ['sh', '-c', script]);
  return { exitCode: r.exitCode, stdout: r.stdout, stderr: r.stderr };
}

/** tasks reads the sandbox's pids cgroup on the host (cgroup v1 hierarchy, cgroupsPath /sandnode/<id>). */
function tasks(id: string): { current: number; max: string } {
  const dir = `/sys/fs/cgroup/pids/sandnode/${id}`;
  return { current: Number(readFileSync(`${dir}/pids.current`, 'utf8').trim()), max: readFileSync(`${dir}/pids.max`, 'utf8').trim() };
}

/** expectFull: the sandbox's pids.max is limit and its tasks filled it (less the few that exited since). */
function expectFull(id: string, limit: number): void {
  const t = tasks(id);
  expect(t.max).toBe(String(limit));
  expect(t.current).toBeLessThanOrEqual(limit);
  expect(t.current).toBeGreaterThan(limit - 8);
}

describeNode('what a hostile sandbox can reach (runc isolation)', () => {
  let node: TestNode;
  let id: string;
  beforeAll(async () => {
    node = await startNode();
    id = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!.sandboxId;
  });
  afterAll(async () => {
    await node?.stop();
  });

  it('runs under a seccomp filter', async () => {
    const r = await run(node.api, id, 'grep Seccomp: /proc/self/status');
    expect(r.stdout).toMatch(/^Seccomp:\s+2$/m);
  });

  it.each([
    ['a new user namespace', 'unshare -U true'],
    ['a new mount namespace', 'unshare -m true'],
    ['a new network namespace', 'unshare -n true'],
    ['a mount', 'mkdir -p /tmp/m && mount -t tmpfs none /tmp/m'],
  ])('cannot make %s', async (_what, script) => {
    const r = await run(node.api, id, script);
    expect(r.exitCode).not.toBe(0);
    expect(r.stderr).toMatch(/not permitted|denied|not implemented/i);
  });

  it('sees only its own cgroup (a cgroup namespace)', async () => {
    const r = await run(node.api, id, 'cat /proc/self/cgroup');
    const lines = r.stdout.trim().split('\n');
    expect(lines.length).toBeGreaterThan(0);
    for (const l of lines) expect(l).not.toMatch(/sandnode/);
  });

  it('a fork bomb of 2000 background processes hits the pids limit; the sandbox and the node keep serving', async () => {
    // the shell itself may die when a fork fails; what counts is that the cgroup is full, not over
    await run(node.api, id, 'i=0; while [ $i -lt 2000 ]; do sleep 60 & i=$((i+1)); done 2>/dev/null; true');
    expectFull(id, 1024);
    // the node serves on: another sandbox is made and runs a command
    const other = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    expect((await run(node.api, other.sandboxId, 'echo ok')).stdout).toBe('ok\n');
    await node.api.sandboxes.deleteSandbox({ sandboxId: other.sandboxId });
    await run(node.api, id, 'pkill sleep; true');
    expect((await node.api.sandboxes.getSandbox({ sandboxId: id })).sandbox!.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
  });

  it('asks for a pids limit within range, or gets INVALID_ARGUMENT and nothing is created', async () => {
    await expectCode(node.api.sandboxes.createSandbox({ template: 'base', resources: { vcpus: 0, memoryMib: 0, diskBytes: 0, pids: 3 } }), Status.INVALID_ARGUMENT, /pids/);
    const sb = (await node.api.sandboxes.createSandbox({ template: 'base', resources: { vcpus: 0, memoryMib: 0, diskBytes: 0, pids: 64 } })).sandbox!;
    await run(node.api, sb.sandboxId, 'i=0; while [ $i -lt 200 ]; do sleep 60 & i=$((i+1)); done 2>/dev/null; true');
    expectFull(sb.sandboxId, 64);
    await node.api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });
});
