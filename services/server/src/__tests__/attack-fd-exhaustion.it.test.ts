/**
 * Attack: a hostile sandbox drives the server to its RLIMIT_NOFILE.
 *
 * A sandbox whose policy has a domain rule has its tcp 80/443 redirected to the server's egress
 * proxy; each connection it opens is a file descriptor in the server (1024 per sandbox at once).
 * Found: while the server was out of descriptors, the reaper could not open /proc/<pid>/stat,
 * took that for "the VM process is gone" and marked every live sandbox of the node ERROR, for
 * good (their VMs kept running, out of the API's reach; a restart keeps them ERROR). Now a
 * /proc read that fails for another reason than ENOENT/ESRCH decides nothing (processLiveness
 * `unknown`, pinned by packages/shared proc.test.ts under a real EMFILE), and the proxy holds
 * at most a share of the server's RLIMIT_NOFILE for the whole node (EGRESS_FD_SHARE_DIVISOR),
 * so the server is never put at its limit this way: this test checks both what a user sees
 * (the sandboxes stay RUNNING and serve) and the server's descriptor count during the flood.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { create, sh } from './network-helpers';
import { describeNode, serverProcesses, startNode, waitFor, type TestNode } from '@sandnode/testkit';

jest.setTimeout(240_000);

/** holdScript keeps n connections to dst:80 open for secs seconds, opening a new one each time one closes. */
function holdScript(n: number, dst: string, secs: number): string {
  return [
    `const net=require('net');let stop=false;`,
    `const one=()=>{const s=net.connect(80,'${dst}');s.on('error',()=>{});s.on('close',()=>{if(!stop)setTimeout(one,20)})};`,
    `for(let i=0;i<${n};i++)one();setTimeout(()=>{stop=true;process.exit(0)},${secs * 1000});`,
  ].join('');
}

describeNode('attack: a sandbox exhausts the server’s file descriptors through the egress proxy', () => {
  let node: TestNode;

  beforeAll(async () => {
    node = await startNode({ buildTemplate: true, network: true });
  });
  afterAll(async () => {
    await node?.stop();
  });

  test('the proxy keeps the server below its descriptor limit, and the sandboxes stay RUNNING', async () => {
    // example.com is never resolved: the flood sends no request, so the proxy only waits for a preamble
    const egress = { allowOut: ['example.com'], denyOut: [], blockAll: false };
    const { sb: attacker } = await create(node, { disabled: false, egress, public: false });
    const { sb: bystander } = await create(node, { disabled: false, egress: undefined, public: false });
    const [server] = serverProcesses(node.dirs.runDir);
    expect(server).toBeGreaterThan(0);
    // leave the server ~400 descriptors: the attacker's 1024 proxied connections use them all up
    const used = readdirSync(`/proc/${server}/fd`).length;
    execFileSync('prlimit', ['--pid', String(server), `--nofile=${used + 400}:${used + 400}`]);

    const js = holdScript(1100, '203.0.113.7', 8).replace(/"/g, '\\"');
    await sh(node, attacker.sandboxId, `ulimit -n 8192; node -e "${js}" >/dev/null 2>&1 &`);
    // the server is at its limit while several reaper rounds (1 s each) run
    // the flood runs 8 s: watch the server's descriptors meanwhile (several reaper rounds of 1 s run)
    const limit = used + 400;
    let most = 0;
    const t0 = Date.now();
    while (Date.now() - t0 < 7000) {
      most = Math.max(most, readdirSync(`/proc/${server}/fd`).length);
      await new Promise((r) => setTimeout(r, 50));
    }
    // the proxy took its share (limit / EGRESS_FD_SHARE_DIVISOR connections) and reset the rest:
    // the server kept descriptors for its API, podd and SQLite (before: it reached its limit)
    expect(most).toBeGreaterThan(used + 50);
    expect(most).toBeLessThan(limit - 100);
    await waitFor('the flood is over', () => readdirSync(`/proc/${server}/fd`).length < used + 100, 30_000);

    for (const sb of [attacker, bystander]) {
      const got = (await node.api.sandboxes.getSandbox({ sandboxId: sb.sandboxId })).sandbox!;
      expect({ id: sb.sandboxId, state: got.state, error: got.errorMessage }).toEqual({ id: sb.sandboxId, state: SandboxState.SANDBOX_STATE_RUNNING, error: '' });
    }
    expect((await sh(node, bystander.sandboxId, 'echo still-here')).stdout).toBe('still-here\n');
    expect(spawnSync('kill', ['-0', String(server)]).status).toBe(0); // the same server serves
    for (const sb of [attacker, bystander]) await node.api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });
});
