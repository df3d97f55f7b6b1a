/**
 * Sandbox networking end to end on a whole node (issue 12 §5): real netns, veth and nftables
 * made by the vmm-supervisor, the server's resolver, egress proxy and ingress, a test
 * "internet" in a netns of its own. What a sandbox user sees: names resolve, the internet is
 * reachable, private ranges are not, domain rules hold (403 naming the rule), a policy change
 * applies live, ingress reaches a server in the sandbox with its token only, and all of it
 * keeps working across a server handover; delete and purge leave nothing on the host.
 */
import { spawnSync } from 'node:child_process';
import { upgradeServer } from '@sandnode/node-stack';
import type { ExecStreamRequest } from '@sandnode/shared/proto/server/v1/sandbox';
import { describeNode, startNode, startTestInternet, waitFor, type TestInternet, type TestNode } from '@sandnode/testkit';
import { create, fetchIn, httpGet, serve, serverDnsEnv, sh } from './network-helpers';

jest.setTimeout(240_000);

describeNode('sandbox network end to end', () => {
  let node: TestNode;
  let inet: TestInternet;

  beforeAll(async () => {
    inet = await startTestInternet({ records: { 'meta.test': '169.254.169.254' } });
    node = await startNode({ buildTemplate: true, network: true, env: { server: serverDnsEnv(inet) } });
  });
  afterAll(async () => {
    await node?.stop();
    await inet?.stop();
  });

  test('default policy: names resolve, the internet answers, private and metadata ranges do not', async () => {
    const { sb } = await create(node, { disabled: false, egress: undefined, public: false });
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
    const { sb } = await create(node, { disabled: false, egress: { allowOut: [inet.names.allowed], denyOut: [], blockAll: true }, public: false });
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

  test('a live deny cuts connections already open: nothing more passes on the kernel path (echo) or through the egress proxy (HTTP)', async () => {
    const { sb } = await create(node, undefined);
    for (const port of [7, 80]) {
      // nc in the sandbox on one connection, fed through an ExecStream: a line before the deny, one after
      const lines: string[] = [];
      let wake: (() => void) | undefined;
      const feed = (l: string) => {
        lines.push(l);
        wake?.();
      };
      let closed = false;
      const requests = (async function* (): AsyncIterable<ExecStreamRequest> {
        yield {
          input: {
            $case: 'start',
            value: { sandboxId: sb.sandboxId, argv: ['/bin/busybox', 'nc', inet.address, String(port)], env: {}, cwd: '', timeoutMs: 30_000, pty: false, detachKeepMs: 0, size: undefined },
          },
        };
        for (;;) {
          while (lines.length) yield { input: { $case: 'stdin', value: Buffer.from(lines.shift()!) } };
          if (closed) return;
          await new Promise<void>((r) => (wake = r));
        }
      })();
      let out = '';
      let exited = false;
      const done = (async () => {
        for await (const ev of node.api.sandboxes.execStream(requests)) {
          if (ev.event?.$case === 'stdout') out += Buffer.from(ev.event.value).toString('latin1');
          if (ev.event?.$case === 'exit') exited = true;
        }
      })();
      const ask = (tag: string) => (port === 80 ? `GET /${tag} HTTP/1.1\r\nHost: ${inet.names.allowed}\r\n\r\n` : `${tag}\n`);
      feed(ask('before'));
      await waitFor(`an answer on port ${port} before the deny`, () => (port === 80 ? /\r\n\r\n/.test(out) : out.includes('before\n')) || undefined, 10_000);
      const seen = out.length;
      await node.api.sandboxes.updateSandboxNetwork({ sandboxId: sb.sandboxId, egress: { allowOut: [], denyOut: [`${inet.address}/32`], blockAll: false }, public: undefined });
      feed(ask('after'));
      // the connection is cut (nc exits) or stays silent: either way not one byte of an answer
      await waitFor(`nc on port ${port} to end after the deny`, () => exited || undefined, 15_000).catch(() => undefined);
      expect({ port, after: out.slice(seen) }).toEqual({ port, after: '' });
      closed = true;
      wake?.();
      await done.catch(() => undefined);
      await node.api.sandboxes.updateSandboxNetwork({ sandboxId: sb.sandboxId, egress: { allowOut: [], denyOut: [], blockAll: false }, public: undefined });
    }
    await node.api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });

  test('ingress reaches a server in the sandbox with its token only, before and after a server handover', async () => {
    const { sb, token } = await create(node);
    expect(token).toMatch(/^[A-Za-z0-9_-]{43}$/);
    const url = new URL(sb.network!.ingressUrl.replace('{port}', '8080'));
    const listen = `127.0.0.1:${url.port}`;
    // a web server inside, on all addresses
    await serve(node, sb.sandboxId);
    // by name (Host 8080-<id>.localhost) at the port of the sandbox's ingress URL
    const host = url.host.replace(/:\d+$/, '');
    const ingressGet = (t?: string) => httpGet(listen, { host, ...(t ? { 'sandnode-access-token': t } : {}) });
    expect(await ingressGet(token)).toEqual({ status: 200, body: `hello from ${sb.sandboxId}` });
    expect((await ingressGet()).status).toBe(401);
    expect((await ingressGet('x'.repeat(43))).status).toBe(401);
    // the token is the only way in for the host's users: a non-root process that connects to
    // the sandbox's address directly is refused at once; root (the server) gets through
    const direct = `require('http').get('http://${sb.network!.address}:8080/',r=>{r.resume();console.log('status '+r.statusCode)}).on('error',e=>console.log('error '+e.code))`;
    const asNobody = spawnSync('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', process.execPath, '-e', direct], { encoding: 'utf8', timeout: 20_000 });
    expect(asNobody.stdout.trim()).toMatch(/^error (ECONNREFUSED|ECONNRESET|EHOSTUNREACH)/);
    expect(spawnSync(process.execPath, ['-e', direct], { encoding: 'utf8', timeout: 20_000 }).stdout.trim()).toBe('status 200');

    const up = await upgradeServer(node.dirs, '.');
    // the report names every listener the new server took over, the named ones too
    expect(up.listeners).toEqual(expect.arrayContaining([expect.stringMatching(/^unix:\/\//), expect.stringMatching(/^ingress tcp \S+:\d+$/)]));
    node.reconnect();
    expect(await ingressGet(token)).toEqual({ status: 200, body: `hello from ${sb.sandboxId}` });
    const ns = await sh(node, sb.sandboxId, `nslookup ${inet.names.allowed} 2>&1`);
    expect(ns.stdout).toContain(inet.address);
    await node.api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });
});
