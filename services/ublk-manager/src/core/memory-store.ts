/** MemoryDeviceStore: a DeviceStore in a Map, for tests. Not durable. */
import type { DeviceStore, QuarantinedRow, RecordChange } from './store';
import type { DeviceRecord } from './types';

/** MemoryDeviceStore keeps rows in memory (copies in, copies out). */
export class MemoryDeviceStore implements DeviceStore {
  private readonly rows = new Map<string, DeviceRecord>();

  /** get returns a copy of the row or undefined. */
  get(deviceId: string): DeviceRecord | undefined {
    const r = this.rows.get(deviceId);
    return r ? { ...r } : undefined;
  }

  /** list returns copies ordered by device id. */
  list(): DeviceRecord[] {
    return [...this.rows.values()].sort((a, b) => (a.deviceId < b.deviceId ? -1 : a.deviceId > b.deviceId ? 1 : 0)).map((r) => ({ ...r }));
  }

  /** insert adds a row; throws when the id has one. */
  insert(record: DeviceRecord): void {
    if (this.rows.has(record.deviceId)) throw new Error(`device ${record.deviceId} already has a row`);
    this.rows.set(record.deviceId, { ...record });
  }

  /** update changes state and/or path of an existing row. */
  update(deviceId: string, change: RecordChange, nowMs: number): void {
    const r = this.rows.get(deviceId);
    if (!r) throw new Error(`device ${deviceId} has no row`);
    if (change.state !== undefined) r.state = change.state;
    if (change.path !== undefined) r.path = change.path;
    if (change.handoverToken !== undefined) r.handoverToken = change.handoverToken;
    r.updatedAtMs = nowMs;
  }

  /** delete drops the row. */
  delete(deviceId: string): boolean {
    return this.rows.delete(deviceId);
  }

  /** quarantined: a memory store has no unreadable rows. */
  quarantined(): QuarantinedRow[] {
    return [];
  }

  /** close does nothing. */
  close(): void {}
}
