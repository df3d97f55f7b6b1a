/**
 * Integration: a networked CreateVm that fails in the driver, or a supervisor killed in the
 * middle of one, leaves the slot as it was (a reserved slot stays its owner's; a fresh one is
 * removed with its netns and veth). Real runc, netns, veth, nftables; names of its own tag.
 */
import { existsSync, mkdirSync } from 'node:fs';
import path from 'node:path';
import { Status } from 'nice-grpc-common';
import { describeWith, expectCode, writeLeaseRecord } from '@sandnode/testkit';
import { DriveRole, NetworkSlotState } from '@sandnode/shared/proto/vmm/v1/vmm';
import type { VmSpec } from '@sandnode/shared/proto/vmm/v1/vmm';
import { Fixture } from './__tests__/fixture';
import { NET_PARTS, NetFixture } from './__tests__/net-fixture';
import { FAILPOINTS, FAILPOINTS_ENV } from './core/failpoints';

jest.setTimeout(120_000);

describeWith('vmm-supervisor network: failed and crashed creates (integration)', NET_PARTS, () => {
  let fx: Fixture;
  let nf: NetFixture;
  const open = { allowOut: [], denyOut: [], blockAll: false };
  let n = 0;
  const spec = (owner: string, slot: number): VmSpec => {
    const dir = path.join(fx.runDir, 'sandboxes', `s${++n}`);
    mkdirSync(dir, { recursive: true });
    return {
      templateRootfs: fx.rootfs,
      drives: [{ driveId: 'upper', path: fx.makeExt4Loop(`upper-${n}`), role: DriveRole.DRIVE_ROLE_ROOTFS_UPPER, readOnly: false }],
      resources: { vcpus: 1, memoryMib: 128, diskBytes: 0, pids: 0 },
      poddSocketDir: dir,
      hostname: '',
      env: {},
      machineId: '',
      network: { owner, slot, egress: open },
    };
  };

  beforeAll(() => {
    fx = new Fixture();
    nf = new NetFixture(fx.dir);
    writeLeaseRecord(fx.stateDir, 5);
    fx.buildRootfs();
  });
  afterAll(async () => {
    await fx?.cleanup();
    nf?.cleanup();
  });

  test('a driver failure keeps a reserved slot reserved and removes a fresh one', async () => {
    let d = await fx.start(nf.env({ SANDNODE_VMM_SUPERVISOR_NETWORK_SPARE_SLOTS: '0' }));
    let c = fx.client(1);
    const vm = (await c.createVm({ vmId: 'f-a', spec: spec('sb-a', -1) })).vm!;
    await c.deleteVm({ vmId: 'f-a', keepNetwork: true });
    await d.stop();
    d = await fx.start(nf.env({ SANDNODE_VMM_SUPERVISOR_NETWORK_SPARE_SLOTS: '0', [FAILPOINTS_ENV]: `${FAILPOINTS.createAfterMounts}=error` }));
    c = fx.client(1);
    await expectCode(c.createVm({ vmId: 'f-b', spec: spec('sb-a', vm.network!.slot) }), Status.INTERNAL);
    let slots = (await c.listNetworkSlots({})).slots;
    expect(slots).toEqual([expect.objectContaining({ slot: vm.network!.slot, state: NetworkSlotState.NETWORK_SLOT_STATE_RESERVED, owner: 'sb-a' })]);
    expect(existsSync(vm.network!.netnsPath)).toBe(true);
    await expectCode(c.createVm({ vmId: 'f-c', spec: spec('sb-c', -1) }), Status.INTERNAL);
    slots = (await c.listNetworkSlots({})).slots;
    expect(slots.map((s) => s.slot)).toEqual([vm.network!.slot]);
    expect(nf.links()).toEqual([vm.network!.hostIfname]);
    await d.stop();
  });

  test('a supervisor killed mid-create: the restart undoes the VM and frees its slot, or gives a reserved one back to its owner', async () => {
    let d = await fx.start(nf.env({ SANDNODE_VMM_SUPERVISOR_NETWORK_SPARE_SLOTS: '0', [FAILPOINTS_ENV]: FAILPOINTS.createAfterMounts }));
    await expect(fx.client(1).createVm({ vmId: 'f-d', spec: spec('sb-d', -1) })).rejects.toThrow();
    expect((await d.exited).signal).toBe('SIGKILL');
    expect(nf.links().length).toBe(2); // the reserved slot of the test above and the one of f-d
    d = await fx.start(nf.env({ SANDNODE_VMM_SUPERVISOR_NETWORK_SPARE_SLOTS: '0' }));
    const c = fx.client(1);
    await expectCode(c.getVm({ vmId: 'f-d' }), Status.NOT_FOUND);
    const slots = (await c.listNetworkSlots({})).slots;
    expect(slots.map((s) => s.state)).toEqual([NetworkSlotState.NETWORK_SLOT_STATE_RESERVED]);
    expect(nf.links().length).toBe(1);
    // killed while taking the reserved slot: the restart gives it back to its owner
    await d.stop();
    d = await fx.start(nf.env({ SANDNODE_VMM_SUPERVISOR_NETWORK_SPARE_SLOTS: '0', [FAILPOINTS_ENV]: FAILPOINTS.createAfterMounts }));
    await expect(fx.client(1).createVm({ vmId: 'f-e', spec: spec('sb-a', slots[0]!.slot) })).rejects.toThrow();
    expect((await d.exited).signal).toBe('SIGKILL');
    d = await fx.start(nf.env({ SANDNODE_VMM_SUPERVISOR_NETWORK_SPARE_SLOTS: '0' }));
    expect((await c.listNetworkSlots({})).slots).toEqual([expect.objectContaining({ slot: slots[0]!.slot, state: NetworkSlotState.NETWORK_SLOT_STATE_RESERVED, owner: 'sb-a', vmId: '' })]);
    expect(await c.releaseNetworkSlot({ slot: slots[0]!.slot, owner: 'sb-a' })).toMatchObject({ released: true });
    expect(nf.links()).toEqual([]);
    expect(nf.table()).toContain('chain forward'); // the table stays while the supervisor runs
    await d.stop();
  });
});
