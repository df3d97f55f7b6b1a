/**
 * A whole node's metrics and logs (issue 15 §2), scraped over HTTP as Prometheus would:
 *   - every daemon serves /metrics (on the free loopback ports the testkit gives it; the
 *     defaults are 127.0.0.1:9464/9465/9466) with go-grpc-prometheus names and labels after a
 *     create, an exec and a delete, sandnode_build_info, sandboxes by state and unprefixed
 *     process_* / nodejs_*; `up` and `status --json` list the URLs;
 *   - the server's /metrics survives two `upgrade server`: the same URL answers, from the new
 *     process (its own counters, the status file naming its pid, build_info its commit);
 *   - log lines are JSON with string levels, and the server's sandbox lines carry sandbox_id,
 *     epoch and rpc;
 *   - a metrics port in use does not stop a daemon: it serves gRPC, says why in its log and in
 *     `status --json`, and serves /metrics once the port is free.
 */
import net from 'node:net';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { getVersion, startComponent, stopComponent, upgradeServer, type Component } from '@sandnode/node-stack';
import { readMetricsStatus } from '@sandnode/shared';
import { describeNode, execCollect, holderStatus, startNode, waitFor, withEnv, type TestNode } from '@sandnode/testkit';

jest.setTimeout(600_000);

const SANDBOX = 'sandnode.server.v1.SandboxService';
const COMPONENTS: Component[] = ['vmm-supervisor', 'ublk-manager', 'server'];

/** scrape GETs url; the exposition text (throws on a status other than 200). */
async function scrape(url: string): Promise<string> {
  const r = await fetch(url);
  if (r.status !== 200) throw new Error(`GET ${url}: ${r.status}`);
  return r.text();
}

/** sample is the value of the series `name{labels}` with exactly those labels (undefined: absent). */
function sample(text: string, name: string, labels: Record<string, string>): number | undefined {
  for (const line of text.split('\n')) {
    if (Object.keys(labels).length === 0 && line.startsWith(`${name} `)) return Number(line.slice(name.length + 1));
    if (!line.startsWith(`${name}{`)) continue;
    const got = Object.fromEntries([...line.slice(name.length + 1, line.lastIndexOf('}')).matchAll(/(\w+)="([^"]*)"/g)].map((m) => [m[1], m[2]]));
    if (Object.keys(got).length === Object.keys(labels).length && Object.entries(labels).every(([k, v]) => got[k] === v)) return Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return undefined;
}

/** logLines: the JSON lines of a component log (other lines, e.g. a ready line on stdout, are JSON too or skipped). */
function logLines(node: TestNode, file: string): Record<string, unknown>[] {
  return readFileSync(path.join(node.dirs.runDir, 'logs', file), 'utf8')
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as Record<string, unknown>)
    .filter((l) => 'msg' in l);
}

describeNode('metrics and logs of a whole node', () => {
  let node: TestNode;
  let sandboxId = '';
  beforeAll(async () => {
    node = await startNode();
  });
  afterAll(async () => {
    await node?.stop();
  });

  it('every daemon serves /metrics with gRPC, build and process metrics after create, exec, fork and delete; up and status list the URLs', async () => {
    const urls = Object.fromEntries(COMPONENTS.map((c) => [c, node.metricsUrl(c)]));
    for (const u of Object.values(urls)) expect(u).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/metrics$/);
    expect(new Set(Object.values(urls)).size).toBe(3);

    sandboxId = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!.sandboxId;
    const running = await scrape(urls.server!);
    expect(sample(running, 'sandnode_sandboxes', { state: 'RUNNING' })).toBe(1);
    expect((await execCollect(node.api, sandboxId, ['echo', 'hi'])).stdout).toBe('hi\n');
    const child = (await node.api.sandboxes.forkSandbox({ parentId: sandboxId })).sandbox!.sandboxId;
    await node.api.sandboxes.deleteSandbox({ sandboxId: child });
    await node.api.sandboxes.deleteSandbox({ sandboxId });

    const text = Object.fromEntries(await Promise.all(COMPONENTS.map(async (c) => [c, await scrape(urls[c]!)] as const)));
    const server = text.server!;
    const unary = (service: string, method: string) => ({ grpc_type: 'unary', grpc_service: service, grpc_method: method });
    expect(sample(server, 'grpc_server_started_total', unary(SANDBOX, 'CreateSandbox'))).toBe(1);
    expect(sample(server, 'grpc_server_handled_total', { ...unary(SANDBOX, 'CreateSandbox'), grpc_code: 'OK' })).toBe(1);
    expect(sample(server, 'grpc_server_handled_total', { ...unary(SANDBOX, 'DeleteSandbox'), grpc_code: 'OK' })).toBe(2);
    expect(sample(server, 'grpc_server_handled_total', { grpc_type: 'server_stream', grpc_service: SANDBOX, grpc_method: 'Exec', grpc_code: 'OK' })).toBe(1);
    expect(sample(server, 'grpc_server_handling_seconds_count', unary(SANDBOX, 'CreateSandbox'))).toBe(1);
    expect(sample(server, 'grpc_server_handling_seconds_bucket', { ...unary(SANDBOX, 'CreateSandbox'), le: '+Inf' })).toBe(1);
    // the server's calls to its peers, client side
    expect(sample(server, 'grpc_client_handled_total', { ...unary('sandnode.vmm.v1.VmService', 'CreateVm'), grpc_code: 'OK' })).toBeGreaterThanOrEqual(1);
    expect(sample(server, 'grpc_client_handling_seconds_count', unary('sandnode.vmm.v1.VmService', 'CreateVm'))).toBeGreaterThanOrEqual(1);
    expect(sample(server, 'sandnode_sandboxes', { state: 'RUNNING' })).toBe(0);
    // the fork: its duration and the time it held the parent, by method (quiesce on a node with a freeze port, else pause)
    expect(server).toMatch(/^sandnode_fork_seconds_count\{method="(quiesce|pause)"\} 1$/m);
    expect(server).toMatch(/^sandnode_fork_freeze_window_seconds_count\{method="(quiesce|pause)"\} 1$/m);
    expect(sample(server, 'sandnode_adoption_seconds_count', { how: 'start' })).toBe(1);
    // the peers' side of the same calls
    expect(sample(text['vmm-supervisor']!, 'grpc_server_handled_total', { ...unary('sandnode.vmm.v1.VmService', 'CreateVm'), grpc_code: 'OK' })).toBeGreaterThanOrEqual(1);
    expect(sample(text['vmm-supervisor']!, 'grpc_server_handled_total', { ...unary('sandnode.vmm.v1.VmService', 'DeleteVm'), grpc_code: 'OK' })).toBeGreaterThanOrEqual(1);
    // a quiesce fork froze the parent's filesystems through its freeze port once: the supervisor timed it
    if (/^sandnode_fork_seconds_count\{method="quiesce"\}/m.test(server)) expect(sample(text['vmm-supervisor']!, 'sandnode_vmm_freeze_window_seconds_count', { ended_by: 'caller' })).toBe(1);
    else expect(server).toMatch(/^sandnode_fork_seconds_count\{method="pause"\} 1$/m);
    expect(text['ublk-manager']).toMatch(/^grpc_server_handled_total\{grpc_type="unary",grpc_service="sandnode\.ublk\.v1\.DeviceService",grpc_method="(Create|Clone)Device",grpc_code="OK"\} [1-9]/m);
    for (const c of COMPONENTS) {
      const v = (await getVersion(node.dirs, c))!;
      expect({ c, build: sample(text[c]!, 'sandnode_build_info', { component: c, version: v.version, commit: v.commit, node_id: v.nodeId, runtime: v.runtime }) }).toEqual({ c, build: 1 });
      expect(text[c]).toMatch(/^process_cpu_user_seconds_total \d/m);
      expect(text[c]).toMatch(/^process_resident_memory_bytes \d/m);
      expect(text[c]).toMatch(/^nodejs_eventloop_lag_seconds \d/m);
      expect(text[c]).not.toMatch(/^sandnode_(process|nodejs)_|^sandnode_rpc_duration_seconds/m);
    }

    const status = JSON.parse(node.cli(['status', '--json']).stdout) as { components: { name: string; metrics: string | null }[] };
    expect(Object.fromEntries(status.components.map((c) => [c.name, c.metrics]))).toEqual(urls);
    const up = node.cli(['up', '--json']);
    expect(up.status).toBe(0);
    expect(Object.fromEntries((JSON.parse(up.stdout) as { components: { name: string; metrics: string | null }[] }).components.map((c) => [c.name, c.metrics]))).toEqual(urls);
    const table = node.cli(['up']).stdout;
    for (const u of Object.values(urls)) expect(table).toContain(u);
  });

  it('writes JSON log lines with string levels; the sandbox lines carry sandbox_id, epoch and rpc', async () => {
    const all = ['server.log', 'vmm-supervisor.log', 'ublk-manager.log'].flatMap((f) => logLines(node, f));
    expect(all.length).toBeGreaterThan(10);
    expect(all.filter((l) => typeof l.level !== 'string').slice(0, 3)).toEqual([]);
    expect(new Set(all.map((l) => l.level))).toContain('info');
    const server = logLines(node, 'server.log');
    const epoch = (await holderStatus(node.dirs))!.epoch;
    const pick = (msg: string) => server.filter((l) => l.msg === msg && l.sandbox_id === sandboxId).map((l) => ({ sandbox_id: l.sandbox_id, epoch: l.epoch, rpc: l.rpc }));
    expect(pick('sandbox created')).toEqual([{ sandbox_id: sandboxId, epoch, rpc: `/${SANDBOX}/CreateSandbox` }]);
    expect(pick('sandbox deleted')).toEqual([{ sandbox_id: sandboxId, epoch, rpc: `/${SANDBOX}/DeleteSandbox` }]);
    // every server line about that sandbox says which call and epoch it belongs to
    const about = server.filter((l) => l.sandbox_id === sandboxId);
    expect(about.filter((l) => typeof l.rpc !== 'string' || typeof l.epoch !== 'number')).toEqual([]);
  });

  it("keeps the server's /metrics at the same URL across two upgrades, served by the new server", async () => {
    const url = node.metricsUrl('server');
    for (let h = 1; h <= 2; h++) {
      const r = await upgradeServer(node.dirs, '.');
      expect((await holderStatus(node.dirs))?.holderPid).toBe(r.newPid);
      await waitFor('the new server to serve /metrics', () => readMetricsStatus(node.dirs.runDir, 'server')?.pid === r.newPid && readMetricsStatus(node.dirs.runDir, 'server')?.url !== null, 30_000);
      expect(node.metricsUrl('server')).toBe(url);
      const text = await scrape(url);
      const v = (await getVersion(node.dirs, 'server'))!;
      expect(v.pid).toBe(r.newPid);
      expect({ h, build: sample(text, 'sandnode_build_info', { component: 'server', version: v.version, commit: v.commit, node_id: v.nodeId, runtime: v.runtime }) }).toEqual({ h, build: 1 });
      // the new server's own counters: it asked the old one for the handover; the old one's CreateSandbox is not in them
      expect({ h, handover: sample(text, 'grpc_client_handled_total', { grpc_type: 'unary', grpc_service: 'sandnode.server.v1.AdminService', grpc_method: 'Handover', grpc_code: 'OK' }) }).toEqual({
        h,
        handover: 1,
      });
      expect(sample(text, 'grpc_server_started_total', { grpc_type: 'unary', grpc_service: SANDBOX, grpc_method: 'CreateSandbox' })).toBeUndefined();
      expect(sample(text, 'sandnode_adoption_seconds_count', { how: 'takeover' })).toBe(1);
      expect(sample(text, 'sandnode_handover_hold_window_seconds_count', {})).toBe(1);
    }
  });

  it('a metrics port in use does not stop a daemon: it serves gRPC, reports it, and serves /metrics once the port is free', async () => {
    const holder = net.createServer();
    await new Promise<void>((r) => holder.listen(0, '127.0.0.1', () => r()));
    const port = (holder.address() as net.AddressInfo).port;
    await stopComponent(node.dirs, 'vmm-supervisor');
    try {
      const started = await withEnv({ SANDNODE_VMM_SUPERVISOR_METRICS_LISTEN: `127.0.0.1:${port}` }, () => startComponent(node.dirs, 'vmm-supervisor', { timeoutMs: 60_000 }));
      expect((await getVersion(node.dirs, 'vmm-supervisor'))?.pid).toBe(started.pid);
      const st = JSON.parse(node.cli(['status', '--json']).stdout) as { components: { name: string; up: boolean; metrics: string | null; metricsError: string | null }[] };
      expect(st.components.find((c) => c.name === 'vmm-supervisor')).toMatchObject({
        up: true,
        metrics: null,
        metricsError: expect.stringMatching(new RegExp(`127\\.0\\.0\\.1:${port} is in use \\(EADDRINUSE\\)`)),
      });
      expect(node.cli(['up']).stdout).toMatch(new RegExp(`vmm-supervisor.*not served \\(127\\.0\\.0\\.1:${port} is in use`));
      // after the upgrades of the test before, up still names the (new) server's URL
      const up = JSON.parse(node.cli(['up', '--json']).stdout) as { components: { name: string; metrics: string | null }[] };
      expect(up.components.find((c) => c.name === 'server')?.metrics).toBe(node.metricsUrl('server'));
      const errs = logLines(node, 'vmm-supervisor.log').filter((l) => l.pid === started.pid && l.level === 'error' && /cannot serve \/metrics/.test(String(l.msg)));
      expect(errs).toHaveLength(1);
    } finally {
      await new Promise<void>((r) => holder.close(() => r()));
    }
    await waitFor('the vmm-supervisor to bind the freed port', () => readMetricsStatus(node.dirs.runDir, 'vmm-supervisor')?.url === `http://127.0.0.1:${port}/metrics`, 30_000);
    expect(await scrape(`http://127.0.0.1:${port}/metrics`)).toMatch(/^sandnode_build_info\{component="vmm-supervisor"/m);
  });
});
