/**
 * Issue 11 finding 15: a tmp cleaner removes the active server's admin socket. Before, the
 * server ran on unseen: `status` said "no active server", every upgrade failed and `up` said
 * "already running". Now the server binds its admin socket again (handover/admin-socket.ts),
 * and the node is found, upgraded and reported as before.
 */
import { rmSync } from 'node:fs';
import { findActiveServer, upgradeServer } from '@sandnode/node-stack';
import { describeNode, startNode, waitFor, type TestNode } from '@sandnode/testkit';

jest.setTimeout(180_000);

describeNode('the active server after its admin socket was removed', () => {
  let node: TestNode;
  beforeAll(async () => {
    node = await startNode({ buildTemplate: false });
  });
  afterAll(async () => {
    await node?.stop();
  });

  it('binds it again: it is found as the active server and an upgrade works', async () => {
    const before = (await findActiveServer(node.dirs.runDir))!;
    rmSync(before.admin.slice('unix://'.length));
    const found = await waitFor('the server to bind its admin socket again', async () => (await findActiveServer(node.dirs.runDir)) ?? undefined, 30_000);
    expect({ pid: found.holderPid, admin: found.admin }).toEqual({ pid: before.holderPid, admin: before.admin });
    const up = await upgradeServer(node.dirs, '.', 120_000);
    expect(up.oldPid).toBe(before.holderPid);
    await expect(node.api.sandboxes.listSandboxes({})).resolves.toBeDefined();
  });
});
