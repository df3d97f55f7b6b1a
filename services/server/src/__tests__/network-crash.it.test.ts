/**
 * Crashes around a networked sandbox's slot (issue 12 §4): a DRAINED sandbox's reserved slot
 * survives kill -9 of the server and of the vmm-supervisor (it resumes on the same address with
 * its token); a server killed in ResetRootfs after the VM stopped resumes the sandbox on the same
 * address; a server killed in ForkSandbox after the clones leaves no slot of the half-made child.
 * After each: every slot the supervisor lists is owned by a sandbox record, the user's services
 * (DNS through the resolver, the domain proxy, ingress) work on the adopted node.
 */
import { Status } from 'nice-grpc';
import { SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { findRunning, killComponent, startComponent } from '@sandnode/node-stack';
import { describeNode, killProcesses, serverProcesses, startTestInternet, waitFor, withEnv, type TestInternet, type TestNode } from '@sandnode/testkit';
import { create, fetchIn, ingressGet, listSlots, serve, serverDnsEnv, startNetworkNode } from './network-helpers';

jest.setTimeout(300_000);

/** slotOwners lists {slot, owner} of every slot the supervisor has that a sandbox owns. */
async function slotOwners(node: TestNode): Promise<{ slot: number; owner: string }[]> {
  return (await listSlots(node)).slots.filter((s) => s.owner !== '').map((s) => ({ slot: s.slot, owner: s.owner }));
}

describeNode('crashes around a networked sandbox', () => {
  let node: TestNode;
  let inet: TestInternet;

  beforeAll(async () => {
    inet = await startTestInternet();
    node = await startNetworkNode(inet);
  });
  afterAll(async () => {
    await node?.stop();
    await inet?.stop();
  });

  async function restartServer(failpoint = ''): Promise<void> {
    await killProcesses(serverProcesses(node.dirs.runDir), 0);
    // startNode's env is for the first start only: the upstreams again
    await withEnv({ SANDNODE_SERVER_FAILPOINTS: failpoint, ...serverDnsEnv(inet) }, () => startComponent(node.dirs, 'server', { timeoutMs: 60_000 }));
    node.reconnect();
  }

  /** sane: every owned slot belongs to a record, at the record's slot; a domain-policy sandbox resolves and fetches through the proxy. */
  async function sane(): Promise<void> {
    const records = (await node.api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes;
    const bySlot = new Map(records.filter((r) => r.network).map((r) => [r.network!.slot, r.sandboxId]));
    for (const s of await slotOwners(node)) expect(`${s.slot} ${s.owner}`).toBe(`${s.slot} ${bySlot.get(s.slot)}`);
    const { sb } = await create(node, { disabled: false, egress: { allowOut: [inet.names.allowed], denyOut: [], blockAll: true }, public: false });
    expect(await fetchIn(node, sb.sandboxId, `http://${inet.names.allowed}/`)).toMatch(/^200 /);
    await node.api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  }

  test('a DRAINED sandbox keeps its slot through kill -9 of the server and the vmm-supervisor, and resumes on it with its token', async () => {
    const { sb, token } = await create(node);
    expect(node.cli(['drain', '--json']).status).toBe(0);
    await waitFor('ublk-manager to exit after the drain', () => findRunning(node.dirs, 'ublk-manager') === undefined, 15_000, 100);
    expect(await slotOwners(node)).toContainEqual({ slot: sb.network!.slot, owner: sb.sandboxId });
    await killComponent(node.dirs, 'vmm-supervisor');
    await startComponent(node.dirs, 'vmm-supervisor');
    await startComponent(node.dirs, 'ublk-manager');
    await restartServer();
    expect(await slotOwners(node)).toContainEqual({ slot: sb.network!.slot, owner: sb.sandboxId });
    const back = (await node.api.sandboxes.resumeSandbox({ sandboxId: sb.sandboxId })).sandbox!;
    expect([back.state, back.network?.address]).toEqual([SandboxState.SANDBOX_STATE_RUNNING, sb.network!.address]);
    await serve(node, sb.sandboxId);
    expect(await ingressGet(node, sb.sandboxId, token)).toEqual({ status: 200, body: `hello from ${sb.sandboxId}` });
    await sane();
    await node.api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });

  test('a server killed in ResetRootfs after the VM stopped: the sandbox resumes on the same address', async () => {
    const sb = (await create(node)).sb;
    await restartServer('reset.after-stop=kill');
    await expect(node.api.sandboxes.resetRootfs({ sandboxId: sb.sandboxId })).rejects.toMatchObject({ code: Status.UNAVAILABLE });
    await restartServer();
    const got = (await node.api.sandboxes.getSandbox({ sandboxId: sb.sandboxId })).sandbox!;
    expect([got.state, got.network?.address]).toEqual([SandboxState.SANDBOX_STATE_DRAINED, sb.network!.address]);
    const back = (await node.api.sandboxes.resumeSandbox({ sandboxId: sb.sandboxId })).sandbox!;
    expect([back.state, back.network?.address, back.network?.slot]).toEqual([SandboxState.SANDBOX_STATE_RUNNING, sb.network!.address, sb.network!.slot]);
    expect(await fetchIn(node, sb.sandboxId, `http://${inet.address}/`)).toMatch(/^200 /);
    await sane();
    await node.api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });

  test.each(['fork.after-hold', 'fork.after-clone'])('a server killed in ForkSandbox at %s: no slot of the half-made child is left', async (fp) => {
    const parent = (await create(node)).sb;
    await restartServer(`${fp}=kill`);
    const err = (await node.api.sandboxes
      .forkSandbox({ parentId: parent.sandboxId, metadata: {}, timeoutSeconds: 0, maxFreezeMs: 5000, requestId: '', network: undefined })
      .catch((e: unknown) => e)) as { code: number; details: string };
    expect(err.code).toBe(Status.UNAVAILABLE);
    await restartServer();
    const list = (await node.api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes;
    expect(list.map((s) => s.sandboxId)).toEqual([parent.sandboxId]);
    expect(await slotOwners(node)).toEqual([{ slot: parent.network!.slot, owner: parent.sandboxId }]);
    await sane();
    await node.api.sandboxes.deleteSandbox({ sandboxId: parent.sandboxId });
  });

  test('the vmm-supervisor killed in a networked create after the slot was taken (failpoint after the mounts): once it is back no slot, VM or record of it is left', async () => {
    const before = await slotOwners(node);
    await killComponent(node.dirs, 'vmm-supervisor');
    await withEnv({ SANDNODE_VMM_SUPERVISOR_FAILPOINTS: 'runc.create.after-mounts=kill' }, () => startComponent(node.dirs, 'vmm-supervisor'));
    const t0 = Date.now();
    const err = (await node.api.sandboxes.createSandbox({ template: 'base', timeoutSeconds: 0, metadata: {}, requestId: 'killed-create', network: undefined }).catch((e: unknown) => e)) as {
      code: number;
      details: string;
    };
    console.log(`create with the supervisor killed under it: code ${err.code} after ${Date.now() - t0} ms: ${err.details}`);
    expect(err.code).toBeDefined();
    await startComponent(node.dirs, 'vmm-supervisor');
    await waitFor(
      'the half-made sandbox undone',
      async () => {
        const recs = (await node.api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes;
        const owners = await slotOwners(node);
        if (recs.length || owners.length !== before.length) throw new Error(`records ${recs.map((r) => `${r.sandboxId} ${r.state}`).join(', ')}; slots ${JSON.stringify(owners)}`);
        return true;
      },
      30_000,
      200,
    );
    expect(await slotOwners(node)).toEqual(before);
    await sane();
  });
});
