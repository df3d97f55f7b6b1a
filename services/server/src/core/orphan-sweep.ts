/**
 * Orphan sweep (ARCHITECTURE.md section 3): on takeover, remove what no runtime record owns:
 * VMs (their containers, mounts and dirs go with DeleteVm), network slots reserved for a
 * sandbox id no record has (ReleaseNetworkSlot), devices (images go with
 * DeleteDevice) and per-sandbox runtime dirs. Records whose parts are gone are not touched here:
 * adoption marks them ERROR with the reason. Runs before the server serves, so no create is
 * in flight.
 */
import { readdir, rm } from 'node:fs/promises';
import path from 'node:path';
import type { Logger } from '@sandnode/shared';
import { sweepNetworkSlots } from './network';
import { ownedDeviceIds } from './provision';
import type { DevicePort, RecordStore, VmPort } from './types';

export interface SweepReport {
  vms: string[];
  devices: string[];
  dirs: string[];
  /** network slots released: reserved (or in use) for a sandbox id no record has */
  slots: string[];
  failed: string[];
}

export async function sweepOrphans(d: { store: RecordStore; vms: VmPort; devices: DevicePort; runDir: string; log: Logger }): Promise<SweepReport> {
  const report: SweepReport = { vms: [], devices: [], dirs: [], slots: [], failed: [] };
  const records = d.store.list();
  // a quarantined row is unreadable, not gone: what its id names by default is left alone
  const held = d.store.quarantinedIds?.() ?? [];
  const ownedVms = new Set([...records.map((r) => r.vm?.vmId ?? r.sandboxId), ...held]);
  const ownedDevices = new Set([...records.flatMap(ownedDeviceIds), ...held.flatMap((id) => [`${id}-upper`, `${id}-ws`])]);
  const ownedDirs = new Set([...records.map((r) => r.sandboxId), ...held]);
  for (const vm of await d.vms.list()) {
    if (ownedVms.has(vm.vmId)) continue;
    try {
      await d.vms.delete(vm.vmId);
      report.vms.push(vm.vmId);
    } catch (err) {
      report.failed.push(`vm ${vm.vmId}: ${(err as Error).message}`);
      d.log.warn({ vm_id: vm.vmId, err }, 'orphan sweep: could not delete a VM');
    }
  }
  // after the VMs: a deleted orphan VM freed its slot; what is left is reserved for a gone sandbox
  const slots = await sweepNetworkSlots(d);
  report.slots.push(...slots.released);
  report.failed.push(...slots.failed);
  for (const dev of await d.devices.list()) {
    if (ownedDevices.has(dev.deviceId)) continue;
    try {
      await d.devices.delete(dev.deviceId);
      report.devices.push(dev.deviceId);
    } catch (err) {
      report.failed.push(`device ${dev.deviceId}: ${(err as Error).message}`);
      d.log.warn({ device_id: dev.deviceId, err }, 'orphan sweep: could not delete a device');
    }
  }
  const sbDir = path.join(d.runDir, 'sandboxes');
  for (const name of await readdir(sbDir).catch(() => [] as string[])) {
    if (ownedDirs.has(name)) continue;
    await rm(path.join(sbDir, name), { recursive: true, force: true });
    report.dirs.push(name);
  }
  if (report.vms.length + report.devices.length + report.dirs.length + report.slots.length + report.failed.length > 0) d.log.warn(report, 'orphans swept');
  return report;
}
