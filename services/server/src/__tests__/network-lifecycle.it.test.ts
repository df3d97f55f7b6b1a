/**
 * Sandbox network across the lifecycle on a whole node (issue 12 §4/§5): drain and resume keep
 * the address and the ingress token; fork gives the child its own address and token and the
 * parent's policy (or an override); ResetRootfs keeps the address; delete frees the slot's
 * netns, veth and chain and the slot is handed out again; a failed create leaves no slot taken;
 * 20 concurrent creates get distinct addresses that reach the test host and not each other; the
 * CLI's network commands; and `down --purge` (purgeNode) leaves nothing of the node's network.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { createSandnodeChannel, createServiceClient, socketPath, unixAddress } from '@sandnode/shared';
import { SandboxState, type Sandbox } from '@sandnode/shared/proto/server/v1/sandbox';
import { NetworkSlotState, VmServiceDefinition } from '@sandnode/shared/proto/vmm/v1/vmm';
import { findRunning, startComponent, stopComponent } from '@sandnode/node-stack';
import { describeNode, execCollect, startNode, startTestInternet, waitFor, withEnv, type TestInternet, type TestNode } from '@sandnode/testkit';

jest.setTimeout(300_000);

type Egress = { allowOut: string[]; denyOut: string[]; blockAll: boolean };

async function create(node: TestNode, egress?: Egress, pub = false): Promise<{ sb: Sandbox; token: string }> {
  const r = await node.api.sandboxes.createSandbox({ template: 'base', timeoutSeconds: 0, metadata: {}, requestId: '', network: { disabled: false, egress, public: pub } });
  return { sb: r.sandbox!, token: r.accessToken };
}

/** echo sends a line to host:7 from inside the sandbox and gives what came back ("" when refused). */
async function echo(node: TestNode, id: string, host: string, port = 7): Promise<string> {
  const r = await execCollect(node.api, id, ['/bin/busybox', 'sh', '-c', `echo hi | nc -w 2 ${host} ${port}`], { timeoutMs: 30_000 });
  return r.stdout;
}

/** tcpProbe connects from inside the sandbox to host:port and prints "reached" or "error <code>" (2 s at most). */
async function tcpProbe(node: TestNode, id: string, host: string, port: number): Promise<string> {
  const js = `require('net').connect(${port},'${host}').setTimeout(2000).on('connect',()=>{console.log('reached');process.exit()}).on('timeout',()=>{console.log('error timeout');process.exit()}).on('error',e=>{console.log('error '+e.code);process.exit()})`;
  return (await execCollect(node.api, id, ['node', '-e', js], { timeoutMs: 30_000 })).stdout.trim();
}

/** pol is the plain policy of a SandboxNetwork's egress (no proto bookkeeping fields). */
function pol(e: Egress | undefined): Egress | undefined {
  return e && { allowOut: e.allowOut, denyOut: e.denyOut, blockAll: e.blockAll };
}

/** serve starts a web server on 0.0.0.0:8080 in the sandbox answering "hello from <id>". */
async function serve(node: TestNode, id: string): Promise<void> {
  await execCollect(node.api, id, ['/bin/busybox', 'sh', '-c', `node -e "require('http').createServer((q,s)=>s.end('hello from '+require('os').hostname())).listen(8080)" >/dev/null 2>&1 &`]);
  await waitFor(`the web server in ${id}`, async () => (await tcpProbe(node, id, '127.0.0.1', 8080)) === 'reached', 30_000, 100);
}

/** ingressGet sends GET / through the node's ingress to port 8080 of sandbox id (with token when given). */
function ingressGet(node: TestNode, id: string, token?: string): Promise<{ status: number; body: string }> {
  const [host, port] = node.dirs.network!.ingressListen!.split(':');
  return new Promise((resolve, reject) => {
    const headers = { 'sandnode-sandbox-id': id, 'sandnode-sandbox-port': '8080', ...(token ? { 'sandnode-access-token': token } : {}) };
    const req = http.get({ host, port: Number(port), path: '/', headers, agent: false }, (res) => {
      let body = '';
      res.on('data', (c: Buffer) => (body += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on('error', reject);
  });
}

/** What of slot s is on the host: its netns file, its host veth, its nft chain. */
function slotOnHost(node: TestNode, s: number): { netns: boolean; veth: boolean; chain: boolean } {
  const tag = node.dirs.network!.tag!;
  const veth = spawnSync('ip', ['link', 'show', 'dev', `sn${tag}v${s}`], { stdio: 'ignore' }).status === 0;
  const table = spawnSync('nft', ['list', 'table', 'inet', `sandnode-${tag}`], { encoding: 'utf8' }).stdout;
  return { netns: existsSync(path.join(node.dirs.runDir, 'netns', String(s))), veth, chain: new RegExp(`chain slot-${s} \\{`).test(table) };
}

/** slots lists the supervisor's slots that are not free ({slot, state, owner}). */
async function slots(node: TestNode) {
  const ch = createSandnodeChannel(unixAddress(socketPath(node.dirs.runDir, 'vmm-supervisor')));
  try {
    const r = await createServiceClient(VmServiceDefinition, ch, { timeoutMs: 10_000 }).listNetworkSlots({});
    return { spareTarget: r.spareTarget, slots: r.slots.map((x) => ({ slot: x.slot, state: x.state, owner: x.owner })) };
  } finally {
    ch.close();
  }
}

describeNode('sandbox network across the lifecycle', () => {
  let node: TestNode | undefined;
  let inet: TestInternet;
  const n = () => node!;

  beforeAll(async () => {
    inet = await startTestInternet();
    node = await startNode({ buildTemplate: true, network: true, env: { server: { SANDNODE_SERVER_DNS_UPSTREAMS: `${inet.dns.address}:${inet.dns.port}` } } });
  });
  afterAll(async () => {
    await node?.stop();
    await inet?.stop();
  });

  test('drain then resume: the same address, the ingress token still works, traffic flows', async () => {
    const { sb, token } = await create(n());
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
    const { sb: parent, token: parentToken } = await create(n(), policy);
    const f = await n().api.sandboxes.forkSandbox({ parentId: parent.sandboxId, metadata: {}, timeoutSeconds: 0, maxFreezeMs: 0, requestId: '', network: undefined });
    const child = f.sandbox!;
    expect(child.network?.address).toMatch(/^10\.209\./);
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
    const { sb } = await create(n(), policy);
    const r = (await n().api.sandboxes.resetRootfs({ sandboxId: sb.sandboxId })).sandbox!;
    expect([r.state, r.network?.address, r.network?.slot, pol(r.network?.egress)]).toEqual([SandboxState.SANDBOX_STATE_RUNNING, sb.network!.address, sb.network!.slot, policy]);
    expect(await echo(n(), sb.sandboxId, inet.address)).toBe('hi\n');
    await n().api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });

  test("delete frees the slot's netns, veth and chain, and the slot is handed out again", async () => {
    const { sb } = await create(n());
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
      made.push((await create(n())).sb);
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
      await expect(create(n())).rejects.toMatchObject({ code: expect.any(Number) });
      const after = await slots(n());
      expect(after.slots.filter((x) => x.state !== NetworkSlotState.NETWORK_SLOT_STATE_SPARE)).toEqual(before.slots.filter((x) => x.state !== NetworkSlotState.NETWORK_SLOT_STATE_SPARE));
      const records = (await n().api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes;
      expect(records.filter((r) => r.state !== SandboxState.SANDBOX_STATE_RUNNING)).toEqual([]);
    } finally {
      await stopComponent(n().dirs, 'vmm-supervisor');
      await startComponent(n().dirs, 'vmm-supervisor');
    }
    const { sb } = await create(n());
    expect(await echo(n(), sb.sandboxId, inet.address)).toBe('hi\n');
    await n().api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });

  test('20 networked sandboxes created at once: distinct addresses, each reaches the test host, none reaches another', async () => {
    const made = await Promise.all(Array.from({ length: 20 }, async () => (await create(n())).sb));
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
    await serve(n(), made.id);
    expect(await ingressGet(n(), made.id, made.access_token)).toEqual({ status: 200, body: `hello from ${made.id}` });
    await n().api.sandboxes.deleteSandbox({ sandboxId: made.id });
  });

  test("down --purge (purgeNode) leaves no table, iface, netns mount or DOCKER-USER rule of the node's", async () => {
    const { sb } = await create(n());
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
