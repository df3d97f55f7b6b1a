/**
 * VmPeer's network calls against a scripted VmService on a unix socket: what a 0.2.0
 * supervisor (no "vmm.network.v1") answers for networkStatus (the reason names it and its
 * version), a supervisor whose network is off, the wire shape of CreateVm's NetworkSpec and
 * DeleteVm's keep_network, and the epoch every mutating network call carries.
 */
import path from 'node:path';
import { createLogger, createServiceServer, type ServiceServer } from '@sandnode/shared';
import { NetworkSlotState, VmServiceDefinition, VmState, type DeepPartial, type VmServiceImplementation } from '@sandnode/shared/proto/vmm/v1/vmm';
import { useTempDir } from '@sandnode/testkit';
import { VmPeer } from './vm-peer';

const log = createLogger('test', '0', 'silent');

describe('VmPeer network calls', () => {
  const tmp = useTempDir('sandnode-vm-peer-net-');
  let server: ServiceServer | undefined;
  let peer: VmPeer | undefined;
  const seen: { rpc: string; req: unknown; epoch: string | undefined }[] = [];

  afterEach(async () => {
    peer?.close();
    await server?.shutdown(100);
    server = undefined;
    seen.length = 0;
  });

  let sock = '';
  async function start(version: string, features: string[], enabled = true, keep?: VmPeer): Promise<VmPeer> {
    server = createServiceServer({ info: { component: 'vmm-supervisor', version, commit: '', features }, log });
    const vm = {
      vmId: 'sb-0000000000000001',
      state: VmState.VM_STATE_RUNNING,
      pid: 7,
      network: { slot: 4, address: '10.209.0.18', gateway: '10.209.0.17', hostIfname: 'snabcv4', owner: 'sb-0000000000000001', egress: { allowOut: ['example.com'], denyOut: [], blockAll: true } },
    };
    const record = (rpc: string) => (req: unknown, ctx: { metadata: { get(k: string): unknown } }) => void seen.push({ rpc, req, epoch: ctx.metadata.get('sandnode-epoch') as string | undefined });
    const impl: Partial<VmServiceImplementation> = {
      createVm: async (req, ctx): Promise<DeepPartial<{ vm: typeof vm }>> => (record('createVm')(req, ctx), { vm }),
      deleteVm: async (req, ctx) => (record('deleteVm')(req, ctx), { existed: true }),
      listNetworkSlots: async () => ({
        enabled,
        disabledReason: enabled ? '' : 'nft not found',
        pool: '10.209.0.0/16',
        dnsPort: 15053,
        egressProxyPort: 15080,
        proxiedPorts: [80, 443],
        alwaysDenied: ['10.0.0.0/8'],
        slots: [
          { slot: 4, state: NetworkSlotState.NETWORK_SLOT_STATE_RESERVED, owner: 'sb-0000000000000001', address: '10.209.0.18' },
          { slot: 5, state: 9 as NetworkSlotState },
        ],
      }),
      updateVmNetwork: async (req, ctx) => (record('updateVmNetwork')(req, ctx), { network: vm.network }),
      releaseNetworkSlot: async (req, ctx) => (record('releaseNetworkSlot')(req, ctx), { released: true }),
    };
    server.add(VmServiceDefinition, impl as VmServiceImplementation);
    if (!keep) sock = `unix://${path.join(tmp(), 'vmm.sock')}`;
    await server.listen([sock]);
    peer = keep ?? new VmPeer(sock, { epoch: () => 12, retryAttempts: 0, timeoutMs: 5000 });
    return peer;
  }

  it('a supervisor upgraded from 0.2.0 since its features were read (restarted on its socket): read again, so the node has network', async () => {
    const p = await start('0.2.0', ['vmm.runc']);
    expect(await p.networkStatus()).toMatchObject({ available: false, reason: 'vmm-supervisor 0.2.0 lacks feature "vmm.network.v1"' });
    await server?.shutdown(100);
    await start('0.3.0', ['vmm.network.v1'], true, p);
    expect(await p.networkStatus()).toMatchObject({ available: true, reason: '', pool: '10.209.0.0/16' });
  });

  it('a 0.2.0 supervisor: no network, the reason names the supervisor, its version and the feature; ListNetworkSlots is not called', async () => {
    const p = await start('0.2.0', ['vmm.runc']);
    expect(await p.networkStatus()).toMatchObject({ available: false, reason: 'vmm-supervisor 0.2.0 lacks feature "vmm.network.v1"', slots: [] });
  });

  it('a supervisor with the feature whose network is off says why; one that is on gives its slots and settings (an unknown slot state is UNKNOWN)', async () => {
    const off = await start('0.3.0', ['vmm.network.v1'], false);
    expect(await off.networkStatus()).toMatchObject({ available: false, reason: "the vmm-supervisor 0.3.0's network is off: nft not found" });
    off.close();
    await server?.shutdown(100);
    const on = await start('0.3.0', ['vmm.network.v1']);
    expect(await on.networkStatus()).toEqual({
      available: true,
      reason: '',
      pool: '10.209.0.0/16',
      dnsPort: 15053,
      egressProxyPort: 15080,
      proxiedPorts: [80, 443],
      alwaysDenied: ['10.0.0.0/8'],
      slots: [
        { slot: 4, state: 'RESERVED', owner: 'sb-0000000000000001', vmId: '', address: '10.209.0.18' },
        { slot: 5, state: 'UNKNOWN', owner: '', vmId: '', address: '' },
      ],
    });
  });

  it('CreateVm carries NetworkSpec and the VM its network back; DeleteVm keep_network; update and release carry the epoch', async () => {
    const p = await start('0.3.0', ['vmm.network.v1']);
    const egress = { allowOut: ['example.com'], denyOut: [], blockAll: true };
    const vm = await p.create({
      vmId: 'sb-0000000000000001',
      templateRootfs: '/t',
      upperPath: '/u',
      workspacePath: '/w',
      resources: { vcpus: 1, memoryMib: 64, diskBytes: 1, pids: 0 },
      poddSocketDir: '/d',
      hostname: 'h',
      env: {},
      machineId: '',
      network: { owner: 'sb-0000000000000001', slot: -1, egress },
    });
    expect(vm.network).toEqual({ slot: 4, address: '10.209.0.18', gateway: '10.209.0.17', hostIfname: 'snabcv4', owner: 'sb-0000000000000001', egress });
    await p.delete('sb-0000000000000001', { keepNetwork: true });
    await p.delete('sb-0000000000000001');
    expect((await p.updateNetwork('sb-0000000000000001', egress)).slot).toBe(4);
    expect(await p.releaseNetworkSlot(4, 'sb-0000000000000001')).toBe(true);
    expect(seen.map((s) => s.rpc)).toEqual(['createVm', 'deleteVm', 'deleteVm', 'updateVmNetwork', 'releaseNetworkSlot']);
    expect((seen[0]!.req as { spec: { network: unknown } }).spec.network).toMatchObject({ owner: 'sb-0000000000000001', slot: -1, egress });
    expect(seen.slice(1, 3).map((s) => (s.req as { keepNetwork: boolean }).keepNetwork)).toEqual([true, false]);
    expect(seen.every((s) => s.epoch === '12')).toBe(true);
  });
});
