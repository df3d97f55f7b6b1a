/**
 * The node's network as `sandnode status` shows it (docs/network.md): whether the
 * vmm-supervisor's network is on, and if not why (a pool that overlaps a route, a missing `nft`).
 * Without this line a node whose network is off looked healthy, and a plain `sandbox create`
 * made sandboxes without network.
 */
import { createSandnodeChannel, createServiceClient, VMM_FEATURES } from '@sandnode/shared';
import { NetworkSlotState, VmServiceDefinition, type ListNetworkSlotsResponse } from '@sandnode/shared/proto/vmm/v1/vmm';
import { componentAddress, type StackDirs } from '@sandnode/node-stack';
import { STATUS_CALL_TIMEOUT_MS } from './node-health';

/** The node's network as status reports it. */
export interface NodeNetworkStatus {
  enabled: boolean;
  /** why the network is off; "" when on */
  reason: string;
  /** the address pool (CIDR), e.g. "10.209.0.0/16" */
  pool: string;
  /** the node's nftables table, e.g. "inet sandnode-6036" */
  table: string;
  dnsPort: number;
  egressProxyPort: number;
  /** slots by state */
  inUse: number;
  spare: number;
  reserved: number;
}

/** networkStatusOf is the status view of a ListNetworkSlots answer. */
export function networkStatusOf(r: ListNetworkSlotsResponse): NodeNetworkStatus {
  const count = (s: NetworkSlotState) => r.slots.filter((x) => x.state === s).length;
  return {
    enabled: r.enabled,
    reason: r.disabledReason,
    pool: r.pool,
    table: r.table,
    dnsPort: r.dnsPort,
    egressProxyPort: r.egressProxyPort,
    inUse: count(NetworkSlotState.NETWORK_SLOT_STATE_IN_USE),
    spare: count(NetworkSlotState.NETWORK_SLOT_STATE_SPARE),
    reserved: count(NetworkSlotState.NETWORK_SLOT_STATE_RESERVED),
  };
}

/**
 * nodeNetwork asks the vmm-supervisor (ListNetworkSlots) for the node's network. Never throws:
 * null when the supervisor does not answer within STATUS_CALL_TIMEOUT_MS (3000 ms) or does not
 * list `vmm.network.v1` in features (a 0.2.0 one: no network).
 */
export async function nodeNetwork(dirs: StackDirs, features: string[]): Promise<NodeNetworkStatus | null> {
  if (!features.includes(VMM_FEATURES.network)) return null;
  const ch = createSandnodeChannel(componentAddress(dirs, 'vmm-supervisor'));
  try {
    const vms = createServiceClient(VmServiceDefinition, ch, { timeoutMs: STATUS_CALL_TIMEOUT_MS, retryAttempts: 1 });
    return networkStatusOf(await vms.listNetworkSlots({}));
  } catch {
    return null;
  } finally {
    ch.close();
  }
}

/** networkStatusLine is the status line of the node's network (n null: unknown). */
export function networkStatusLine(n: NodeNetworkStatus | null): string {
  if (!n) return 'network: unknown (the vmm-supervisor is down or has no vmm.network.v1)';
  if (!n.enabled) return `network: OFF: ${n.reason || 'no reason given'} (sandboxes are created without network; a create with a network flag fails)`;
  // the pool's room in /30 slots (network-layout.ts slotCount): "2 in use" alone did not say of how many (newcomer)
  const prefix = Number(/\/(\d+)$/.exec(n.pool)?.[1]);
  const of = Number.isInteger(prefix) && prefix >= 8 && prefix <= 30 ? ` of ${2 ** (32 - prefix) / 4}` : '';
  return `network: on, pool ${n.pool}, table ${n.table}, slots${of}: ${n.inUse} in use, ${n.reserved} reserved (drained sandboxes keep theirs), ${n.spare} spare (made ahead for fast creates); dns port ${n.dnsPort}, egress proxy port ${n.egressProxyPort}`;
}
