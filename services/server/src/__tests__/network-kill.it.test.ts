/**
 * The kernel network path of a sandbox outlives every other component (issue 12 §4/§5, issue
 * 13 §3): a sandbox holds one TCP connection to the test internet's echo (kernel NAT, not the
 * egress proxy) and writes a numbered line every 50 ms, checking each echo. While it runs, each
 * component is killed with SIGKILL and started again as an operator would (server, ublk-manager,
 * vmm-supervisor), then the supervisor is restarted cleanly and the devices are handed over to
 * the other ublk-manager slot. What the user sees is counted: lines lost, out of order, the
 * connection closed (all must be 0), the longest echo gap (logged), and after each step the node
 * adopts the sandbox (same pid, same address, same host veth) and a new networked sandbox works.
 */
import { execFileSync } from 'node:child_process';
import { SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { connectServer, killComponent, startComponent, stopComponent, upgradeUblkManager, type Component } from '@sandnode/node-stack';
import { describeNode, execCollect, startTestInternet, waitFor, withEnv, type TestInternet, type TestNode } from '@sandnode/testkit';
import { create, fetchIn, ingressGet, serve, serverDnsEnv, sh, startNetworkNode } from './network-helpers';

jest.setTimeout(300_000);

/** What the pinger in the sandbox reports (/workspace/ping.json, rewritten every 100 ms). */
interface PingStatus {
  sent: number;
  recv: number;
  /** echoed lines that were not the next number expected */
  bad: number;
  /** "" while the connection is open, else how it ended */
  closed: string;
  /** longest time between two echoes, ms */
  maxGapMs: number;
}

/**
 * PINGER connects to argv[2]:7, writes "<n>\n" every 50 ms until /workspace/ping.stop exists,
 * and checks that the echo brings back 0, 1, 2, … in order.
 */
const PINGER = `
const net = require('net'), fs = require('fs');
const st = { sent: 0, recv: 0, bad: 0, closed: '', maxGapMs: 0 };
let buf = '', last = Date.now();
const s = net.connect(7, process.argv[2]);
s.setNoDelay(true);
s.on('data', (d) => {
  buf += d;
  let i;
  while ((i = buf.indexOf('\\n')) >= 0) {
    if (Number(buf.slice(0, i)) !== st.recv) st.bad++;
    buf = buf.slice(i + 1);
    st.recv++;
    const now = Date.now();
    st.maxGapMs = Math.max(st.maxGapMs, now - last);
    last = now;
  }
});
s.on('error', (e) => { st.closed = 'error ' + (e.code || e.message); });
s.on('close', () => { st.closed = st.closed || 'closed'; });
s.on('connect', () => {
  last = Date.now();
  setInterval(() => { if (!st.closed && !fs.existsSync('/workspace/ping.stop')) s.write(st.sent++ + '\\n'); }, 50);
});
setInterval(() => { fs.writeFileSync('/workspace/ping.tmp', JSON.stringify(st)); fs.renameSync('/workspace/ping.tmp', '/workspace/ping.json'); }, 100);
`;

async function pingStatus(node: TestNode, id: string): Promise<PingStatus | undefined> {
  const r = await execCollect(node.api, id, ['/bin/busybox', 'cat', '/workspace/ping.json'], { timeoutMs: 10_000 });
  return r.exitCode === 0 && r.stdout ? (JSON.parse(r.stdout) as PingStatus) : undefined;
}

/** progressed waits until the pinger has had `more` echoes after `from`, and returns its status. */
async function progressed(node: TestNode, id: string, from: number, more = 20): Promise<PingStatus> {
  return waitFor(
    `${more} more echoes after ${from}`,
    async () => {
      const st = await pingStatus(node, id);
      if (st?.closed) throw new Error(`the connection ended: ${st.closed}`);
      return st && st.recv >= from + more ? st : undefined;
    },
    60_000,
    200,
  );
}

/** hostIface is "<ifindex> <name>" of the slot's host veth (the same after an adoption that did not remake it). */
function hostIface(node: TestNode, slot: number): string {
  const name = `sn${node.dirs.network!.tag}v${slot}`;
  const out = execFileSync('ip', ['-o', 'link', 'show', 'dev', name], { encoding: 'utf8' });
  return `${out.split(':')[0]} ${name}`;
}

describeNode('a sandbox connection through the kernel path survives every component', () => {
  let node: TestNode;
  let inet: TestInternet;
  let pinger: { id: string; pid: number; address: string; slot: number; iface: string; token: string };
  /** a sandbox made with the default policy and changed live to a domain allow-list with block_all */
  let ruled: string;

  beforeAll(async () => {
    inet = await startTestInternet();
    node = await startNetworkNode(inet);
    const { sb, token } = await create(node);
    await node.api.sandboxes.writeFile({ sandboxId: sb.sandboxId, path: 'ping.js', data: Buffer.from(PINGER) });
    await sh(node, sb.sandboxId, `node /workspace/ping.js ${inet.address} >/workspace/ping.log 2>&1 &`);
    await serve(node, sb.sandboxId);
    pinger = { id: sb.sandboxId, pid: sb.pid, address: sb.network!.address, slot: sb.network!.slot, iface: hostIface(node, sb.network!.slot), token };
    await waitFor('the ingress to the web server in the pinger', async () => (await ingressGet(node, pinger.id, pinger.token)).status === 200, 30_000, 100);
    await progressed(node, pinger.id, 0);
    ruled = (await create(node)).sb.sandboxId;
    await node.api.sandboxes.updateSandboxNetwork({ sandboxId: ruled, egress: { allowOut: [inet.names.allowed], denyOut: [], blockAll: true }, public: undefined });
    await expectRuled();
  });

  /** expectRuled: the live-changed policy holds (the allowed name through the proxy, the echo by address refused). */
  async function expectRuled(): Promise<void> {
    expect(await fetchIn(node, ruled, `http://${inet.names.allowed}/`)).toMatch(/^200 /);
    expect((await sh(node, ruled, `echo ruled | nc -w 2 ${inet.address} 7`)).stdout).toBe('');
  }
  afterAll(async () => {
    await node?.stop();
    await inet?.stop();
  });

  /**
   * converged checks the node adopted the pinger unchanged (its ingress answers with its token)
   * and makes, uses and deletes a new sandbox whose domain policy needs the server's resolver and
   * egress proxy, and which reaches the echo by address once allowed.
   */
  async function converged(): Promise<void> {
    const g = await waitFor('the pinger sandbox adopted', async () => (await node.api.sandboxes.getSandbox({ sandboxId: pinger.id })).sandbox, 60_000, 200);
    expect([g.state, g.pid, g.network?.address, g.network?.slot]).toEqual([SandboxState.SANDBOX_STATE_RUNNING, pinger.pid, pinger.address, pinger.slot]);
    expect(hostIface(node, pinger.slot)).toBe(pinger.iface);
    await expectRuled();
    expect(await ingressGet(node, pinger.id, pinger.token)).toEqual({ status: 200, body: `hello from ${pinger.id}` });
    const egress = { allowOut: [inet.names.allowed, `${inet.address}/32`], denyOut: [], blockAll: true };
    const fresh = (await create(node, { disabled: false, egress, public: false })).sb;
    expect(fresh.network?.address).not.toBe(pinger.address);
    expect(await fetchIn(node, fresh.sandboxId, `http://${inet.names.allowed}/`)).toMatch(/^200 /);
    expect((await sh(node, fresh.sandboxId, `echo fresh | nc -w 3 ${inet.address} 7`)).stdout).toBe('fresh\n');
    await node.api.sandboxes.deleteSandbox({ sandboxId: fresh.sandboxId });
  }

  const steps: [string, () => Promise<void>][] = [
    ...(['server', 'ublk-manager', 'vmm-supervisor'] as Component[]).map((c): [string, () => Promise<void>] => [
      `kill -9 of ${c}`,
      async () => {
        expect(await killComponent(node.dirs, c)).toBeGreaterThan(0);
        await withEnv(c === 'server' ? serverDnsEnv(inet) : {}, () => startComponent(node.dirs, c));
      },
    ]),
    [
      'a clean restart of vmm-supervisor',
      async () => {
        await stopComponent(node.dirs, 'vmm-supervisor');
        await startComponent(node.dirs, 'vmm-supervisor');
      },
    ],
    [
      'a ublk-manager handover (upgrade ublk)',
      async () => {
        const moved = await upgradeUblkManager(node.dirs, '.');
        expect(moved.devices.filter((d) => d.deviceId.startsWith(pinger.id)).map((d) => d.result)).toEqual(['MOVED', 'MOVED']);
      },
    ],
  ];

  test.each(steps)('%s: the connection keeps flowing, no byte lost or reordered; the node adopts; a new sandbox works', async (name, step) => {
    const before = await progressed(node, pinger.id, 0, 1);
    // what an API user sees meanwhile: GetSandbox every 50 ms (a fresh client each, as a CLI would)
    const seen = { calls: 0, failed: 0, firstFail: 0, lastFail: 0, maxMs: 0 };
    let polling = true;
    const poller = (async () => {
      while (polling) {
        const api = connectServer(node.address, 2000);
        seen.calls++;
        const t0 = Date.now();
        try {
          await api.sandboxes.getSandbox({ sandboxId: pinger.id });
        } catch {
          seen.failed++;
          seen.lastFail = Date.now();
          seen.firstFail ||= seen.lastFail;
        } finally {
          seen.maxMs = Math.max(seen.maxMs, Date.now() - t0);
          api.close();
        }
        await new Promise((r) => setTimeout(r, 50));
      }
    })();
    await step();
    node.reconnect();
    const after = await progressed(node, pinger.id, before.recv);
    polling = false;
    await poller;
    expect([after.bad, after.closed]).toEqual([0, '']);
    console.log(
      `${name}: ${after.recv} lines echoed, ${after.bad} out of order, longest echo gap ${after.maxGapMs} ms; GetSandbox: ${seen.failed} of ${seen.calls} failed over ${seen.failed ? seen.lastFail - seen.firstFail : 0} ms, the slowest took ${seen.maxMs} ms`,
    );
    await converged();
  });

  test('at the end every line sent came back, in order, on the one connection', async () => {
    await execCollect(node.api, pinger.id, ['/bin/busybox', 'touch', '/workspace/ping.stop']);
    const end = await waitFor(
      'the last echoes',
      async () => {
        const st = await pingStatus(node, pinger.id);
        return st && st.recv === st.sent && st.sent > 0 ? st : undefined;
      },
      30_000,
      200,
    );
    console.log(`pinger: sent ${end.sent}, echoed ${end.recv}, out of order ${end.bad}, closed "${end.closed}", longest echo gap ${end.maxGapMs} ms`);
    expect([end.bad, end.closed]).toEqual([0, '']);
  });
});
