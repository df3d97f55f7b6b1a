/**
 * Warm pools on a node with network (issue 14 §2): members wait with a network slot; a claim
 * with its own egress policy and publicness gets them on the VM (the network update path)
 * before the answer; a claim with the node's default network takes a member as it is; a create
 * that asks for no network is not given a networked member (cold, saying why).
 */
import { createSandnodeChannel, createServiceClient, socketPath, unixAddress } from '@sandnode/shared';
import { VmServiceDefinition } from '@sandnode/shared/proto/vmm/v1/vmm';
import { describeNode, startNode, type TestNode } from '@sandnode/testkit';
import { readyMembers, setPool, waitReady } from './pool-helpers';

jest.setTimeout(300_000);

type Egress = { allowOut: string[]; denyOut: string[]; blockAll: boolean };
const pol = (e: Egress | undefined) => e && { allowOut: e.allowOut, denyOut: e.denyOut, blockAll: e.blockAll };

/** vmEgress is the egress policy the vmm-supervisor holds for the VM (what its firewall enforces). */
async function vmEgress(node: TestNode, vmId: string): Promise<Egress | undefined> {
  const ch = createSandnodeChannel(unixAddress(socketPath(node.dirs.runDir, 'vmm-supervisor')));
  try {
    return pol((await createServiceClient(VmServiceDefinition, ch, { timeoutMs: 5000 }).getVm({ vmId })).vm?.network?.egress);
  } finally {
    ch.close();
  }
}

describeNode('warm pools with network', () => {
  let node: TestNode;
  beforeAll(async () => {
    node = await startNode({ network: true });
    await setPool(node, { template: 'base', size: 2 });
    await waitReady(node, 'base', 2);
  });
  afterAll(async () => {
    await node?.stop();
  });

  test("a claim with its own policy and publicness: the member's VM has the request's policy before the answer", async () => {
    const members = readyMembers(node, 'base');
    const before = await vmEgress(node, members[0]!);
    const policy = { allowOut: ['198.51.100.0/24'], denyOut: [], blockAll: true };
    expect(before).not.toEqual(policy);
    const r = await node.api.sandboxes.createSandbox({ template: 'base', metadata: { net: 'own' }, timeoutSeconds: 60, network: { disabled: false, egress: policy, public: true } });
    const s = r.sandbox!;
    expect([r.fromPool, members.includes(s.sandboxId), s.metadata]).toEqual([true, true, { net: 'own' }]);
    expect([pol(s.network?.egress), s.network?.public, r.accessToken.length]).toEqual([policy, true, 43]);
    expect(await vmEgress(node, s.sandboxId)).toEqual(policy);
    expect(pol((await node.api.sandboxes.getSandbox({ sandboxId: s.sandboxId })).sandbox!.network?.egress)).toEqual(policy);
    await node.api.sandboxes.deleteSandbox({ sandboxId: s.sandboxId });
  });

  test("a claim with the node's default network takes a member as it is; one that asks for no network goes cold and says why", async () => {
    await waitReady(node, 'base', 2);
    const members = readyMembers(node, 'base');
    const d = await node.api.sandboxes.createSandbox({ template: 'base' });
    expect([d.fromPool, members.includes(d.sandbox!.sandboxId), !!d.sandbox!.network?.address]).toEqual([true, true, true]);
    const none = await node.api.sandboxes.createSandbox({ template: 'base', network: { disabled: true, egress: undefined, public: false } });
    expect([none.fromPool, none.poolMiss, none.sandbox!.network]).toEqual([false, 'the request asks for no network; the pool members have one', undefined]);
    await node.api.sandboxes.deleteSandbox({ sandboxId: d.sandbox!.sandboxId });
    await node.api.sandboxes.deleteSandbox({ sandboxId: none.sandbox!.sandboxId });
  });
});
