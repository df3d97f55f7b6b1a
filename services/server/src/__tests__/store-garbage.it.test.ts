/**
 * Garbage in every store at start (issue 11 §3 store fuzz, "one bad row takes a component, then
 * the node, down"): a real node with two sandboxes is killed (SIGKILL, all three daemons); then
 * records.db, devices.db and the VM table get truncated, `{}`, random, duplicated and
 * newer-schema rows; then the node starts again. It must start, list and run both sandboxes,
 * answer NOT_FOUND (not UNKNOWN) for a garbage row's id, and `sandnode status` must report every
 * quarantined row (count and reason per component, human and --json) and each peer's fence epoch.
 */
import { readdirSync, statSync } from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import { Status } from 'nice-grpc-common';
import { RuntimeRecord } from '@sandnode/shared/proto/server/v1/record';
import { createSandnodeChannel, createServiceClient } from '@sandnode/shared';
import { VmServiceDefinition } from '@sandnode/shared/proto/vmm/v1/vmm';
import { COMPONENTS, componentAddress, killComponent, startComponent } from '@sandnode/node-stack';
import { describeNode, execCollect, expectCode, startNode, writeLeaseRecord, type TestNode } from '@sandnode/testkit';

jest.setTimeout(240_000);

/** findFile is the one file named name below dir (throws naming what it found otherwise). */
function findFile(dir: string, name: string): string {
  const hits: string[] = [];
  const walk = (d: string) => {
    for (const e of readdirSync(d)) {
      const p = path.join(d, e);
      const st = statSync(p, { throwIfNoEntry: false });
      if (st?.isDirectory()) walk(p);
      else if (e === name) hits.push(p);
    }
  };
  walk(dir);
  if (hits.length !== 1) throw new Error(`expected one ${name} below ${dir}, found ${JSON.stringify(hits)}`);
  return hits[0]!;
}

const BAD_SANDBOX = 'sb-00000000deadbeef';

describeNode('a node whose three stores hold garbage rows at start', () => {
  let node: TestNode;
  let ids: string[];

  beforeAll(async () => {
    node = await startNode();
    ids = [];
    for (let i = 0; i < 2; i++) ids.push((await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!.sandboxId);
    await execCollect(node.api, ids[0]!, ['sh', '-c', 'echo kept > /workspace/f']);
    node.api.close();
    for (const c of [...COMPONENTS].reverse()) await killComponent(node.dirs, c);

    const records = new Database(findFile(node.dirs.stateDir, 'records.db'));
    const good = records.prepare<[string], { record: Buffer }>('SELECT record FROM records WHERE sandbox_id = ?').get(ids[0]!)!.record;
    const put = records.prepare("INSERT INTO records (sandbox_id, state, updated_at_ms, record) VALUES (?, 'RUNNING', 0, ?)");
    put.run(BAD_SANDBOX, '{}');
    put.run('sb-00000000deadbee1', good.subarray(0, Math.floor(good.length / 2)));
    put.run('sb-00000000deadbee2', good); // a duplicate of a live record under another key
    put.run('sb-00000000deadbee3', Buffer.from(RuntimeRecord.encode(RuntimeRecord.fromPartial({ ...RuntimeRecord.decode(good), sandboxId: 'sb-00000000deadbee3', schema: 99 })).finish()));
    put.run('sb-00000000deadbee4', Buffer.from([0xff, 0x13, 0x37, 0x00, 0xfe]));
    records.close();

    const devices = new Database(findFile(node.dirs.stateDir, 'devices.db'));
    const dev = devices.prepare('SELECT * FROM devices ORDER BY device_id LIMIT 1').get() as Record<string, unknown>;
    const insDev = (row: Record<string, unknown>) => {
      const cols = Object.keys(row);
      devices.prepare(`INSERT INTO devices (${cols.join(', ')}) VALUES (${cols.map(() => '?').join(', ')})`).run(...cols.map((c) => row[c]));
    };
    insDev({ ...dev, device_id: 'garbage-state', state: 'migrating', backing_file: '/nonexistent/g1.img' });
    insDev({ ...dev, device_id: 'garbage-fs', filesystem: 'xfs', backing_file: '/nonexistent/g2.img' });
    insDev({ ...dev, device_id: 'garbage-size', size_bytes: -1, backing_file: '/nonexistent/g3.img' });
    devices.close();

    const vms = new Database(findFile(node.dirs.stateDir, 'vm-table.db'));
    const vm = vms.prepare<[], { record: string }>('SELECT record FROM vms ORDER BY vm_id LIMIT 1').get()!.record;
    const insVm = vms.prepare('INSERT INTO vms (vm_id, record) VALUES (?, ?)');
    insVm.run('vm-garbage-a', vm.slice(0, vm.length - 7));
    insVm.run('vm-garbage-b', '{}');
    insVm.run('vm-garbage-c', vm); // a duplicate of a live VM under another key
    insVm.run('vm-garbage-d', JSON.stringify({ ...(JSON.parse(vm) as object), vmId: 'vm-garbage-d', schema: 99 }));
    vms.close();

    for (const c of COMPONENTS) await startComponent(node.dirs, c, { timeoutMs: 60_000 });
    node.reconnect();
  });
  afterAll(async () => {
    await node?.stop();
  });

  it('starts and serves the good sandboxes: listed, running, exec works and sees its data', async () => {
    const listed = (await node.api.sandboxes.listSandboxes({})).sandboxes;
    expect(listed.map((s) => s.sandboxId).sort()).toEqual([...ids].sort());
    for (const s of listed) expect(s.pid).toBeGreaterThan(0);
    const r = await execCollect(node.api, ids[0]!, ['cat', '/workspace/f']);
    expect(r).toMatchObject({ exitCode: 0, stdout: 'kept\n' });
    const r2 = await execCollect(node.api, ids[1]!, ['true']);
    expect(r2.exitCode).toBe(0);
  });

  it('a garbage row is NOT_FOUND, never UNKNOWN; new sandboxes can be made and deleted', async () => {
    await expectCode(node.api.sandboxes.getSandbox({ sandboxId: BAD_SANDBOX }), Status.NOT_FOUND, /not found/);
    const { sandbox } = await node.api.sandboxes.createSandbox({ template: 'base' });
    await node.api.sandboxes.deleteSandbox({ sandboxId: sandbox!.sandboxId });
  });

  it('status reports every quarantined row with its reason, per component, and each peer fence epoch', () => {
    const j = node.cli(['status', '--json']);
    expect(j.status).toBe(0);
    const s = JSON.parse(j.stdout) as {
      epoch: number;
      fences: Record<string, { epoch: number; aboveServer: boolean }>;
      quarantine: Record<string, { count: number; rows: { key: string; reason: string }[] }>;
    };
    const keys = (c: string) => s.quarantine[c]!.rows.map((r) => r.key).sort();
    expect(keys('server')).toEqual(['sb-00000000deadbee1', 'sb-00000000deadbee2', 'sb-00000000deadbee3', 'sb-00000000deadbee4', BAD_SANDBOX]);
    expect(keys('ublk-manager')).toEqual(['garbage-fs', 'garbage-size', 'garbage-state']);
    expect(keys('vmm-supervisor')).toEqual(['vm-garbage-a', 'vm-garbage-b', 'vm-garbage-c', 'vm-garbage-d']);
    expect(s.quarantine.server!.count).toBe(5);
    for (const c of ['server', 'ublk-manager', 'vmm-supervisor']) for (const r of s.quarantine[c]!.rows) expect(r.reason).toMatch(/\w{4}/);
    expect(s.quarantine['ublk-manager']!.rows.find((r) => r.key === 'garbage-state')?.reason).toMatch(/unknown state "migrating"/);
    expect(s.quarantine['vmm-supervisor']!.rows.find((r) => r.key === 'vm-garbage-d')?.reason).toMatch(/schema 99 is newer/);
    for (const c of ['ublk-manager', 'vmm-supervisor']) expect(s.fences[c]).toEqual({ epoch: s.epoch, aboveServer: false });

    const h = node.cli(['status']);
    expect(h.status).toBe(0);
    expect(h.stdout).toMatch(/server quarantined rows: 5/);
    expect(h.stdout).toMatch(/ublk-manager quarantined rows: 3/);
    expect(h.stdout).toMatch(/vmm-supervisor quarantined rows: 4/);
    expect(h.stdout).toMatch(/"garbage-fs": unknown filesystem "xfs"/);
    expect(h.stdout).toMatch(new RegExp(`vmm-supervisor fence epoch: ${s.epoch}\\n`));
  });

  // last: it fences the active server out of vmm-supervisor
  it('status shows a peer fenced above the active server epoch', async () => {
    const before = JSON.parse(node.cli(['status', '--json']).stdout) as { epoch: number };
    // a peer takes a fence only up to the epoch the lease record names (a forged epoch is
    // refused): as after a standby that took epoch+5 and died before it served
    writeLeaseRecord(node.dirs.stateDir, before.epoch + 5);
    const ch = createSandnodeChannel(componentAddress(node.dirs, 'vmm-supervisor'));
    try {
      await createServiceClient(VmServiceDefinition, ch, { retryAttempts: 1 }).fenceEpoch({ epoch: before.epoch + 5 });
    } finally {
      ch.close();
    }
    const s = JSON.parse(node.cli(['status', '--json']).stdout) as { epoch: number; fences: Record<string, { epoch: number; aboveServer: boolean }> };
    expect(s.fences['vmm-supervisor']).toEqual({ epoch: before.epoch + 5, aboveServer: true });
    expect(s.fences['ublk-manager']).toEqual({ epoch: before.epoch, aboveServer: false });
    expect(node.cli(['status']).stdout).toMatch(new RegExp(`vmm-supervisor fence epoch: ${before.epoch + 5} — ABOVE the active server's epoch ${before.epoch}`));
  });
});
