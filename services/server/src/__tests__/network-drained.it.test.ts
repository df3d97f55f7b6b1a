/**
 * A networked sandbox that is not running (issue 12 §4): a policy change while DRAINED holds
 * once it resumes (in the kernel, not only in the record); deleting a DRAINED sandbox frees its
 * reserved slot (netns, veth, chain); a PAUSED one answers ingress 503 and serves again on the
 * same address after resume; a sandbox deleted by its timeout frees its slot.
 */
import { spawnSync } from 'node:child_process';
import { SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { NetworkSlotState } from '@sandnode/shared/proto/vmm/v1/vmm';
import { findRunning, startComponent } from '@sandnode/node-stack';
import { describeNode, startTestInternet, waitFor, type TestInternet, type TestNode } from '@sandnode/testkit';
import { create, echo, fetchIn, ingressGet, listSlots, serve, slotOnHost, startNetworkNode } from './network-helpers';

jest.setTimeout(300_000);

/** What of slot s is on the host: its netns file, its host veth, its nft chain, its row in the supervisor. */
async function slotState(node: TestNode, s: number): Promise<{ netns: boolean; veth: boolean; chain: boolean; row: string }> {
  const row = (await listSlots(node)).slots.find((x) => x.slot === s);
  return { ...slotOnHost(node, s), row: row ? `${row.state} ${row.owner}` : '' };
}

describeNode('a networked sandbox that is not running', () => {
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

  async function drain(): Promise<void> {
    expect(node.cli(['drain', '--json']).status).toBe(0);
    await waitFor('ublk-manager to exit after the drain', () => findRunning(node.dirs, 'ublk-manager') === undefined, 15_000, 100);
    await startComponent(node.dirs, 'ublk-manager');
  }

  test('a policy changed while DRAINED holds in the kernel once it resumes; a DRAINED sandbox deleted frees its slot', async () => {
    const a = (await create(node)).sb;
    const b = (await create(node)).sb;
    expect(await echo(node, a.sandboxId, inet.address)).toBe('hi\n');
    await drain();
    const deny = { allowOut: [], denyOut: [`${inet.address}/32`], blockAll: false };
    const upd = (await node.api.sandboxes.updateSandboxNetwork({ sandboxId: a.sandboxId, egress: deny, public: undefined })).sandbox!;
    expect(upd.state).toBe(SandboxState.SANDBOX_STATE_DRAINED);
    const back = (await node.api.sandboxes.resumeSandbox({ sandboxId: a.sandboxId })).sandbox!;
    expect([back.network?.address, back.network?.egress?.denyOut]).toEqual([a.network!.address, [`${inet.address}/32`]]);
    expect(await echo(node, a.sandboxId, inet.address)).toBe('');

    const s = b.network!.slot;
    expect(await slotState(node, s)).toEqual({ netns: true, veth: true, chain: false, row: `${NetworkSlotState.NETWORK_SLOT_STATE_RESERVED} ${b.sandboxId}` });
    await node.api.sandboxes.deleteSandbox({ sandboxId: b.sandboxId });
    expect(await slotState(node, s)).toEqual({ netns: false, veth: false, chain: false, row: '' });
    await node.api.sandboxes.deleteSandbox({ sandboxId: a.sandboxId });
  });

  test('PAUSED: ingress answers 503, after resume the same address serves again', async () => {
    const { sb, token } = await create(node);
    const id = sb.sandboxId;
    await serve(node, id);
    await waitFor('the web server', async () => (await ingressGet(node, id, token)).status === 200, 30_000, 100);
    await node.api.sandboxes.pauseSandbox({ sandboxId: id });
    expect((await ingressGet(node, id, token)).status).toBe(503);
    const back = (await node.api.sandboxes.resumeSandbox({ sandboxId: id })).sandbox!;
    expect(back.network?.address).toBe(sb.network!.address);
    expect(await ingressGet(node, id, token)).toEqual({ status: 200, body: `hello from ${id}` });
    await node.api.sandboxes.deleteSandbox({ sandboxId: id });
  });

  test('a sandbox deleted by its timeout frees its slot', async () => {
    const sb = (await node.api.sandboxes.createSandbox({ template: 'base', timeoutSeconds: 1, metadata: {}, requestId: '', network: undefined })).sandbox!;
    const s = sb.network!.slot;
    const vethOf = () => spawnSync('ip', ['-o', 'link', 'show', 'dev', `sn${node.dirs.network!.tag!}v${s}`], { encoding: 'utf8' }).stdout.split(':')[0];
    const first = vethOf();
    await waitFor(
      'the expired sandbox and its slot gone',
      async () => {
        const st = await slotState(node, s);
        // freed (nothing on the host), or made a spare again (no owner, no chain, a new veth)
        return st.row === '' ? !st.netns && !st.veth && !st.chain : st.row === `${NetworkSlotState.NETWORK_SLOT_STATE_SPARE} ` && !st.chain && vethOf() !== first;
      },
      30_000,
      200,
    );
  });

  test('a domain policy (proxy redirect, block_all) holds after drain/resume, ResetRootfs and a PAUSED fork', async () => {
    const egress = { allowOut: [inet.names.allowed], denyOut: [], blockAll: true };
    const { sb } = await create(node, { disabled: false, egress, public: false });
    const holds = async (id: string) => {
      expect(await fetchIn(node, id, `http://${inet.names.allowed}/`)).toMatch(/^200 /);
      expect(await fetchIn(node, id, `http://${inet.address}/`)).toMatch(/^403 .*block_all/);
      expect(await echo(node, id, inet.address)).toBe('');
    };
    await holds(sb.sandboxId);
    await drain();
    await node.api.sandboxes.resumeSandbox({ sandboxId: sb.sandboxId });
    await holds(sb.sandboxId);
    const reset = (await node.api.sandboxes.resetRootfs({ sandboxId: sb.sandboxId })).sandbox!;
    expect(reset.network?.address).toBe(sb.network!.address);
    await holds(sb.sandboxId);
    await node.api.sandboxes.pauseSandbox({ sandboxId: sb.sandboxId });
    const child = (await node.api.sandboxes.forkSandbox({ parentId: sb.sandboxId, metadata: {}, timeoutSeconds: 0, maxFreezeMs: 0, requestId: '', network: undefined })).sandbox!;
    expect(child.network?.address).not.toBe(sb.network!.address);
    await holds(child.sandboxId);
    await node.api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
    await holds(child.sandboxId); // the parent's delete leaves the child's network alone
    await node.api.sandboxes.deleteSandbox({ sandboxId: child.sandboxId });
  });
});
