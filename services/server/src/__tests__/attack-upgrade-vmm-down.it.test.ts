/**
 * Adversarial finding (issue 11, kill -9 during an upgrade): `sandnode upgrade server` while the
 * vmm-supervisor is down (killed, or restarted as the README's supervisor upgrade does). The
 * active server hands its lease and listeners to the standby, the standby waits 30 s for the
 * supervisor, gives up and exits; the old server has retired meanwhile ("the standby holds the
 * lease but did not finish: retiring"). The command says "the new server failed before it took
 * the lease ... no server is active": the node's API is down until an operator runs `up`. Seen
 * on a real node 2 of 2 (supervisor killed 0.5 s into the upgrade, and before it). A failed
 * upgrade must leave a server serving (the old one, or the new one).
 */
import { findActiveServer, findRunning, startComponent, upgradeServer } from '@sandnode/node-stack';
import { describeNode, serverProcesses, startNode, waitFor, type TestNode } from '@sandnode/testkit';

const isAlive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

jest.setTimeout(240_000);

describeNode('upgrade server while the vmm-supervisor is down', () => {
  let node: TestNode;
  beforeAll(async () => {
    node = await startNode({ buildTemplate: false });
  });
  afterAll(async () => {
    await node?.stop();
  });

  it('leaves a server serving the API, whatever the upgrade answers', async () => {
    const vmm = findRunning(node.dirs, 'vmm-supervisor')!;
    process.kill(vmm.pid, 'SIGKILL');
    await waitFor('the vmm-supervisor to be gone', () => !isAlive(vmm.pid));
    await upgradeServer(node.dirs, '.', 120_000).catch((err: Error) => err);
    expect(await findActiveServer(node.dirs.runDir).then((s) => s?.holderPid ?? 'none')).not.toBe('none');
    await expect(node.api.sandboxes.listSandboxes({})).resolves.toBeDefined();
  });

  it('leaves a server serving when the vmm-supervisor is killed while the upgrade runs (before or after the peer check)', async () => {
    await startComponent(node.dirs, 'vmm-supervisor');
    const vmm = findRunning(node.dirs, 'vmm-supervisor')!;
    const upgrade = upgradeServer(node.dirs, '.', 120_000).catch((err: Error) => err);
    await waitFor('the standby to start', () => serverProcesses(node.dirs.runDir).length > 1);
    process.kill(vmm.pid, 'SIGKILL');
    await upgrade;
    const active = await waitFor('an active server', () => findActiveServer(node.dirs.runDir), 30_000);
    expect(serverProcesses(node.dirs.runDir)).toContain(active.holderPid);
    await expect(node.api.sandboxes.listSandboxes({})).resolves.toBeDefined();
  });
});
