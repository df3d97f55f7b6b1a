/**
 * Sandbox networking end to end on a whole node (issue 12 §5): real netns, veth and nftables
 * made by the vmm-supervisor, the server's resolver, egress proxy and ingress, a test
 * "internet" in a netns of its own. What a sandbox user sees: names resolve, the internet is
 * reachable, private ranges are not, domain rules hold (403 naming the rule), a policy change
 * applies live, ingress reaches a server in the sandbox with its token only, and all of it
 * keeps working across a server handover; delete and purge leave nothing on the host.
 */
import { spawnSync } from 'node:child_process';
import http from 'node:http';
import { upgradeServer } from '@sandnode/node-stack';
import { describeNode, execCollect, startNode, startTestInternet, type TestInternet, type TestNode } from '@sandnode/testkit';

jest.setTimeout(240_000);

/** sh runs a busybox shell command in the sandbox. */
async function sh(node: TestNode, id: string, cmd: string) {
  return execCollect(node.api, id, ['/bin/busybox', 'sh', '-c', cmd], { timeoutMs: 30_000 });
}

/**
 * fetchIn fetches url from inside the sandbox with node (the template's; busybox wget is static
 * and cannot resolve names) and prints "status body" or "error <code>".
 */
async function fetchIn(node: TestNode, id: string, url: string, host?: string): Promise<string> {
  const script = `const u=new URL(${JSON.stringify(url)});require('http').get({host:u.hostname,port:u.port||80,path:u.pathname,headers:${JSON.stringify(host ? { host } : {})},timeout:5000},r=>{let b='';r.on('data',c=>b+=c);r.on('end',()=>console.log(r.statusCode+' '+b))}).on('error',e=>console.log('error '+(e.code||e.message))).on('timeout',function(){console.log('error timeout');this.destroy()})`;
  const r = await execCollect(node.api, id, ['node', '-e', script], { timeoutMs: 30_000 });
  return r.stdout.trim();
}

/** ingressGet sends GET / to the node's ingress for port-id, with token when given. */
function ingressGet(listen: string, host: string, token?: string): Promise<{ status: number; body: string }> {
  const [h, p] = [listen.slice(0, listen.lastIndexOf(':')), Number(listen.slice(listen.lastIndexOf(':') + 1))];
  return new Promise((resolve, reject) => {
    const req = http.get({ host: h, port: p, path: '/', headers: { host, ...(token ? { 'sandnode-access-token': token } : {}) }, agent: false }, (res) => {
      let body = '';
      res.on('data', (c: Buffer) => (body += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on('error', reject);
  });
}

describeNode('sandbox network end to end', () => {
  let node: TestNode;
  let inet: TestInternet;

  beforeAll(async () => {
    inet = await startTestInternet({ records: { 'meta.test': '169.254.169.254' } });
    node = await startNode({ buildTemplate: true, network: true, env: { server: { SANDNODE_SERVER_DNS_UPSTREAMS: `${inet.dns.address}:${inet.dns.port}` } } });
  });
  afterAll(async () => {
    await node?.stop();
    await inet?.stop();
  });

  test('default policy: names resolve, the internet answers, private and metadata ranges do not', async () => {
    const sb = (await node.api.sandboxes.createSandbox({ template: 'base', timeoutSeconds: 0, metadata: {}, requestId: '', network: { disabled: false, egress: undefined, public: false } })).sandbox!;
    expect(sb.network?.address).toMatch(/^\d{1,3}(\.\d{1,3}){3}$/);
    const ns = await sh(node, sb.sandboxId, `nslookup ${inet.names.allowed} 2>&1`);
    expect(ns.stdout).toContain(inet.address);
    const got = await fetchIn(node, sb.sandboxId, `http://${inet.names.allowed}/hello`);
    expect(got).toMatch(/^200 /);
    expect(JSON.parse(got.slice(4))).toMatchObject({ method: 'GET', path: '/hello', host: inet.names.allowed });
    // refused at once (a reset or ICMP), not left to time out
    expect(await fetchIn(node, sb.sandboxId, 'http://169.254.169.254/')).toMatch(/^error (ECONNREFUSED|ECONNRESET|EHOSTUNREACH|ENETUNREACH)/);
    expect(await fetchIn(node, sb.sandboxId, 'http://10.1.2.3/')).toMatch(/^error (ECONNREFUSED|ECONNRESET|EHOSTUNREACH|ENETUNREACH)/);
    // the host's own addresses: dropped (no answer at all)
    expect(await fetchIn(node, sb.sandboxId, `http://${sb.network!.gateway}:22/`)).toMatch(/^error/);
    await node.api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });

  test('domain rules through the egress proxy, then a live change to block everything', async () => {
    const sb = (
      await node.api.sandboxes.createSandbox({
        template: 'base',
        timeoutSeconds: 0,
        metadata: {},
        requestId: '',
        network: { disabled: false, egress: { allowOut: [inet.names.allowed], denyOut: [], blockAll: true }, public: false },
      })
    ).sandbox!;
    const ok = await fetchIn(node, sb.sandboxId, `http://${inet.names.allowed}/`);
    expect(ok).toMatch(/^200 /);
    expect(JSON.parse(ok.slice(4))).toMatchObject({ host: inet.names.allowed });
    // a name the policy does not allow does not even resolve
    const denied = await sh(node, sb.sandboxId, `nslookup ${inet.names.denied} 2>&1; echo "exit=$?"`);
    expect(denied.stdout).not.toContain(inet.address);
    // the address of the allowed name, asked for by another Host: refused by the proxy with a 403 naming the rule
    const fronted = await fetchIn(node, sb.sandboxId, `http://${inet.address}/`, inet.names.denied);
    expect(fronted).toMatch(/^403 .*block_all/);
    // the echo port is not a proxied port: checked by address in the kernel, refused
    const echo = await sh(node, sb.sandboxId, `echo hi | nc -w 3 ${inet.address} 7; echo "exit=$?"`);
    expect(echo.stdout).not.toContain('hi\n');

    await node.api.sandboxes.updateSandboxNetwork({ sandboxId: sb.sandboxId, egress: { allowOut: [`${inet.address}/32`], denyOut: [], blockAll: true }, public: undefined });
    const echoed = await sh(node, sb.sandboxId, `echo hi | nc -w 3 ${inet.address} 7`);
    expect(echoed.stdout).toBe('hi\n');
    const got = await node.api.sandboxes.getSandbox({ sandboxId: sb.sandboxId });
    expect(got.sandbox?.network?.egress?.allowOut).toEqual([`${inet.address}/32`]);
    await node.api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });

  test('ingress reaches a server in the sandbox with its token only, before and after a server handover', async () => {
    const r = await node.api.sandboxes.createSandbox({ template: 'base', timeoutSeconds: 0, metadata: {}, requestId: '', network: undefined });
    const sb = r.sandbox!;
    expect(r.accessToken).toMatch(/^[A-Za-z0-9_-]{43}$/);
    const url = new URL(sb.network!.ingressUrl.replace('{port}', '8080'));
    const listen = `127.0.0.1:${url.port}`;
    // a web server inside, on all addresses
    await sh(node, sb.sandboxId, `node -e "require('http').createServer((q,s)=>s.end('hello from '+require('os').hostname())).listen(8080)" >/dev/null 2>&1 & sleep 1`);
    const host = url.host.replace(/:\d+$/, '');
    expect(await ingressGet(listen, host, r.accessToken)).toEqual({ status: 200, body: `hello from ${sb.sandboxId}` });
    expect((await ingressGet(listen, host)).status).toBe(401);
    expect((await ingressGet(listen, host, 'x'.repeat(43))).status).toBe(401);
    // the token is the only way in for the host's users: a non-root process that connects to
    // the sandbox's address directly is refused at once; root (the server) gets through
    const direct = `require('http').get('http://${sb.network!.address}:8080/',r=>{r.resume();console.log('status '+r.statusCode)}).on('error',e=>console.log('error '+e.code))`;
    const asNobody = spawnSync('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', process.execPath, '-e', direct], { encoding: 'utf8', timeout: 20_000 });
    expect(asNobody.stdout.trim()).toMatch(/^error (ECONNREFUSED|ECONNRESET|EHOSTUNREACH)/);
    expect(spawnSync(process.execPath, ['-e', direct], { encoding: 'utf8', timeout: 20_000 }).stdout.trim()).toBe('status 200');

    await upgradeServer(node.dirs, '.');
    node.reconnect();
    expect(await ingressGet(listen, host, r.accessToken)).toEqual({ status: 200, body: `hello from ${sb.sandboxId}` });
    const ns = await sh(node, sb.sandboxId, `nslookup ${inet.names.allowed} 2>&1`);
    expect(ns.stdout).toContain(inet.address);
    await node.api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });
});
