/**
 * What `sandnode status` reports beyond versions: each component's quarantined rows (rows of
 * its table it cannot read, set aside with the reason; issue 11) and each peer's epoch fence
 * (so an operator sees a peer fenced above the active server's epoch: every mutating call of
 * that server is then ABORTED).
 */
import { createSandnodeChannel, createServiceClient, SERVER_FEATURES, UBLK_FEATURES, VMM_FEATURES } from '@sandnode/shared';
import { AdminServiceDefinition } from '@sandnode/shared/proto/server/v1/admin';
import { DeviceServiceDefinition } from '@sandnode/shared/proto/ublk/v1/ublk';
import { VmServiceDefinition } from '@sandnode/shared/proto/vmm/v1/vmm';
import { componentAddress, type StackDirs } from '@sandnode/node-stack';

/** How long each status call may take, ms. */
export const STATUS_CALL_TIMEOUT_MS = 3000;

/** One quarantined row as status shows it. */
export interface QuarantineEntry {
  key: string;
  reason: string;
  /** Unix epoch ms; 0 when unknown */
  quarantinedAtMs: number;
}

/** The feature a component lists when its answers carry the report (an older one answers empty fields). */
const REPORT_FEATURE = { 'vmm-supervisor': VMM_FEATURES.quarantineReport, 'ublk-manager': UBLK_FEATURES.quarantineReport, server: SERVER_FEATURES.quarantineReport } as const;

/** One component's part of the report; null fields: the component did not answer (down, or too old to say). */
export interface ComponentHealth {
  name: 'vmm-supervisor' | 'ublk-manager' | 'server';
  /** its quarantined rows, or null when it did not answer */
  quarantined: QuarantineEntry[] | null;
  /** the highest epoch its fence has seen (peers only; the server's epoch is the lease's); null when unknown */
  fenceEpoch: number | null;
  /** true when the peer's fence is above the active server's epoch (that server's mutating calls are ABORTED) */
  fencedAboveServer: boolean;
  /** vmm-supervisor only: the quarantined rows of its network slot table; null when unknown (down, network off, or an older release) */
  slotQuarantined?: QuarantineEntry[] | null;
  /** server only: sandboxes whose VM network differed from the record at adoption ("sb-...: why"); null when unknown */
  networkMismatches?: string[] | null;
}

async function ask<T>(address: string, fn: (ch: ReturnType<typeof createSandnodeChannel>) => Promise<T>): Promise<T | undefined> {
  const ch = createSandnodeChannel(address);
  try {
    return await fn(ch);
  } catch {
    return undefined;
  } finally {
    ch.close();
  }
}

/**
 * nodeHealth asks ublk-manager (ListDevices), vmm-supervisor (ListVms) and the active server's
 * admin socket (GetLeaseStatus) for their quarantined rows and fence epochs. Never throws: a
 * component that does not answer, or does not list the report's feature in `features` (its
 * GetVersion features by name: an older release), gets nulls. serverEpoch is the active
 * server's lease epoch (null: no active server), compared with each peer's fence.
 */
export async function nodeHealth(dirs: StackDirs, serverAdmin: string | null, serverEpoch: number | null, features: Record<string, string[]>): Promise<ComponentHealth[]> {
  const reports = (c: keyof typeof REPORT_FEATURE) => features[c]?.includes(REPORT_FEATURE[c]) ?? false;
  const opts = { timeoutMs: STATUS_CALL_TIMEOUT_MS, retryAttempts: 1 };
  const rows = (q: { key: string; reason: string; quarantinedAtMs: number }[]) => q.map(({ key, reason, quarantinedAtMs }) => ({ key, reason, quarantinedAtMs }));
  const slotReport = features['vmm-supervisor']?.includes(VMM_FEATURES.slotQuarantineReport) ?? false;
  const [vms, devices, lease, slots] = await Promise.all([
    reports('vmm-supervisor') ? ask(componentAddress(dirs, 'vmm-supervisor'), (ch) => createServiceClient(VmServiceDefinition, ch, opts).listVms({})) : Promise.resolve(undefined),
    reports('ublk-manager') ? ask(componentAddress(dirs, 'ublk-manager'), (ch) => createServiceClient(DeviceServiceDefinition, ch, opts).listDevices({})) : Promise.resolve(undefined),
    serverAdmin && reports('server') ? ask(serverAdmin, (ch) => createServiceClient(AdminServiceDefinition, ch, opts).getLeaseStatus({})) : Promise.resolve(undefined),
    slotReport ? ask(componentAddress(dirs, 'vmm-supervisor'), (ch) => createServiceClient(VmServiceDefinition, ch, opts).listNetworkSlots({})) : Promise.resolve(undefined),
  ]);
  const peer = (name: 'vmm-supervisor' | 'ublk-manager', r: { quarantined: { key: string; reason: string; quarantinedAtMs: number }[]; fenceEpoch: number } | undefined): ComponentHealth => {
    const fenceEpoch = r ? r.fenceEpoch : null;
    return { name, quarantined: r ? rows(r.quarantined) : null, fenceEpoch, fencedAboveServer: fenceEpoch !== null && serverEpoch !== null && fenceEpoch > serverEpoch };
  };
  return [
    { ...peer('vmm-supervisor', vms), slotQuarantined: slots ? rows(slots.quarantined) : null },
    peer('ublk-manager', devices),
    { name: 'server', quarantined: lease ? rows(lease.quarantinedRecords) : null, fenceEpoch: null, fencedAboveServer: false, networkMismatches: lease ? [...(lease.networkMismatches ?? [])] : null },
  ];
}

/** healthLines is the human form of the report: one line per component, then one per quarantined row. */
export function healthLines(h: ComponentHealth[], serverEpoch: number | null): string[] {
  const out: string[] = [];
  for (const c of h) {
    if (c.name !== 'server') {
      const fence = c.fenceEpoch === null ? 'unknown' : String(c.fenceEpoch);
      const warn = c.fencedAboveServer ? ` — ABOVE the active server's epoch ${serverEpoch}: its mutating calls are ABORTED (a newer server took the lease?)` : '';
      out.push(`${c.name} fence epoch: ${fence}${warn}`);
    }
  }
  for (const c of h) {
    if (c.quarantined === null) out.push(`${c.name} quarantined rows: unknown (down, or a release that does not report them)`);
    else if (c.quarantined.length === 0) out.push(`${c.name} quarantined rows: 0`);
    else {
      out.push(`${c.name} quarantined rows: ${c.quarantined.length} (not served; see its quarantine table)`);
      for (const q of c.quarantined) out.push(`  ${q.key === '' ? '(no key)' : JSON.stringify(q.key)}: ${q.reason}`);
    }
    if (c.slotQuarantined === null) out.push(`${c.name} network slot table quarantined rows: unknown (down, network off, or a release that does not report them)`);
    else if (c.slotQuarantined?.length === 0) out.push(`${c.name} network slot table quarantined rows: 0`);
    else if (c.slotQuarantined) {
      out.push(`${c.name} network slot table quarantined rows: ${c.slotQuarantined.length} (their slots are not handed out; see network_slot_quarantine)`);
      for (const q of c.slotQuarantined) out.push(`  slot ${q.key}: ${q.reason}`);
    }
    if (c.networkMismatches?.length) {
      out.push(`${c.name} network mismatches at adoption: ${c.networkMismatches.length} (VM network differs from the record; kept as is)`);
      for (const m of c.networkMismatches) out.push(`  ${m}`);
    }
  }
  return out;
}
