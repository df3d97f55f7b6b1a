/**
 * kill -9 at each enumerated step of a server handover (ARCHITECTURE.md section 4, step 7;
 * HANDOVER_FAILPOINTS): the side that reaches the failpoint SIGKILLs itself
 * (`SANDNODE_SERVER_FAILPOINTS=<name>=kill`: `handover.*` on the old server, `takeover.*` on the new
 * one). Afterwards the node converges: exactly one server process of the node, holding the
 * lease and ACTIVE (when no server is left, after one `startComponent` as an operator would),
 * every sandbox RUNNING or PAUSED with the same pid, exec and lifecycle calls work, no orphan.
 */
import { ServerRole } from '@sandnode/shared/proto/server/v1/admin';
import { SandboxState, type Sandbox } from '@sandnode/shared/proto/server/v1/sandbox';
import { startComponent, upgradeServer } from '@sandnode/node-stack';
import { HANDOVER_FAILPOINTS } from '../handover/failpoints';
import type { TakeoverResult } from '@sandnode/shared';
import { FlockLease } from '../store/flock-lease';
import {
  adminStatus,
  describeNode,
  execCollect,
  holderStatus,
  inventory,
  killProcesses,
  leaseFile,
  orphans,
  serverProcesses,
  startNode,
  waitFor,
  withEnv,
  type LeaseView,
  type TestNode,
} from '@sandnode/testkit';

jest.setTimeout(180_000);

describeNode('kill -9 at each step of a server handover', () => {
  let node: TestNode;
  let running: Sandbox;
  let paused: Sandbox;

  beforeAll(async () => {
    node = await startNode();
    running = (await node.api.sandboxes.createSandbox({ template: 'base', metadata: { crash: 'running' } })).sandbox!;
    paused = (await node.api.sandboxes.createSandbox({ template: 'base', metadata: { crash: 'paused' } })).sandbox!;
    paused = (await node.api.sandboxes.pauseSandbox({ sandboxId: paused.sandboxId })).sandbox!;
    await node.api.sandboxes.writeFile({ sandboxId: running.sandboxId, path: 'crash.txt', data: Buffer.from('still here') });
  });
  afterAll(async () => {
    await node?.stop();
  });

  /** restartServer replaces every server process of the node by one started with env. */
  async function restartServer(env: Record<string, string>): Promise<void> {
    node.api.close();
    await killProcesses(serverProcesses(node.dirs.runDir));
    await withEnv(env, () => startComponent(node.dirs, 'server'));
    node.reconnect();
  }

  /**
   * converge waits until the node has exactly one live server process that holds the lease and
   * answers ACTIVE. When no server process is left at all, it starts one as an operator would
   * (once). Returns the active server's view and whether the operator had to act.
   */
  async function converge(): Promise<{ view: LeaseView; pid: number; operatorStarted: boolean }> {
    let operatorStarted = false;
    return waitFor(
      'the node to converge on one ACTIVE server holding the lease',
      async () => {
        const pids = serverProcesses(node.dirs.runDir);
        if (pids.length === 0 && !operatorStarted) {
          operatorStarted = true;
          await startComponent(node.dirs, 'server');
          return undefined;
        }
        const holder = FlockLease.readHolder(leaseFile(node.dirs));
        const held = FlockLease.isHeld(leaseFile(node.dirs));
        const view = holder && held ? await adminStatus(holder.admin) : undefined;
        if (pids.length === 1 && held && holder?.pid === pids[0] && view?.role === ServerRole.SERVER_ROLE_ACTIVE && view.holderPid === pids[0]) {
          return { view, pid: pids[0]!, operatorStarted };
        }
        // thrown, so the timeout names what the node looked like last
        throw new Error(JSON.stringify({ pids, held, holderPid: holder?.pid, role: view ? ServerRole[view.role] : null }));
      },
      30_000,
      100,
    );
  }

  it.each([...HANDOVER_FAILPOINTS])('converges after kill -9 at %s', async (fp) => {
    const oldSide = fp.startsWith('handover.');
    const env = { SANDNODE_SERVER_FAILPOINTS: `${fp}=kill` };
    // a fresh active server; it carries the failpoint when the old side is to die
    await restartServer(oldSide ? env : {});
    const before = (await holderStatus(node.dirs))!;
    expect(before.role).toBe(ServerRole.SERVER_ROLE_ACTIVE);
    const oldPid = serverProcesses(node.dirs.runDir)[0]!;

    // the upgrade: the new server gets the failpoint through the environment it inherits
    let upgrade!: Promise<TakeoverResult>;
    await withEnv(oldSide ? {} : env, async () => {
      upgrade = upgradeServer(node.dirs, '.', 60_000); // spawns before its first await
    });
    const outcome = await upgrade.then(
      (r) => `returned (new pid ${r.newPid}, epoch ${r.epoch})`,
      (e: Error) => `failed: ${e.message.split('\n')[0]}`,
    );
    const c = await converge();
    const after = (await holderStatus(node.dirs))!;
    console.log(`${fp}: upgrade ${outcome}; converged on pid ${c.pid} (old ${oldPid}) epoch ${before.epoch} -> ${after.epoch}${c.operatorStarted ? ' after an operator start' : ''}`);

    if (!oldSide) {
      // the new server died: the upgrade failed and the old one stays (step 6), having taken
      // the lease back
      expect(outcome).toMatch(/^failed/);
      expect(c.operatorStarted).toBe(false);
      expect(c.pid).toBe(oldPid);
    } else {
      // the old server died mid-handover: the new one takes the node over as a failover would
      // (with the old listening sockets when they had arrived), no operator needed
      expect(outcome).toMatch(/^returned/);
      expect(c.operatorStarted).toBe(false);
      expect(c.pid).not.toBe(oldPid);
    }
    expect(after.epoch).toBeGreaterThan(before.epoch);

    // every sandbox as it was, same pid; exec and a lifecycle call (the gate is open) work
    const api = node.reconnect();
    const r = (await api.sandboxes.getSandbox({ sandboxId: running.sandboxId })).sandbox!;
    const p = (await api.sandboxes.getSandbox({ sandboxId: paused.sandboxId })).sandbox!;
    expect([r.state, r.pid]).toEqual([SandboxState.SANDBOX_STATE_RUNNING, running.pid]);
    expect([p.state, p.pid]).toEqual([SandboxState.SANDBOX_STATE_PAUSED, paused.pid]);
    const all = (await api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes;
    expect(all.map((s) => s.sandboxId).sort()).toEqual([running.sandboxId, paused.sandboxId].sort());
    expect((await execCollect(api, running.sandboxId, ['cat', 'crash.txt'])).stdout).toBe('still here');
    await api.sandboxes.setTimeout({ sandboxId: paused.sandboxId, timeoutSeconds: 0 });

    // no orphan: nothing on the host without a record, nothing of a record missing
    const inv = await inventory(node.dirs);
    expect(orphans(inv, [running.sandboxId, paused.sandboxId], [running.sandboxId, paused.sandboxId])).toEqual([]);
    expect(inv.devices).toHaveLength(4);
    expect(inv.loopBackingFiles).toHaveLength(4);
  });

  it('the active server killed -9 while the standby boots: the upgrade takes the node over as a failover, no operator (attacker: no server was left, 3 of 3)', async () => {
    await restartServer({});
    const before = (await holderStatus(node.dirs))!;
    const oldPid = serverProcesses(node.dirs.runDir)[0]!;
    const upgrade = upgradeServer(node.dirs, '.', 60_000).then(
      (r) => `returned (new pid ${r.newPid}, epoch ${r.epoch})`,
      (e: Error) => `failed: ${e.message.split('\n')[0]}`,
    );
    // the standby's process is there (booting, niced, before it asks anything): the active one dies
    await waitFor('the standby process', async () => (serverProcesses(node.dirs.runDir).length >= 2 ? true : undefined), 20_000, 10);
    process.kill(oldPid, 'SIGKILL');
    const outcome = await upgrade;
    const c = await converge();
    console.log(`killed while the standby booted: upgrade ${outcome}; converged on pid ${c.pid} (old ${oldPid})`);
    expect(outcome).toMatch(/^returned/);
    expect(c.operatorStarted).toBe(false);
    expect(c.pid).not.toBe(oldPid);
    expect((await holderStatus(node.dirs))!.epoch).toBeGreaterThan(before.epoch);
    const api = node.reconnect();
    const r = (await api.sandboxes.getSandbox({ sandboxId: running.sandboxId })).sandbox!;
    expect([r.state, r.pid]).toEqual([SandboxState.SANDBOX_STATE_RUNNING, running.pid]);
    expect((await execCollect(api, running.sandboxId, ['cat', 'crash.txt'])).stdout).toBe('still here');
  });
});
