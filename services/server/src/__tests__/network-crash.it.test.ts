/**
 * Crashes around a networked sandbox's slot (issue 12 §4): a DRAINED sandbox's reserved slot
 * survives kill -9 of the server and of the vmm-supervisor (it resumes on the same address with
 * its token); a server killed in ResetRootfs after the VM stopped resumes the sandbox on the same
 * address; a server killed in ForkSandbox after the clones leaves no slot of the half-made child.
 * After each: every slot the supervisor lists is owned by a sandbox record, the user's services
 * (DNS through the resolver, the domain proxy, ingress) work on the adopted node.
 */
import http from 'node:http';
import { Status } from 'nice-grpc';
import { createSandnodeChannel, createServiceClient, socketPath, unixAddress } from '@sandnode/shared';
import { SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { VmServiceDefinition } from '@sandnode/shared/proto/vmm/v1/vmm';
import { findRunning, killComponent, startComponent } from '@sandnode/node-stack';
import { describeNode, execCollect, killProcesses, serverProcesses, startNode, startTestInternet, waitFor, withEnv, type TestInternet, type TestNode } from '@sandnode/testkit';

jest.setTimeout(300_000);

/** fetchIn GETs url from inside the sandbox and gives "status body" or "error <code>". */
async function fetchIn(node: TestNode, id: string, url: string): Promise<string> {
  const js = `require('http').get(${JSON.stringify(url)},{timeout:5000},r=>{let b='';r.on('data',c=>b+=c);r.on('end',()=>console.log(r.statusCode+' '+b))}).on('error',e=>console.log('error '+(e.code||e.message))).on('timeout',function(){console.log('error timeout');this.destroy()})`;
  return (await execCollect(node.api, id, ['node', '-e', js], { timeoutMs: 30_000 })).stdout.trim();
}

async function serve(node: TestNode, id: string): Promise<void> {
  await execCollect(node.api, id, ['/bin/busybox', 'sh', '-c', `node -e "require('http').createServer((q,s)=>s.end('hello from '+require('os').hostname())).listen(8080)" >/dev/null 2>&1 &`]);
  await waitFor(`the web server in ${id}`, async () => (await fetchIn(node, id, 'http://127.0.0.1:8080/')).startsWith('200 '), 30_000, 100);
}

function ingressGet(node: TestNode, id: string, token?: string): Promise<{ status: number; body: string }> {
  const [host, port] = node.dirs.network!.ingressListen!.split(':');
  return new Promise((resolve, reject) => {
    const headers = { 'sandnode-sandbox-id': id, 'sandnode-sandbox-port': '8080', ...(token ? { 'sandnode-access-token': token } : {}) };
    http
      .get({ host, port: Number(port), path: '/', headers, agent: false }, (res) => {
        let body = '';
        res.on('data', (c: Buffer) => (body += c.toString()));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      })
      .on('error', reject);
  });
}

/** slotOwners lists "<slot> <state> <owner>" of every slot the supervisor has that is not a spare. */
async function slotOwners(node: TestNode): Promise<{ slot: number; owner: string }[]> {
  const ch = createSandnodeChannel(unixAddress(socketPath(node.dirs.runDir, 'vmm-supervisor')));
  try {
    const r = await createServiceClient(VmServiceDefinition, ch, { timeoutMs: 10_000 }).listNetworkSlots({});
    return r.slots.filter((s) => s.owner !== '').map((s) => ({ slot: s.slot, owner: s.owner }));
  } finally {
    ch.close();
  }
}

describeNode('crashes around a networked sandbox', () => {
  let node: TestNode;
  let inet: TestInternet;

  beforeAll(async () => {
    inet = await startTestInternet();
    node = await startNode({ buildTemplate: true, network: true, env: { server: { SANDNODE_SERVER_DNS_UPSTREAMS: `${inet.dns.address}:${inet.dns.port}` } } });
  });
  afterAll(async () => {
    await node?.stop();
    await inet?.stop();
  });

  async function restartServer(failpoint = ''): Promise<void> {
    await killProcesses(serverProcesses(node.dirs.runDir), 0);
    // startNode's env is for the first start only: the upstreams again
    await withEnv({ SANDNODE_SERVER_FAILPOINTS: failpoint, SANDNODE_SERVER_DNS_UPSTREAMS: `${inet.dns.address}:${inet.dns.port}` }, () => startComponent(node.dirs, 'server', { timeoutMs: 60_000 }));
    node.reconnect();
  }

  /** sane: every owned slot belongs to a record, at the record's slot; a domain-policy sandbox resolves and fetches through the proxy. */
  async function sane(): Promise<void> {
    const records = (await node.api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes;
    const bySlot = new Map(records.filter((r) => r.network).map((r) => [r.network!.slot, r.sandboxId]));
    for (const s of await slotOwners(node)) expect(`${s.slot} ${s.owner}`).toBe(`${s.slot} ${bySlot.get(s.slot)}`);
    const r = await node.api.sandboxes.createSandbox({
      template: 'base',
      timeoutSeconds: 0,
      metadata: {},
      requestId: '',
      network: { disabled: false, egress: { allowOut: [inet.names.allowed], denyOut: [], blockAll: true }, public: false },
    });
    const got = await fetchIn(node, r.sandbox!.sandboxId, `http://${inet.names.allowed}/`);
    expect(got).toMatch(/^200 /);
    await node.api.sandboxes.deleteSandbox({ sandboxId: r.sandbox!.sandboxId });
  }

  test('a DRAINED sandbox keeps its slot through kill -9 of the server and the vmm-supervisor, and resumes on it with its token', async () => {
    const r = await node.api.sandboxes.createSandbox({ template: 'base', timeoutSeconds: 0, metadata: {}, requestId: '', network: undefined });
    const sb = r.sandbox!;
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
    expect(await ingressGet(node, sb.sandboxId, r.accessToken)).toEqual({ status: 200, body: `hello from ${sb.sandboxId}` });
    await sane();
    await node.api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });

  test('a server killed in ResetRootfs after the VM stopped: the sandbox resumes on the same address', async () => {
    const sb = (await node.api.sandboxes.createSandbox({ template: 'base', timeoutSeconds: 0, metadata: {}, requestId: '', network: undefined })).sandbox!;
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
    const parent = (await node.api.sandboxes.createSandbox({ template: 'base', timeoutSeconds: 0, metadata: {}, requestId: '', network: undefined })).sandbox!;
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
