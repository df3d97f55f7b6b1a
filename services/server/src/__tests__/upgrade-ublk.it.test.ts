/**
 * `sandnode upgrade ublk-manager` end to end: device handover to the other slot twice (b, then
 * a) with live sandboxes, then a node restart that starts the slot owning the devices.
 */
import { createHash } from 'node:crypto';
import { SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { COMPONENTS, activeUblkSlot, startComponent, stopComponent, upgradeUblkManager } from '@sandnode/node-stack';
import { describeNode, execCollect, startNode, type TestNode } from '@sandnode/testkit';

jest.setTimeout(240_000);

describeNode('upgrade ublk-manager (device handover) from the CLI', () => {
  let node: TestNode;
  beforeAll(async () => {
    node = await startNode();
  });
  afterAll(async () => {
    await node?.stop();
  });

  it('moves every device to the other slot and back, sandboxes untouched, and a restart adopts them', async () => {
    const made = [];
    for (let i = 0; i < 2; i++) made.push((await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!);
    const data = Buffer.from('x'.repeat(200_000));
    const sum = createHash('sha256').update(data).digest('hex');
    for (const s of made) await node.api.sandboxes.writeFile({ sandboxId: s.sandboxId, path: 'before.bin', data });

    const first = await upgradeUblkManager(node.dirs, '.');
    expect(first.newSlot).toBe('b');
    expect(first.devices).toHaveLength(4);
    expect(first.devices.every((d) => d.result === 'MOVED')).toBe(true);
    expect(activeUblkSlot(node.dirs)).toBe('b');
    // lifecycle calls reach the new slot through the stable address
    const extra = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    const second = await upgradeUblkManager(node.dirs, '.');
    expect([second.oldSlot, second.newSlot]).toEqual(['b', 'a']);
    expect(second.devices).toHaveLength(6);
    expect(activeUblkSlot(node.dirs)).toBe('a');

    for (const s of made) {
      const g = (await node.api.sandboxes.getSandbox({ sandboxId: s.sandboxId })).sandbox!;
      expect([g.state, g.pid]).toEqual([SandboxState.SANDBOX_STATE_RUNNING, s.pid]);
      const r = await execCollect(node.api, s.sandboxId, ['sha256sum', '/workspace/before.bin']);
      expect(r.stdout.split(' ')[0]).toBe(sum);
    }

    // stop everything but the sandboxes, start again: slot a is started, every sandbox adopted
    node.api.close();
    for (const c of [...COMPONENTS].reverse()) await stopComponent(node.dirs, c);
    for (const c of COMPONENTS) await startComponent(node.dirs, c);
    const api = node.reconnect();
    for (const s of [...made, extra]) {
      const g = (await api.sandboxes.getSandbox({ sandboxId: s.sandboxId })).sandbox!;
      expect([g.state, g.pid]).toEqual([SandboxState.SANDBOX_STATE_RUNNING, s.pid]);
    }
    await api.sandboxes.deleteSandbox({ sandboxId: extra.sandboxId });
  });

  it('moves the devices with no server running, at the epoch of the lease record (it answered ABORTED "stale epoch 0")', async () => {
    const api = node.reconnect();
    const sb = (await api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    api.close();
    await stopComponent(node.dirs, 'server');
    const moved = await upgradeUblkManager(node.dirs, '.');
    expect(moved.devices.filter((d) => d.deviceId.startsWith(sb.sandboxId)).map((d) => d.result)).toEqual(['MOVED', 'MOVED']);
    await startComponent(node.dirs, 'server');
    const again = node.reconnect();
    const g = (await again.sandboxes.getSandbox({ sandboxId: sb.sandboxId })).sandbox!;
    expect([g.state, g.pid]).toEqual([SandboxState.SANDBOX_STATE_RUNNING, sb.pid]);
    await again.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });
});
