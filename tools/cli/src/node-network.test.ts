/**
 * The network line of `sandnode status`: a node whose network is off must say so and why (it
 * looked healthy before, and made sandboxes without network).
 */
import { ListNetworkSlotsResponse, NetworkSlotState } from '@sandnode/shared/proto/vmm/v1/vmm';
import { networkStatusLine, networkStatusOf } from './node-network';

const base = { pool: '10.209.0.0/16', table: 'inet sandnode-6036', dnsPort: 15053, egressProxyPort: 15080, proxiedPorts: [80, 443], alwaysDenied: [], spareTarget: 2 };

describe('status network line', () => {
  it('counts the slots by state when the network is on', () => {
    const r = ListNetworkSlotsResponse.fromPartial({
      ...base,
      enabled: true,
      slots: [
        { slot: 0, state: NetworkSlotState.NETWORK_SLOT_STATE_IN_USE },
        { slot: 1, state: NetworkSlotState.NETWORK_SLOT_STATE_IN_USE },
        { slot: 2, state: NetworkSlotState.NETWORK_SLOT_STATE_RESERVED },
        { slot: 3, state: NetworkSlotState.NETWORK_SLOT_STATE_SPARE },
      ],
    });
    const n = networkStatusOf(r);
    expect(n).toMatchObject({ enabled: true, inUse: 2, reserved: 1, spare: 1 });
    expect(networkStatusLine(n)).toBe(
      'network: on, pool 10.209.0.0/16, table inet sandnode-6036, slots of 16384: 2 in use, 1 reserved (drained sandboxes keep theirs), 1 spare (made ahead for fast creates); dns port 15053, egress proxy port 15080',
    );
  });

  it("says OFF with the supervisor's reason, and what that does to creates", () => {
    const n = networkStatusOf(ListNetworkSlotsResponse.fromPartial({ ...base, enabled: false, disabledReason: 'pool 10.209.0.0/16 overlaps route 10.209.129.0/30 dev snt01v0' }));
    expect(networkStatusLine(n)).toBe('network: OFF: pool 10.209.0.0/16 overlaps route 10.209.129.0/30 dev snt01v0 (sandboxes are created without network; a create with a network flag fails)');
  });

  it('says unknown when the supervisor did not answer', () => {
    expect(networkStatusLine(null)).toMatch(/^network: unknown/);
  });
});
