/**
 * One standby at a time per slot (handover/slot-lock.ts), and the admin sockets of killed
 * servers cleaned up at start (issue 11 [reliability] section 1).
 *
 * Two `sandnode upgrade server` at once: both start a server in the same slot; exactly one
 * takes the node over, the other's server exits before it binds anything and its upgrade says
 * so; afterwards exactly one server answers ACTIVE (`sandnode status` too) and the next upgrade
 * works.
 */
import { spawn } from 'node:child_process';
import { existsSync, readdirSync, rmSync } from 'node:fs';
import path from 'node:path';
import type { TakeoverResult } from '@sandnode/shared';
import { listServers, startComponent, upgradeServer } from '@sandnode/node-stack';
import { SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { describeNode, killProcesses, serverProcesses, startNode, waitFor, type TestNode } from '@sandnode/testkit';
import { SlotLock, slotLockFile } from '../handover/slot-lock';

jest.setTimeout(180_000);

/** the roles of every server that answers, e.g. ["ACTIVE"] */
async function roles(node: TestNode): Promise<string[]> {
  return (await listServers(node.dirs.runDir)).map((s) => s.role).sort();
}

/** A unix socket at p left behind by a process that is gone (listened on, then SIGKILLed). Returns the dead pid. */
async function deadSocket(p: string): Promise<number> {
  const child = spawn(process.execPath, ['-e', `require('net').createServer().listen(${JSON.stringify(p)}, () => console.log('up'))`], { stdio: ['ignore', 'pipe', 'inherit'] });
  await new Promise<void>((resolve) => child.stdout.once('data', () => resolve()));
  const exited = new Promise((r) => child.once('exit', r));
  child.kill('SIGKILL');
  await exited;
  return child.pid!;
}

describeNode('one standby per slot', () => {
  let node: TestNode;

  beforeAll(async () => {
    node = await startNode();
  });
  afterAll(async () => {
    await node?.stop();
  });

  it('two upgrades at once: one takes over, the other says so; one ACTIVE server, the next upgrade works', async () => {
    const sb = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    const oldPid = serverProcesses(node.dirs.runDir)[0]!;
    const results = await Promise.allSettled([upgradeServer(node.dirs, '.', 60_000), upgradeServer(node.dirs, '.', 60_000)]);
    const won = results.filter((r): r is PromiseFulfilledResult<TakeoverResult> => r.status === 'fulfilled');
    const lost = results.filter((r): r is PromiseRejectedResult => r.status === 'rejected');
    console.log(results.map((r) => (r.status === 'fulfilled' ? `took over: new pid ${r.value.newPid}` : `failed: ${(r.reason as Error).message}`)).join('\n'));
    expect(won).toHaveLength(1);
    expect(lost).toHaveLength(1);
    const winner = won[0]!.value;
    expect(winner.oldPid).toBe(oldPid);
    // the loser says what happened: another standby took the node over, and which server is active now
    const msg = (lost[0]!.reason as Error).message;
    expect(msg).toMatch(/another standby of slot b .*is taking over/);
    expect(msg).toContain(`server pid ${winner.newPid} (slot b`);
    expect(msg).not.toMatch(/failed before it took the lease|stays active/);

    // the old server retires; then exactly one server answers, ACTIVE, and it is the winner
    await waitFor('the old server to retire', () => (serverProcesses(node.dirs.runDir).includes(oldPid) ? undefined : true), 30_000);
    expect(await roles(node)).toEqual(['ACTIVE']);
    const active = (await listServers(node.dirs.runDir))[0]!;
    expect(active.holderPid).toBe(winner.newPid);
    expect(active.admin).toMatch(/server-b-admin\.sock$/);
    expect(serverProcesses(node.dirs.runDir)).toEqual([winner.newPid]);
    const status = JSON.parse(node.cli(['status', '--json']).stdout) as { server: { slot: string; pid: number } | null };
    expect(status.server).toMatchObject({ slot: 'b', pid: winner.newPid });

    // the node serves, and the next upgrade (into slot a) works
    node.reconnect();
    expect((await node.api.sandboxes.getSandbox({ sandboxId: sb.sandboxId })).sandbox?.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    const next = await upgradeServer(node.dirs, '.', 60_000);
    expect(next.oldPid).toBe(winner.newPid);
    await waitFor('the previous server to retire', () => (serverProcesses(node.dirs.runDir).includes(winner.newPid) ? undefined : true), 30_000);
    expect(await roles(node)).toEqual(['ACTIVE']);
    node.reconnect();
    expect((await node.api.sandboxes.getSandbox({ sandboxId: sb.sandboxId })).sandbox?.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    await node.api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });

  it('a server removes the admin sockets of servers that are gone at start, never a live one', async () => {
    const run = node.dirs.runDir;
    // gone: a pid-named socket of a dead pid; a slot-named one whose slot nobody holds
    // (a pid that is gone: the process that made a throwaway socket)
    const deadPid = await deadSocket(path.join(run, 'dead-pid-probe.sock'));
    rmSync(path.join(run, 'dead-pid-probe.sock'));
    const stalePid = path.join(run, `server-${deadPid}-admin.sock`);
    await deadSocket(stalePid);
    const staleSlot = path.join(run, 'server-c-admin.sock');
    await deadSocket(staleSlot);
    // kept: a refused socket named by a live pid (ours); a refused one whose slot lock a live process holds
    const livePid = path.join(run, `server-${process.pid}-admin.sock`);
    await deadSocket(livePid);
    const heldSlot = path.join(run, 'server-d-admin.sock');
    await deadSocket(heldSlot);
    const lock = new SlotLock(slotLockFile(run, 'd'));
    expect(lock.tryAcquire()).toBe(true);
    try {
      // a restarted server (no slot) cleans up at start
      node.api.close();
      await killProcesses(serverProcesses(run));
      await startComponent(node.dirs, 'server');
      node.reconnect();
      const names = readdirSync(run).filter((n) => /-admin\.sock$/.test(n));
      expect(existsSync(stalePid)).toBe(false);
      expect(existsSync(staleSlot)).toBe(false);
      expect(existsSync(livePid)).toBe(true);
      expect(existsSync(heldSlot)).toBe(true);
      // the new server's own socket is there and answers ACTIVE
      expect(await roles(node)).toEqual(['ACTIVE']);
      const own = `server-${serverProcesses(run)[0]}-admin.sock`;
      expect(names).toContain(own);
    } finally {
      lock.release();
    }
  });
});
