/**
 * `sandnode upgrade server` and the node it upgrades (issue 11 §1):
 *   - the standby runs with the settings the active server runs with (the settings file in the
 *     run dir), not with the CLI's environment: a /metrics listener the node was started with
 *     survives upgrades run from an environment without it;
 *   - an upgrade while ublk-manager is down changes nothing: the standby refuses before it asks
 *     for the handover, the error names the peer that is down and says the old server stays
 *     active, and that server still serves.
 */
import net from 'node:net';
import { ServerRole } from '@sandnode/shared/proto/server/v1/admin';
import { startComponent, stopComponent, upgradeServer } from '@sandnode/node-stack';
import { describeNode, holderStatus, startNode, type TestNode } from '@sandnode/testkit';

jest.setTimeout(300_000);

/** freePort: a TCP port nothing listens on now. */
async function freePort(): Promise<number> {
  const s = net.createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', () => r()));
  const { port } = s.address() as net.AddressInfo;
  await new Promise((r) => s.close(r));
  return port;
}

/** metricsStatus is the HTTP status of GET /metrics on port, or the connect error's code. */
async function metricsStatus(port: number): Promise<number | string> {
  try {
    return (await fetch(`http://127.0.0.1:${port}/metrics`)).status;
  } catch (err) {
    return String(((err as Error).cause as NodeJS.ErrnoException | undefined)?.code ?? err);
  }
}

describeNode('upgrade server and the node it upgrades', () => {
  let node: TestNode;
  let metricsPort: number;
  beforeAll(async () => {
    metricsPort = await freePort();
    node = await startNode({ buildTemplate: false, env: { server: { SANDNODE_SERVER_METRICS_LISTEN: `127.0.0.1:${metricsPort}` } } });
  });
  afterAll(async () => {
    await node?.stop();
  });

  it('starts the standby from the node settings: the /metrics listener survives upgrades run without it in the environment', async () => {
    expect(process.env.SANDNODE_SERVER_METRICS_LISTEN).toBeUndefined();
    expect(await metricsStatus(metricsPort)).toBe(200);
    for (let h = 1; h <= 2; h++) {
      const r = await upgradeServer(node.dirs, '.');
      expect((await holderStatus(node.dirs))?.holderPid).toBe(r.newPid);
      expect({ upgrade: h, metrics: await metricsStatus(metricsPort) }).toEqual({ upgrade: h, metrics: 200 });
    }
  });

  it('refuses an upgrade while ublk-manager is down, naming it, and the old server stays active and serves', async () => {
    const before = await holderStatus(node.dirs);
    expect(before?.role).toBe(ServerRole.SERVER_ROLE_ACTIVE);
    await stopComponent(node.dirs, 'ublk-manager');
    try {
      const err = await upgradeServer(node.dirs, '.').then(
        () => undefined,
        (e: unknown) => e as Error,
      );
      expect(err?.message).toMatch(/ublk-manager does not answer/);
      expect(err?.message).toMatch(new RegExp(`the old server \\(pid ${before!.holderPid}\\) stays active`));
      const after = await holderStatus(node.dirs);
      expect({ pid: after?.holderPid, role: after?.role, epoch: after?.epoch }).toEqual({ pid: before!.holderPid, role: ServerRole.SERVER_ROLE_ACTIVE, epoch: before!.epoch });
      const api = node.reconnect();
      await expect(api.sandboxes.listSandboxes({ pageSize: 1 })).resolves.toBeDefined();
    } finally {
      await startComponent(node.dirs, 'ublk-manager', { timeoutMs: 60_000 });
    }
    // with ublk-manager back, the upgrade goes through
    const r = await upgradeServer(node.dirs, '.');
    expect((await holderStatus(node.dirs))?.holderPid).toBe(r.newPid);
  });
});
