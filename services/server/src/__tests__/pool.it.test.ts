/**
 * Warm pools on a real node (issue 14 §2): `sandnode pool set` fills a pool with real sandboxes
 * that ListSandboxes and `sandnode status` never show; 50 concurrent creates get each member at
 * most once (one compare-and-swap of its record), distinct ids, and the pool refills to its
 * size; a claimed sandbox has the request's metadata, timeout, request_id, idle settings and env; the pool survives
 * `upgrade server` (handover) and kill -9 of the server (config kept, members adopted, a cut
 * refill torn down, nothing leaked); a member whose VM dies is replaced; a template rebuild
 * retires the template's members; a drain deletes the members rather than preserving them.
 */
import { PoolState } from '@sandnode/shared/proto/server/v1/record';
import { SandboxState, type CreateSandboxResponse } from '@sandnode/shared/proto/server/v1/sandbox';
import { startComponent, upgradeServer } from '@sandnode/node-stack';
import { describeNode, execCollect, inventory, killProcesses, orphans, serverProcesses, startNode, waitFor, type TestNode } from '@sandnode/testkit';
import { poolOf, readyMembers, records, setPool, waitReady } from './pool-helpers';

jest.setTimeout(600_000);

const live = (node: TestNode) => records(node).filter((r) => r.state === SandboxState.SANDBOX_STATE_RUNNING || r.state === SandboxState.SANDBOX_STATE_PAUSED);

describeNode('warm pools on a real node', () => {
  let node: TestNode;
  beforeAll(async () => {
    node = await startNode();
  });
  afterAll(async () => {
    await node?.stop();
  });

  test('pool set fills the pool with real sandboxes that List and status never show', async () => {
    const set = node.cli(['pool', 'set', 'base', '10', '--json']);
    expect({ status: set.status, stderr: set.stderr }).toEqual({ status: 0, stderr: '' });
    expect(JSON.parse(set.stdout)).toMatchObject({ key: 'base', template: 'base', size: 10 });
    await waitReady(node, 'base', 10);
    const members = readyMembers(node, 'base');
    expect(members).toHaveLength(10);
    // the records.db column a claim looks at follows the record
    expect(
      records(node)
        .filter((r) => r.column === 'base')
        .map((r) => r.id),
    ).toEqual(members);
    // members are booted sandboxes: a live VM each, no user's
    expect(live(node).map((r) => r.id)).toEqual(members);
    expect((await node.api.sandboxes.listSandboxes({})).sandboxes).toEqual([]);
    const st = node.cli(['status', '--json']);
    expect(st.status).toBe(0);
    expect((JSON.parse(st.stdout) as { sandboxes: number }).sandboxes).toBe(0);
    const ps = node.cli(['pool', 'status', '--json']);
    expect(ps.status).toBe(0);
    expect((JSON.parse(ps.stdout) as { pools: unknown[] }).pools).toEqual([expect.objectContaining({ key: 'base', size: 10, ready: 10, filling: 0 })]);
  });

  test('50 concurrent creates: each member goes to exactly one caller, ids are distinct, the pool refills to its size', async () => {
    const before = readyMembers(node, 'base');
    expect(before).toHaveLength(10);
    const answers: CreateSandboxResponse[] = await Promise.all(Array.from({ length: 50 }, (_, i) => node.api.sandboxes.createSandbox({ template: 'base', metadata: { caller: String(i) } })));
    const ids = answers.map((a) => a.sandbox!.sandboxId);
    expect(new Set(ids).size).toBe(50);
    // each caller got its own sandbox, with its own metadata
    expect(answers.map((a) => a.sandbox!.metadata.caller)).toEqual(Array.from({ length: 50 }, (_, i) => String(i)));
    const pooled = answers.filter((a) => a.fromPool).map((a) => a.sandbox!.sandboxId);
    // every member that waited was claimed once; no refill could finish while cold creates ran
    expect(pooled.sort()).toEqual([...before].sort());
    const cold = answers.filter((a) => !a.fromPool);
    expect(cold.every((a) => /the pool base is empty/.test(a.poolMiss))).toBe(true);
    expect(answers.filter((a) => a.fromPool).every((a) => a.poolMiss === '')).toBe(true);
    // all 50 are user sandboxes now: listed, none a member
    const listed = (await node.api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes.map((s) => s.sandboxId);
    expect(listed.sort()).toEqual([...ids].sort());
    const recs = new Map(records(node).map((r) => [r.id, r]));
    expect(ids.filter((id) => recs.get(id)?.poolState !== PoolState.POOL_STATE_UNSPECIFIED)).toEqual([]);
    expect(ids.filter((id) => recs.get(id)?.state !== SandboxState.SANDBOX_STATE_RUNNING)).toEqual([]);
    await waitReady(node, 'base', 10);
    const refilled = readyMembers(node, 'base');
    expect(refilled.filter((id) => ids.includes(id))).toEqual([]);
    const p = await poolOf(node, 'base');
    expect([p?.claimed, p?.missed]).toEqual([10, 40]);
    await Promise.all(ids.map((id) => node.api.sandboxes.deleteSandbox({ sandboxId: id })));
  });

  test("a claimed sandbox has the request's metadata, timeout and request_id; a repeat answers the same sandbox", async () => {
    const members = readyMembers(node, 'base');
    const t0 = Date.now();
    const r = await node.api.sandboxes.createSandbox({ template: 'base', metadata: { team: 'pool' }, timeoutSeconds: 600, requestId: 'pool-req-1' });
    const t1 = Date.now();
    const s = r.sandbox!;
    expect([r.fromPool, members.includes(s.sandboxId), s.metadata]).toEqual([true, true, { team: 'pool' }]);
    // the timeout runs from the claim, not from the member's boot
    expect(s.expiresAtMs).toBeGreaterThanOrEqual(t0 + 600_000);
    expect(s.expiresAtMs).toBeLessThanOrEqual(t1 + 600_000);
    expect(s.createdAtMs).toBeGreaterThanOrEqual(t0);
    const again = await node.api.sandboxes.createSandbox({ template: 'base', metadata: { team: 'pool' }, timeoutSeconds: 600, requestId: 'pool-req-1' });
    expect([again.sandbox!.sandboxId, again.fromPool]).toEqual([s.sandboxId, true]);
    expect((await execCollect(node.api, s.sandboxId, ['hostname'])).stdout).toBe(`${s.sandboxId}\n`);
    expect((await node.api.sandboxes.listSandboxes({})).sandboxes.map((x) => x.sandboxId)).toEqual([s.sandboxId]);
    // a create the members cannot give goes cold and says why
    // idle settings come with the claim, their timers counted from it (idle.ts)
    const idled = await node.api.sandboxes.createSandbox({ template: 'base', idle: { pauseAfterS: 300, hibernateAfterS: 0, pausedTtlS: 0 } });
    expect([idled.fromPool, idled.sandbox?.idle?.settings?.pauseAfterS, idled.sandbox?.idle?.nextAction]).toEqual([true, 300, 'pause']);
    await node.api.sandboxes.deleteSandbox({ sandboxId: idled.sandbox!.sandboxId });
    // the request's environment comes with the claim too (applied per command, no reboot)
    const envd = await node.api.sandboxes.createSandbox({ template: 'base', env: { POOL_ENV: 'claimed', SHADOW: 'sandbox' } });
    expect([envd.fromPool, envd.sandbox?.envKeys]).toEqual([true, ['POOL_ENV', 'SHADOW']]);
    const printed = await execCollect(node.api, envd.sandbox!.sandboxId, ['sh', '-c', 'echo "$POOL_ENV $SHADOW"'], { env: { SHADOW: 'call' } });
    expect(printed.stdout).toBe('claimed call\n');
    await node.api.sandboxes.deleteSandbox({ sandboxId: envd.sandbox!.sandboxId });
    const other = await node.api.sandboxes.createSandbox({ template: 'base', resources: { vcpus: 2, memoryMib: 0, diskBytes: 0, pids: 0 } });
    expect([other.fromPool, other.poolMiss]).toEqual([false, "the request's resources differ from those of the pool of base"]);
    await node.api.sandboxes.deleteSandbox({ sandboxId: s.sandboxId });
    await node.api.sandboxes.deleteSandbox({ sandboxId: other.sandbox!.sandboxId });
  });

  test('a smaller size retires the extras; the pool survives upgrade server: config kept, the same members adopted', async () => {
    await setPool(node, { template: 'base', size: 3 });
    await waitReady(node, 'base', 3);
    await waitFor('the extra members deleted', () => records(node).filter((r) => r.poolKey === 'base').length === 3);
    const members = readyMembers(node, 'base').sort();
    node.api.close();
    await upgradeServer(node.dirs, '.');
    node.reconnect();
    expect(await poolOf(node, 'base')).toMatchObject({ size: 3 });
    await waitReady(node, 'base', 3);
    expect(readyMembers(node, 'base').sort()).toEqual(members);
    expect(records(node).map((r) => r.id)).toEqual(members);
    const r = await node.api.sandboxes.createSandbox({ template: 'base' });
    expect([r.fromPool, members.includes(r.sandbox!.sandboxId)]).toEqual([true, true]);
    await node.api.sandboxes.deleteSandbox({ sandboxId: r.sandbox!.sandboxId });
    await waitReady(node, 'base', 3);
  });

  test('kill -9 of the server right after a claim: members adopted, a cut refill torn down, no duplicate, nothing leaked', async () => {
    const members = readyMembers(node, 'base');
    const r = await node.api.sandboxes.createSandbox({ template: 'base' });
    expect(r.fromPool).toBe(true);
    // the refill of the claimed member has started (or is about to): kill -9 now
    node.api.close();
    await killProcesses(serverProcesses(node.dirs.runDir), 0);
    await startComponent(node.dirs, 'server');
    node.reconnect();
    await waitReady(node, 'base', 3);
    const after = readyMembers(node, 'base');
    // the two members that waited are the same ones; exactly size members, whatever the refill was doing
    expect(members.filter((id) => id !== r.sandbox!.sandboxId).every((id) => after.includes(id))).toBe(true);
    expect(records(node).filter((x) => x.poolKey === 'base' && x.poolState !== PoolState.POOL_STATE_UNSPECIFIED)).toHaveLength(3);
    expect((await node.api.sandboxes.listSandboxes({})).sandboxes.map((s) => s.sandboxId)).toEqual([r.sandbox!.sandboxId]);
    const all = records(node);
    expect(
      orphans(
        await inventory(node.dirs),
        live(node).map((x) => x.id),
        all.map((x) => x.id),
      ),
    ).toEqual([]);
    await node.api.sandboxes.deleteSandbox({ sandboxId: r.sandbox!.sandboxId });
  });

  test('a member whose VM dies is replaced', async () => {
    const [victim] = readyMembers(node, 'base');
    const pid = (await node.api.sandboxes.getSandbox({ sandboxId: victim! })).sandbox!.pid;
    process.kill(pid, 'SIGKILL');
    await waitFor('the dead member gone', () => !records(node).some((r) => r.id === victim), 60_000);
    await waitReady(node, 'base', 3);
    expect(readyMembers(node, 'base')).not.toContain(victim);
  });

  test("a template rebuild retires the template's members; the pool refills from the new build; size 0 removes it", async () => {
    await node.api.templates.buildTemplate({ name: 'pooltpl', replace: false });
    await setPool(node, { template: 'pooltpl', size: 2 });
    await waitReady(node, 'pooltpl', 2);
    const old = readyMembers(node, 'pooltpl');
    await node.api.templates.buildTemplate({ name: 'pooltpl', replace: true });
    expect(records(node).filter((r) => old.includes(r.id))).toEqual([]);
    await waitReady(node, 'pooltpl', 2);
    expect(readyMembers(node, 'pooltpl').filter((id) => old.includes(id))).toEqual([]);
    const off = node.cli(['pool', 'set', 'pooltpl', '0']);
    expect(off.status).toBe(0);
    await waitFor('the pooltpl members retired', () => !records(node).some((r) => r.poolKey === 'pooltpl'));
    expect(await poolOf(node, 'pooltpl')).toBeUndefined();
  });

  test('a drain deletes the members instead of preserving them: its report names only user sandboxes (last: it stops the ublk-manager)', async () => {
    await waitReady(node, 'base', 3);
    const u = (await node.api.sandboxes.createSandbox({ template: 'base', metadata: { who: 'user' } })).sandbox!;
    const r = node.cli(['drain', '--json']);
    expect(r.status).toBe(0);
    expect((JSON.parse(r.stdout) as { sandboxes: { id: string; outcome: string }[] }).sandboxes).toEqual([expect.objectContaining({ id: u.sandboxId, outcome: 'PRESERVED' })]);
    // a member whose claim was cut (a loaded host: the create claimed another) is torn down in the
    // background and may still be DELETING when the drain answers (clean-clone CI): it goes soon after
    await waitFor('the pool members deleted', () => records(node).every((x) => x.poolState === PoolState.POOL_STATE_UNSPECIFIED), 30_000);
    expect(records(node).map((x) => x.id)).toEqual([u.sandboxId]);
  });
});
