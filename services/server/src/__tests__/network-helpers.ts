/**
 * What the whole-node network tests (network-*.it.test.ts) do again and again: start a node whose
 * server resolves through the test internet, run commands and probes inside a sandbox, GET
 * through the node's ingress, and look at what of the node's slots is on the host (veths, netns
 * files, nft chains) and in the vmm-supervisor (ListNetworkSlots).
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { createSandnodeChannel, createServiceClient, socketPath, unixAddress } from '@sandnode/shared';
import { type CreateSandboxRequest, type Sandbox } from '@sandnode/shared/proto/server/v1/sandbox';
import { VmServiceDefinition, type ListNetworkSlotsResponse } from '@sandnode/shared/proto/vmm/v1/vmm';
import { execCollect, startNode, waitFor, type TestInternet, type TestNode } from '@sandnode/testkit';

/** serverDnsEnv is the server's env that makes its resolver ask the test internet's DNS (startNode's env is for the first start only: give it again on a restart). */
export function serverDnsEnv(inet: TestInternet): Record<string, string> {
  return { SANDNODE_SERVER_DNS_UPSTREAMS: `${inet.dns.address}:${inet.dns.port}` };
}

/** startNetworkNode starts a whole node with the base template and network on, its server's DNS upstream the test internet's. */
export function startNetworkNode(inet: TestInternet): Promise<TestNode> {
  return startNode({ buildTemplate: true, network: true, env: { server: serverDnsEnv(inet) } });
}

/** create makes a sandbox from the base template with `network` as given (undefined: the node's default, networked) and gives it with its access token. */
export async function create(node: TestNode, network?: CreateSandboxRequest['network']): Promise<{ sb: Sandbox; token: string }> {
  const r = await node.api.sandboxes.createSandbox({ template: 'base', timeoutSeconds: 0, metadata: {}, requestId: '', network });
  return { sb: r.sandbox!, token: r.accessToken };
}

/** sh runs a busybox shell command in the sandbox (30 s at most). */
export function sh(node: TestNode, id: string, cmd: string): ReturnType<typeof execCollect> {
  return execCollect(node.api, id, ['/bin/busybox', 'sh', '-c', cmd], { timeoutMs: 30_000 });
}

/** echo sends "hi" to host:port from inside the sandbox and gives what came back ("" when refused or dropped, 2 s at most). */
export async function echo(node: TestNode, id: string, host: string, port = 7): Promise<string> {
  return (await sh(node, id, `echo hi | nc -w 2 ${host} ${port}`)).stdout;
}

/**
 * fetchIn GETs url from inside the sandbox with node (the template's; busybox wget is static and
 * cannot resolve names), with Host `host` when given, and gives "status body" or "error <code>"
 * (5 s at most for the request).
 */
export async function fetchIn(node: TestNode, id: string, url: string, host?: string): Promise<string> {
  const js = `require('http').get(${JSON.stringify(url)},{headers:${JSON.stringify(host ? { host } : {})},timeout:5000},r=>{let b='';r.on('data',c=>b+=c);r.on('end',()=>console.log(r.statusCode+' '+b))}).on('error',e=>console.log('error '+(e.code||e.message))).on('timeout',function(){console.log('error timeout');this.destroy()})`;
  return (await execCollect(node.api, id, ['node', '-e', js], { timeoutMs: 30_000 })).stdout.trim();
}

/** tcpProbe connects from inside the sandbox to host:port and gives "reached" or "error <code>" (2 s at most). */
export async function tcpProbe(node: TestNode, id: string, host: string, port: number): Promise<string> {
  const js = `require('net').connect(${port},'${host}').setTimeout(2000).on('connect',()=>{console.log('reached');process.exit()}).on('timeout',()=>{console.log('error timeout');process.exit()}).on('error',e=>{console.log('error '+e.code);process.exit()})`;
  return (await execCollect(node.api, id, ['node', '-e', js], { timeoutMs: 30_000 })).stdout.trim();
}

/** serve starts a web server on 0.0.0.0:8080 in the sandbox answering "hello from <hostname>" (the sandbox id), and waits (30 s at most) until it accepts. */
export async function serve(node: TestNode, id: string): Promise<void> {
  await sh(node, id, `node -e "require('http').createServer((q,s)=>s.end('hello from '+require('os').hostname())).listen(8080)" >/dev/null 2>&1 &`);
  await waitFor(`the web server in ${id}`, async () => (await tcpProbe(node, id, '127.0.0.1', 8080)) === 'reached', 30_000, 100);
}

/** httpGet sends GET / to listen ("host:port") with headers, on a connection of its own, and gives the status and body. */
export function httpGet(listen: string, headers: Record<string, string>): Promise<{ status: number; body: string }> {
  const at = listen.lastIndexOf(':');
  return new Promise((resolve, reject) => {
    http
      .get({ host: listen.slice(0, at), port: Number(listen.slice(at + 1)), path: '/', headers, agent: false }, (res) => {
        let body = '';
        res.on('data', (c: Buffer) => (body += c.toString()));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      })
      .on('error', reject);
  });
}

/** ingressGet sends GET / through the node's ingress to port 8080 of sandbox id, naming it by headers, with token when given. */
export function ingressGet(node: TestNode, id: string, token?: string): Promise<{ status: number; body: string }> {
  return httpGet(node.dirs.network!.ingressListen!, { 'sandnode-sandbox-id': id, 'sandnode-sandbox-port': '8080', ...(token ? { 'sandnode-access-token': token } : {}) });
}

/** listSlots asks the node's vmm-supervisor for its network slots (ListNetworkSlots, 10 s at most). */
export async function listSlots(node: TestNode): Promise<ListNetworkSlotsResponse> {
  const ch = createSandnodeChannel(unixAddress(socketPath(node.dirs.runDir, 'vmm-supervisor')));
  try {
    return await createServiceClient(VmServiceDefinition, ch, { timeoutMs: 10_000 }).listNetworkSlots({});
  } finally {
    ch.close();
  }
}

/** slotOnHost says what of slot s is on the host: its netns file, its host veth, its nft chain in the node's table. */
export function slotOnHost(node: TestNode, s: number): { netns: boolean; veth: boolean; chain: boolean } {
  const tag = node.dirs.network!.tag!;
  const veth = spawnSync('ip', ['link', 'show', 'dev', `sn${tag}v${s}`], { stdio: 'ignore' }).status === 0;
  const table = spawnSync('nft', ['list', 'table', 'inet', `sandnode-${tag}`], { encoding: 'utf8' }).stdout;
  return { netns: existsSync(path.join(node.dirs.runDir, 'netns', String(s))), veth, chain: new RegExp(`chain slot-${s} \\{`).test(table) };
}

/** vethSlots lists (ascending) the slots that have a host veth of the node's names (sn<tag>v<slot>). */
export function vethSlots(node: TestNode): number[] {
  const re = new RegExp(`^\\d+: sn${node.dirs.network!.tag!}v(\\d+)[@:]`);
  return execFileSync('ip', ['-o', 'link', 'show'], { encoding: 'utf8' })
    .split('\n')
    .map((l) => re.exec(l)?.[1])
    .filter((x): x is string => x !== undefined)
    .map(Number)
    .sort((a, b) => a - b);
}

/** netnsSlots lists (ascending) the slots that have a netns file in the node's run dir (files named by a slot number; the dir also holds the supervisor's tag file). */
export function netnsSlots(node: TestNode): number[] {
  return readdirSync(path.join(node.dirs.runDir, 'netns'))
    .filter((n) => /^\d+$/.test(n))
    .map(Number)
    .sort((a, b) => a - b);
}
