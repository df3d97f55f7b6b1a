/**
 * The network scenario of the suite (issue 12 §4, §7), negotiated by features like the server
 * does (never versions), with one sandbox:
 * - server and vmm-supervisor both with their network features ("server.network.v1",
 *   "vmm.network.v1"): a sandbox created with `network` gets an address of the node's pool,
 *   resolves a name of the test internet (the server's dnsUpstreams point at its DNS server),
 *   fetches from its HTTP server, and the ingress answers a server inside with the sandbox's
 *   access token only (401 without);
 * - server with, supervisor without (0.2.0, 0.1.0): CreateSandbox without `network` makes a
 *   sandbox without network, with `network` it is FAILED_PRECONDITION naming the vmm-supervisor
 *   and its version, nothing made (fallback);
 * - server without (an older server ignores the field): the sandbox is made without network
 *   (fallback).
 */
import { randomBytes } from 'node:crypto';
import http from 'node:http';
import type { CreateSandboxRequest } from '@sandnode/shared/proto/server/v1/sandbox';
import { waitFor, type TestInternet } from '@sandnode/testkit';
import type { ServerApi, TempNode } from './node';
import { execCollect, getSandbox, grpcStatusOf, ScenarioError, stateName, type ScenarioBody } from './scenario-kit';

/** The server feature of CreateSandbox's `network` (Sandbox.network, access tokens). */
export const SERVER_NETWORK_FEATURE = 'server.network.v1';
/** The server feature of the ingress listener. */
export const SERVER_INGRESS_FEATURE = 'server.ingress.v1';
/** The supervisor feature of VmSpec.network (the kernel data plane). */
export const VMM_NETWORK_FEATURE = 'vmm.network.v1';
/** The port a server inside the sandbox listens on for the ingress check. */
export const INGRESS_PORT = 8080;

/** createRequest is a CreateSandbox request of template t, with `network` when networked (the default policy, private). */
export function createRequest(t: string, networked: boolean, metadata: Record<string, string> = {}): Partial<CreateSandboxRequest> & { template: string } {
  return {
    template: t,
    metadata: { compat: 'network', ...metadata },
    timeoutSeconds: 0,
    requestId: `compat-${randomBytes(8).toString('hex')}`,
    ...(networked ? { network: { disabled: false, egress: undefined, public: false } } : {}),
  };
}

/** HttpAnswer is an HTTP status and body (status 0 and the error code when the connection failed). */
export interface HttpAnswer {
  status: number;
  body: string;
}

/**
 * ingressGet sends GET / to the ingress listener `listen` ("127.0.0.1:port") with Host `host`
 * and the access token when given; a connection error is status 0 with the code as body.
 */
export function ingressGet(listen: string, host: string, token?: string): Promise<HttpAnswer> {
  const i = listen.lastIndexOf(':');
  return new Promise((resolve) => {
    const req = http.get(
      { host: listen.slice(0, i), port: Number(listen.slice(i + 1)), path: '/', headers: { host, ...(token ? { 'sandnode-access-token': token } : {}) }, agent: false, timeout: 5000 },
      (res) => {
        let body = '';
        res.on('data', (c: Buffer) => (body += c.toString()));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      },
    );
    req.on('timeout', () => req.destroy(Object.assign(new Error('timeout'), { code: 'ETIMEDOUT' })));
    req.on('error', (e: NodeJS.ErrnoException) => resolve({ status: 0, body: e.code ?? e.message }));
  });
}

/** ingressHost is the Host of a sandbox's port from its ingress URL ("http://{port}-sb-….localhost:16400"). */
export function ingressHost(ingressUrl: string, port: number): string {
  return new URL(ingressUrl.replace('{port}', String(port))).hostname;
}

/**
 * startWebServer starts a web server on INGRESS_PORT inside sandbox id (the template's node,
 * detached) answering `body`, and waits until the ingress reaches it (not 502).
 */
export async function startWebServer(api: ServerApi, listen: string, id: string, host: string, token: string, body: string): Promise<void> {
  const js = `require('http').createServer((q,s)=>s.end(${JSON.stringify(body)})).listen(${INGRESS_PORT})`;
  await execCollect(api, id, ['sh', '-c', `node -e "${js.replace(/"/g, '\\"')}" >/dev/null 2>&1 &`]);
  await waitFor(`the web server in ${id} to answer through the ingress`, async () => (await ingressGet(listen, host, token)).status === 200, 15_000, 200);
}

/** What a probe from inside a networked sandbox saw. */
interface InsideProbe {
  /** eth0's addresses */
  addr: string[];
  /** the address the name resolved to, or "error CODE" */
  resolved: string;
  /** "STATUS BODY" of GET http://<name>/hello, or "error CODE" */
  http: string;
}

/** probeInside resolves name and fetches http://name/hello from inside sandbox id (node, which resolves through the sandbox's resolv.conf). */
async function probeInside(api: ServerApi, id: string, name: string): Promise<InsideProbe> {
  const js = `const os=require('os'),dns=require('dns'),http=require('http');const o={addr:(os.networkInterfaces().eth0||[]).map(a=>a.address)};const done=()=>console.log(JSON.stringify(o));dns.lookup(${JSON.stringify(name)},{family:4},(e,a)=>{o.resolved=e?'error '+e.code:a;if(e){o.http='not tried';return done()}http.get({host:${JSON.stringify(name)},port:80,path:'/hello',timeout:5000},r=>{let b='';r.on('data',c=>b+=c);r.on('end',()=>{o.http=r.statusCode+' '+b;done()})}).on('error',e=>{o.http='error '+(e.code||e.message);done()}).on('timeout',function(){this.destroy(new Error('timeout'))})})`;
  const r = await execCollect(api, id, ['node', '-e', js]);
  try {
    return JSON.parse(r.stdout.trim()) as InsideProbe;
  } catch {
    throw new ScenarioError(`${id}: the probe inside printed ${JSON.stringify(r.stdout.slice(0, 300))} (stderr ${JSON.stringify(r.stderr.slice(0, 300))}, exit ${r.exitCode})`, 'podd');
  }
}

/** inPool says whether IPv4 address a is in CIDR pool. */
export function inPool(a: string, pool: string): boolean {
  const [base, len] = pool.split('/');
  const n = (x: string) => x.split('.').reduce((acc, o) => acc * 256 + Number(o), 0);
  const size = 2 ** (32 - Number(len));
  return Math.floor(n(a) / size) === Math.floor(n(base!) / size);
}

/** sandboxIds lists the node's sandbox ids, sorted. */
async function sandboxIds(api: ServerApi): Promise<string[]> {
  return (await api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes.map((s) => s.sandboxId).sort();
}

/**
 * checkNetworked checks the full path on a networked sandbox (see the file header) and returns
 * what it saw; throws ScenarioError naming what failed.
 */
export async function checkNetworked(node: TempNode, inet: TestInternet, id: string, accessToken: string): Promise<string> {
  const api = node.api;
  const s = await getSandbox(api, id);
  const n = s.network;
  if (!n) throw new ScenarioError(`${id}: created with network, but Sandbox.network is unset`);
  const pool = node.pool.settings.pool ?? '';
  if (!inPool(n.address, pool)) throw new ScenarioError(`${id}: address ${n.address} is not in the node's pool ${pool}`, 'vmm-supervisor');
  const p = await probeInside(api, id, inet.names.allowed);
  if (!p.addr.includes(n.address)) throw new ScenarioError(`${id}: eth0 inside has ${JSON.stringify(p.addr)}, the server says ${n.address}`, 'vmm-supervisor');
  if (p.resolved !== inet.address) throw new ScenarioError(`${id}: ${inet.names.allowed} resolved to ${p.resolved} inside, the test internet is ${inet.address}`);
  if (!p.http.startsWith('200 ') || !p.http.includes(`"host":"${inet.names.allowed}"`)) throw new ScenarioError(`${id}: GET http://${inet.names.allowed}/hello gave ${p.http.slice(0, 200)}`);
  if (!n.ingressUrl) throw new ScenarioError(`${id}: no ingress URL although the server has "${SERVER_INGRESS_FEATURE}" and ingressListen ${node.ingressListen}`);
  if (!/^[A-Za-z0-9_-]{43}$/.test(accessToken)) throw new ScenarioError(`${id}: access token ${JSON.stringify(accessToken)} is not 43 base64url characters`);
  const host = ingressHost(n.ingressUrl, INGRESS_PORT);
  const body = `compat ingress ${id}`;
  await startWebServer(api, node.ingressListen, id, host, accessToken, body);
  const ok = await ingressGet(node.ingressListen, host, accessToken);
  if (ok.status !== 200 || ok.body !== body) throw new ScenarioError(`${id}: ingress with the token gave ${ok.status} ${JSON.stringify(ok.body.slice(0, 200))}`);
  const anon = await ingressGet(node.ingressListen, host);
  if (anon.status !== 401) throw new ScenarioError(`${id}: ingress without the token gave ${anon.status} (expected 401: private by default)`);
  return `${id} at ${n.address} (slot ${n.slot}, pool ${pool}); ${inet.names.allowed} -> ${p.resolved}; GET /hello 200 from the test internet; ingress ${host} 200 with the token, 401 without`;
}

/** networkScenario runs the scenario of the file header on template t of opts.node. */
export async function networkScenario(node: TempNode, t: string | undefined, serverLabel: string): Promise<ScenarioBody> {
  if (!t) throw new ScenarioError('skipped: no template');
  const api = node.api;
  const sv = await node.version('server');
  const vv = await node.version('vmm-supervisor');
  const inet = node.inet;
  if (!sv.features.includes(SERVER_NETWORK_FEATURE)) {
    // an older server does not know the field: it is skipped as an unknown field
    const s = (await api.sandboxes.createSandbox(createRequest(t, true))).sandbox;
    if (!s) throw new Error('CreateSandbox: empty answer');
    try {
      if (stateName(s.state) !== 'RUNNING') throw new ScenarioError(`${s.sandboxId}: ${stateName(s.state)}`, 'vmm-supervisor');
      if (s.network) throw new ScenarioError(`${s.sandboxId}: server ${sv.version} lacks "${SERVER_NETWORK_FEATURE}" yet answered a network ${JSON.stringify(s.network)}`);
      const dev = await execCollect(api, s.sandboxId, ['cat', '/proc/net/dev']);
      if (/\beth0:/.test(dev.stdout)) throw new ScenarioError(`${s.sandboxId}: has eth0 although server ${sv.version} asked for no network`, 'vmm-supervisor');
    } finally {
      await api.sandboxes.deleteSandbox({ sandboxId: s.sandboxId });
    }
    return {
      result: 'fallback',
      detail: `server ${serverLabel} (${sv.version}) lacks "${SERVER_NETWORK_FEATURE}": CreateSandbox.network ignored, ${s.sandboxId} made without network (loopback only)`,
    };
  }
  if (!vv.features.includes(VMM_NETWORK_FEATURE)) {
    const plain = (await api.sandboxes.createSandbox(createRequest(t, false))).sandbox;
    if (!plain) throw new Error('CreateSandbox: empty answer');
    try {
      if (plain.network) throw new ScenarioError(`${plain.sandboxId}: vmm-supervisor ${vv.version} lacks "${VMM_NETWORK_FEATURE}" yet the sandbox has a network ${JSON.stringify(plain.network)}`);
    } finally {
      await api.sandboxes.deleteSandbox({ sandboxId: plain.sandboxId });
    }
    const before = await sandboxIds(api);
    try {
      const s = (await api.sandboxes.createSandbox(createRequest(t, true))).sandbox;
      if (s) await api.sandboxes.deleteSandbox({ sandboxId: s.sandboxId });
      throw new ScenarioError(`CreateSandbox with network succeeded (${s?.sandboxId}) although vmm-supervisor ${vv.version} lacks "${VMM_NETWORK_FEATURE}"`);
    } catch (err) {
      if (err instanceof ScenarioError) throw err;
      const msg = (err as Error).message;
      if (grpcStatusOf(err) !== 'FAILED_PRECONDITION' || !msg.includes('vmm-supervisor') || !msg.includes(vv.version)) throw err;
      const after = await sandboxIds(api);
      if (JSON.stringify(after) !== JSON.stringify(before)) throw new Error(`the refused create left sandboxes behind: ${after.filter((x) => !before.includes(x)).join(', ')}`, { cause: err });
      return {
        result: 'fallback',
        detail: `vmm-supervisor ${vv.version} lacks "${VMM_NETWORK_FEATURE}": without network ${plain.sandboxId} made with none; with network FAILED_PRECONDITION (${msg.replace(/^.*?: /, '')}), nothing made`,
      };
    }
  }
  if (!inet) throw new ScenarioError('the node has no test internet (TempNode.startInternet before the server start)');
  const r = await api.sandboxes.createSandbox(createRequest(t, true));
  const s = r.sandbox;
  if (!s) throw new Error('CreateSandbox: empty answer');
  try {
    return { detail: await checkNetworked(node, inet, s.sandboxId, r.accessToken) };
  } finally {
    await api.sandboxes.deleteSandbox({ sandboxId: s.sandboxId });
  }
}
