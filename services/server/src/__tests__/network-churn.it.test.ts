/**
 * Slot churn on a whole node (issue 12 §4): creates and deletes of networked sandboxes
 * overlapping each other and the supervisor's background spare making, with live policy
 * changes in between. Afterwards the supervisor's slots are exactly the live sandboxes' plus
 * spares, the host has a veth and a netns file for those slots only, every live sandbox reaches
 * the test host, and no two share an address.
 */
import { execFileSync } from 'node:child_process';
import { type Sandbox } from '@sandnode/shared/proto/server/v1/sandbox';
import { NetworkSlotState } from '@sandnode/shared/proto/vmm/v1/vmm';
import { killComponent, startComponent } from '@sandnode/node-stack';
import { describeNode, startNode, startTestInternet, waitFor, type TestInternet, type TestNode } from '@sandnode/testkit';
import { create, echo, listSlots, netnsSlots, vethSlots } from './network-helpers';

jest.setTimeout(300_000);

describeNode('networked sandbox churn', () => {
  let node: TestNode;
  let inet: TestInternet;

  beforeAll(async () => {
    inet = await startTestInternet();
    node = await startNode({ buildTemplate: true, network: true });
  });
  afterAll(async () => {
    await node?.stop();
    await inet?.stop();
  });

  test('3 rounds of 8 creates overlapping 8 deletes and policy changes: slots, veths and netns files match the live sandboxes', async () => {
    const make = async () => (await create(node)).sb;
    let live: Sandbox[] = await Promise.all(Array.from({ length: 8 }, make));
    for (let round = 0; round < 3; round++) {
      const gone = live;
      const deny = { allowOut: [], denyOut: [`${inet.address}/32`], blockAll: false };
      const [made] = await Promise.all([
        Promise.all(Array.from({ length: 8 }, make)),
        Promise.all(gone.map((s, i) => (i % 2 ? node.api.sandboxes.updateSandboxNetwork({ sandboxId: s.sandboxId, egress: deny, public: undefined }).catch(() => undefined) : undefined))),
        Promise.all(gone.map((s) => node.api.sandboxes.deleteSandbox({ sandboxId: s.sandboxId }))),
      ]);
      live = made;
    }
    const addrs = live.map((s) => s.network!.address);
    expect(new Set(addrs).size).toBe(live.length);
    expect(await Promise.all(live.map((s) => echo(node, s.sandboxId, inet.address)))).toEqual(live.map(() => 'hi\n'));

    const tag = node.dirs.network!.tag!;
    // spares are made in the background: wait until the supervisor is done making them
    const slots = await waitFor(
      'the spares made',
      async () => {
        const l = await listSlots(node);
        return l.slots.filter((x) => x.state === NetworkSlotState.NETWORK_SLOT_STATE_SPARE).length === l.spareTarget ? l : undefined;
      },
      30_000,
      100,
    );
    const inUse = slots.slots.filter((x) => x.state === NetworkSlotState.NETWORK_SLOT_STATE_IN_USE);
    expect(inUse.map((x) => `${x.slot} ${x.owner}`).sort()).toEqual(live.map((s) => `${s.network!.slot} ${s.sandboxId}`).sort());
    expect(slots.slots.filter((x) => x.state === NetworkSlotState.NETWORK_SLOT_STATE_RESERVED)).toEqual([]);
    const expected = slots.slots.map((x) => x.slot).sort((a, b) => a - b);
    expect(vethSlots(node)).toEqual(expected);
    expect(netnsSlots(node)).toEqual(expected);
    const chains = [...execFileSync('nft', ['list', 'table', 'inet', `sandnode-${tag}`], { encoding: 'utf8' }).matchAll(/chain slot-(\d+) \{/g)].map((m) => Number(m[1])).sort((a, b) => a - b);
    expect(chains).toEqual(inUse.map((x) => x.slot).sort((a, b) => a - b));
    await Promise.all(live.map((s) => node.api.sandboxes.deleteSandbox({ sandboxId: s.sandboxId })));
  });

  test('the vmm-supervisor killed under 8 concurrent creates (once the first took a slot): once it is back, slots and host state match the records, every create that succeeded works', async () => {
    const calls = Array.from({ length: 8 }, () =>
      create(node).then(
        (r) => r.sb,
        (e: unknown) => e as Error,
      ),
    );
    // kill once the first create took its slot: some creates are in the supervisor, some not yet
    await waitFor('a create to take a slot', async () => (await listSlots(node)).slots.some((x) => x.state === NetworkSlotState.NETWORK_SLOT_STATE_IN_USE), 30_000, 10);
    await killComponent(node.dirs, 'vmm-supervisor');
    await startComponent(node.dirs, 'vmm-supervisor');
    const results = await Promise.all(calls);
    const ok = results.filter((r): r is Sandbox => !(r instanceof Error));
    console.log(
      `creates under a supervisor kill: ${ok.length} of 8 made, ${8 - ok.length} failed (${results
        .filter((r) => r instanceof Error)
        .map((e) => (e as Error).message.slice(0, 80))
        .join(' | ')})`,
    );
    await waitFor(
      'slots and host state to match the records',
      async () => {
        const recs = (await node.api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes;
        const l = await listSlots(node);
        const owned = l.slots
          .filter((x) => x.owner !== '')
          .map((x) => `${x.slot} ${x.owner}`)
          .sort();
        const want = recs
          .filter((r) => r.network)
          .map((r) => `${r.network!.slot} ${r.sandboxId}`)
          .sort();
        const slotsOnHost = l.slots.map((x) => x.slot).sort((a, b) => a - b);
        const veths = vethSlots(node);
        const files = netnsSlots(node);
        const text = JSON.stringify({ owned, want, slotsOnHost, veths, files });
        if (JSON.stringify(owned) !== JSON.stringify(want) || JSON.stringify(veths) !== JSON.stringify(slotsOnHost) || JSON.stringify(files) !== JSON.stringify(slotsOnHost)) throw new Error(text);
        return recs;
      },
      60_000,
      500,
    );
    const recs = (await node.api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes;
    expect(recs.map((r) => r.sandboxId).sort()).toEqual(ok.map((s) => s.sandboxId).sort());
    expect(await Promise.all(ok.map((s) => echo(node, s.sandboxId, inet.address)))).toEqual(ok.map(() => 'hi\n'));
    await Promise.all(ok.map((s) => node.api.sandboxes.deleteSandbox({ sandboxId: s.sandboxId })));
  });
});
