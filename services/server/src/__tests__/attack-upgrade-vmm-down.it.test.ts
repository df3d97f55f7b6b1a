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
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { findActiveServer, findRunning, startComponent, upgradeServer } from '@sandnode/node-stack';
import { createLogger, createServiceServer, SUITE_VERSION, unixAddress, VMM_FEATURES } from '@sandnode/shared';
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

  it('leaves the old server serving when the vmm-supervisor is gone after the peer check: the old one takes the lease back without it', async () => {
    // The case a kill cannot hit on purpose: the standby's peer check passes, then the
    // supervisor is gone. The standby checks a stand-in that answers GetVersion (the node's
    // settings file names it for the standby), and dies once it has the sockets (failpoint),
    // so the old server takes the lease back while the real supervisor is down.
    const vmm = findRunning(node.dirs, 'vmm-supervisor');
    if (vmm) process.kill(vmm.pid, 'SIGKILL');
    const standIn = createServiceServer({
      info: { component: 'vmm-supervisor', version: SUITE_VERSION, commit: '', features: Object.values(VMM_FEATURES) },
      log: createLogger('test', SUITE_VERSION, 'error'),
    });
    const standInSock = path.join(node.dirs.runDir, 'stand-in-vmm.sock');
    await standIn.listen([unixAddress(standInSock)]);
    // both config slots the active server wrote (server-settings.json, and .v2.json that this build reads first)
    const settingsFiles = ['server-settings.json', 'server-settings.v2.json'].map((f) => path.join(node.dirs.runDir, f)).filter((f) => existsSync(f));
    expect(settingsFiles.length).toBeGreaterThan(0);
    const saved = settingsFiles.map((f) => [f, readFileSync(f, 'utf8')] as const);
    for (const [f, text] of saved) writeFileSync(f, JSON.stringify({ ...JSON.parse(text), vmmAddress: unixAddress(standInSock) }));
    const before = (await findActiveServer(node.dirs.runDir))!;
    process.env.SANDNODE_SERVER_FAILPOINTS = 'takeover.after-fds=kill';
    try {
      await expect(upgradeServer(node.dirs, '.', 120_000)).rejects.toThrow();
    } finally {
      delete process.env.SANDNODE_SERVER_FAILPOINTS;
      for (const [f, text] of saved) writeFileSync(f, text);
      await standIn.shutdown(1000);
    }
    const active = await waitFor(
      'an active server',
      async () => {
        const s = await findActiveServer(node.dirs.runDir);
        return s && s.epoch > before.epoch ? s : undefined;
      },
      30_000,
    );
    expect(active.holderPid).toBe(before.holderPid);
    await expect(node.api.sandboxes.listSandboxes({})).resolves.toBeDefined();
  });
});
