/**
 * Sandbox network across the lifecycle on a whole node (issue 12 §4/§5): drain and resume keep
 * the address and the ingress token; fork gives the child its own address and token and the
 * parent's policy (or an override); ResetRootfs keeps the address; delete frees the slot's
 * netns, veth and chain and the slot is handed out again; a failed create leaves no slot taken;
 * 20 concurrent creates get distinct addresses that reach the test host and not each other; the
 * CLI's network commands; and `down --purge` (purgeNode) leaves nothing of the node's network.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { SandboxState, type Sandbox } from '@sandnode/shared/proto/server/v1/sandbox';
import { NetworkSlotState } from '@sandnode/shared/proto/vmm/v1/vmm';
import { findRunning, startComponent, stopComponent } from '@sandnode/node-stack';
import { describeNode, startTestInternet, waitFor, withEnv, type TestInternet, type TestNode } from '@sandnode/testkit';
import { create, echo, ingressGet, listSlots, serve, slotOnHost, startNetworkNode, tcpProbe } from './network-helpers';

jest.setTimeout(300_000);

type Egress = { allowOut: string[]; denyOut: string[]; blockAll: boolean };

/** createNet makes a sandbox that asks for a network with egress and public as given. */
function createNet(node: TestNode, egress?: Egress, pub = false): Promise<{ sb: Sandbox; token: string }> {
  return create(node, { disabled: false, egress, public: pub });
}

/** slots lists the supervisor's slots ({slot, state, owner}, no proto bookkeeping fields). */
async function slots(node: TestNode) {
  const r = await listSlots(node);
  return { spareTarget: r.spareTarget, slots: r.slots.map((x) => ({ slot: x.slot, state: x.state, owner: x.owner })) };
}

/** pol is the plain policy of a SandboxNetwork's egress (no proto bookkeeping fields). */
function pol(e: Egress | undefined): Egress | undefined {
  return e && { allowOut: e.allowOut, denyOut: e.denyOut, blockAll: e.blockAll };
}

describeNode('sandbox network across the lifecycle', () => {
  let node: TestNode | undefined;
  let inet: TestInternet;
  const n = () => node!;

  beforeAll(async () => {
    inet = await startTestInternet();
    node = await startNetworkNode(inet);
  });
  afterAll(async () => {
    await node?.stop();
    await inet?.stop();
  });

  test('drain then resume: the same address, the ingress token still works, traffic flows', async () => {
    const { sb, token } = await createNet(n());
    await serve(n(), sb.sandboxId);
    expect(await ingressGet(n(), sb.sandboxId, token)).toEqual({ status: 200, body: `hello from ${sb.sandboxId}` });
    const r = n().cli(['drain', '--json']);
    expect(r.status).toBe(0);
    const drained = (await n().api.sandboxes.getSandbox({ sandboxId: sb.sandboxId })).sandbox!;
    expect([drained.state, drained.network?.address, drained.network?.slot]).toEqual([SandboxState.SANDBOX_STATE_DRAINED, sb.network!.address, sb.network!.slot]);
    expect((await ingressGet(n(), sb.sandboxId, token)).status).toBe(503);
    // the drain stopped the device manager; start it as an operator would
    await waitFor('ublk-manager to exit after the drain', () => findRunning(n().dirs, 'ublk-manager') === undefined, 15_000, 100);
    await startComponent(n().dirs, 'ublk-manager');
    const resumed = (await n().api.sandboxes.resumeSandbox({ sandboxId: sb.sandboxId })).sandbox!;
    expect([resumed.state, resumed.network?.address, resumed.network?.slot]).toEqual([SandboxState.SANDBOX_STATE_RUNNING, sb.network!.address, sb.network!.slot]);
    expect(await echo(n(), sb.sandboxId, inet.address)).toBe('hi\n');
    await serve(n(), sb.sandboxId); // a cold start: the old process is gone
    expect(await ingressGet(n(), sb.sandboxId, token)).toEqual({ status: 200, body: `hello from ${sb.sandboxId}` });
    expect((await ingressGet(n(), sb.sandboxId)).status).toBe(401);
    await n().api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });

  test("fork: the child gets its own address and token and the parent's policy; an override policy holds", async () => {
    const policy = { allowOut: [`${inet.address}/32`], denyOut: [], blockAll: true };
    const { sb: parent, token: parentToken } = await createNet(n(), policy);
    const f = await n().api.sandboxes.forkSandbox({ parentId: parent.sandboxId, metadata: {}, timeoutSeconds: 0, maxFreezeMs: 0, requestId: '', network: undefined });
    const child = f.sandbox!;
    // from the node's pool (a /24 of the test pools)
    expect(child.network!.address.split('.').slice(0, 3)).toEqual(n().dirs.network!.pool!.split('.').slice(0, 3));
    expect(child.network?.address).not.toBe(parent.network!.address);
    expect(f.accessToken).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(f.accessToken).not.toBe(parentToken);
    expect(pol(child.network?.egress)).toEqual(policy);
    expect(await echo(n(), child.sandboxId, inet.address)).toBe('hi\n');
    await serve(n(), child.sandboxId);
    expect(await ingressGet(n(), child.sandboxId, f.accessToken)).toEqual({ status: 200, body: `hello from ${child.sandboxId}` });
    expect((await ingressGet(n(), child.sandboxId, parentToken)).status).toBe(401);

    const override = { allowOut: [], denyOut: [`${inet.address}/32`], blockAll: false };
    const g = await n().api.sandboxes.forkSandbox({
      parentId: parent.sandboxId,
      metadata: {},
      timeoutSeconds: 0,
      maxFreezeMs: 0,
      requestId: '',
      network: { disabled: false, egress: override, public: true },
    });
    const other = g.sandbox!;
    expect(pol(other.network?.egress)).toEqual(override);
    expect(other.network?.public).toBe(true);
    expect(new Set([parent.network!.address, child.network!.address, other.network!.address]).size).toBe(3);
    expect(await echo(n(), other.sandboxId, inet.address)).toBe('');
    expect(await echo(n(), parent.sandboxId, inet.address)).toBe('hi\n');
    for (const s of [other, child, parent]) await n().api.sandboxes.deleteSandbox({ sandboxId: s.sandboxId });
  });

  test('ResetRootfs keeps the address and the policy', async () => {
    const policy = { allowOut: [`${inet.address}/32`], denyOut: [], blockAll: true };
    const { sb } = await createNet(n(), policy);
    const r = (await n().api.sandboxes.resetRootfs({ sandboxId: sb.sandboxId })).sandbox!;
    expect([r.state, r.network?.address, r.network?.slot, pol(r.network?.egress)]).toEqual([SandboxState.SANDBOX_STATE_RUNNING, sb.network!.address, sb.network!.slot, policy]);
    expect(await echo(n(), sb.sandboxId, inet.address)).toBe('hi\n');
    await n().api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });

  test("delete frees the slot's netns, veth and chain, and the slot is handed out again", async () => {
    const { sb } = await createNet(n());
    const s = sb.network!.slot;
    expect(slotOnHost(n(), s)).toEqual({ netns: true, veth: true, chain: true });
    // with the spares made, a delete makes none: what is left of the slot is what delete left
    await waitFor('the spares', async () => {
      const l = await slots(n());
      return l.slots.filter((x) => x.state === NetworkSlotState.NETWORK_SLOT_STATE_SPARE).length >= l.spareTarget;
    });
    await n().api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
    expect(slotOnHost(n(), s)).toEqual({ netns: false, veth: false, chain: false });
    expect((await slots(n())).slots.map((x) => x.slot)).not.toContain(s);
    // spares are taken first, lowest first, and refilled from the lowest free slot: s comes back within spareTarget + 1 creates
    const made: Sandbox[] = [];
    for (let i = 0; i <= (await slots(n())).spareTarget && !made.some((m) => m.network!.slot === s); i++) {
      made.push((await createNet(n())).sb);
      await waitFor('the spares', async () => (await slots(n())).slots.some((x) => x.slot === s) || made.some((m) => m.network!.slot === s), 10_000, 50);
    }
    const again = made.find((m) => m.network!.slot === s)!;
    expect(again.network!.address).toBe(sb.network!.address);
    expect(await echo(n(), again.sandboxId, inet.address)).toBe('hi\n');
    for (const m of made) await n().api.sandboxes.deleteSandbox({ sandboxId: m.sandboxId });
  });

  test('a failed create (supervisor failpoint after the mounts) leaves no slot taken and no host state', async () => {
    const before = await slots(n());
    await stopComponent(n().dirs, 'vmm-supervisor');
    await withEnv({ SANDNODE_VMM_SUPERVISOR_FAILPOINTS: 'runc.create.after-mounts=error' }, () => startComponent(n().dirs, 'vmm-supervisor'));
    try {
      await expect(createNet(n())).rejects.toMatchObject({ code: expect.any(Number) });
      const after = await slots(n());
      expect(after.slots.filter((x) => x.state !== NetworkSlotState.NETWORK_SLOT_STATE_SPARE)).toEqual(before.slots.filter((x) => x.state !== NetworkSlotState.NETWORK_SLOT_STATE_SPARE));
      const records = (await n().api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes;
      expect(records.filter((r) => r.state !== SandboxState.SANDBOX_STATE_RUNNING)).toEqual([]);
    } finally {
      await stopComponent(n().dirs, 'vmm-supervisor');
      await startComponent(n().dirs, 'vmm-supervisor');
    }
    const { sb } = await createNet(n());
    expect(await echo(n(), sb.sandboxId, inet.address)).toBe('hi\n');
    await n().api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });

  test('20 networked sandboxes created at once: distinct addresses, each reaches the test host, none reaches another', async () => {
    const made = await Promise.all(Array.from({ length: 20 }, async () => (await createNet(n())).sb));
    const addrs = made.map((s) => s.network!.address);
    expect(new Set(addrs).size).toBe(20);
    const ok = await Promise.all(made.map((s) => echo(n(), s.sandboxId, inet.address)));
    expect(ok).toEqual(made.map(() => 'hi\n'));
    // each serves 8080; the host reaches every one (the server is there), no sandbox reaches its neighbour
    await Promise.all(made.map((s) => serve(n(), s.sandboxId)));
    for (const a of addrs) expect(spawnSync('curl', ['-s', '-m', '5', `http://${a}:8080/`], { encoding: 'utf8' }).stdout).toMatch(/^hello from sb-/);
    const cross = await Promise.all(
      made.map(async (s, i) => {
        return tcpProbe(n(), s.sandboxId, addrs[(i + 1) % 20]!, 8080);
      }),
    );
    for (const c of cross) expect(c).toMatch(/^error (ECONNREFUSED|ECONNRESET|EHOSTUNREACH|ENETUNREACH)$/);
    await Promise.all(made.map((s) => n().api.sandboxes.deleteSandbox({ sandboxId: s.sandboxId })));
  });

  test('the CLI: sandbox create --allow-out X --block-all, sandbox network ID --allow-out Y, sandbox url ID 8080', async () => {
    const c = n().cli(['sandbox', 'create', '--allow-out', inet.names.allowed, '--block-all', '--json']);
    expect(c.stderr).toBe('');
    expect(c.status).toBe(0);
    const made = JSON.parse(c.stdout) as { id: string; access_token: string; network: { address: string; egress: Egress } };
    expect(made.network.egress).toEqual({ allowOut: [inet.names.allowed], blockAll: true });
    expect(made.access_token).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(await echo(n(), made.id, inet.address)).toBe('');

    const u = n().cli(['sandbox', 'network', made.id, '--allow-out', `${inet.address}/32`, '--json']);
    expect(u.status).toBe(0);
    expect((JSON.parse(u.stdout) as { egress: Egress }).egress).toEqual({ allowOut: [`${inet.address}/32`] });
    expect(await echo(n(), made.id, inet.address)).toBe('hi\n');
    const shown = n().cli(['sandbox', 'network', made.id]);
    expect(shown.stdout).toContain(`allow out     ${inet.address}/32`);

    const url = n().cli(['sandbox', 'url', made.id, '8080']);
    expect(url.status).toBe(0);
    const first = url.stdout.split('\n')[0]!;
    expect(first).toBe(`http://8080-${made.id}.localhost:${n().dirs.network!.ingressListen!.split(':')[1]}`);
    expect(url.stdout).toContain('header sandnode-access-token');
    // and the form for clients that cannot resolve *.localhost (newcomer: Node fetch, wget got ENOTFOUND)
    expect(url.stdout).toContain(
      `without a *.localhost resolver (Node fetch, wget): http://127.0.0.1:${n().dirs.network!.ingressListen!.split(':')[1]}/ with headers sandnode-sandbox-id: ${made.id}, sandnode-sandbox-port: 8080`,
    );
    await serve(n(), made.id);
    expect(await ingressGet(n(), made.id, made.access_token)).toEqual({ status: 200, body: `hello from ${made.id}` });
    await n().api.sandboxes.deleteSandbox({ sandboxId: made.id });
  });

  test("down --purge (purgeNode) leaves no table, iface, netns mount or DOCKER-USER rule of the node's", async () => {
    const { sb } = await createNet(n());
    expect(await echo(n(), sb.sandboxId, inet.address)).toBe('hi\n');
    const tag = n().dirs.network!.tag!;
    const runDir = n().dirs.runDir;
    const docker = spawnSync('iptables', ['-w', '-S', 'DOCKER-USER'], { encoding: 'utf8' });
    if (docker.status === 0) expect(docker.stdout).toContain(`-i sn${tag}v+ -j ACCEPT`);
    await n().stop(); // deletes the sandboxes, stops the daemons, purgeNode
    node = undefined;
    expect(spawnSync('nft', ['list', 'table', 'inet', `sandnode-${tag}`], { stdio: 'ignore' }).status).not.toBe(0);
    expect(execFileSync('ip', ['-o', 'link', 'show'], { encoding: 'utf8' })).not.toMatch(new RegExp(`: sn${tag}v\\d+[@:]`));
    expect(readFileSync('/proc/self/mountinfo', 'utf8')).not.toContain(path.join(runDir, 'netns'));
    if (docker.status === 0) expect(spawnSync('iptables', ['-w', '-S', 'DOCKER-USER'], { encoding: 'utf8' }).stdout).not.toContain(`sn${tag}v+`);
  });
});
