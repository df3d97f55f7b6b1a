/**
 * DeviceStore: the device table. Every write is durable when the call returns (the SQLite
 * store runs with synchronous=FULL), so the manager can write a row before a step and trust
 * it after a crash.
 */
import type { DeviceRecord, RecordState } from './types';

/** DeviceStore keeps one row per device id. */
export interface DeviceStore {
  /** get returns the row of deviceId or undefined. */
  get(deviceId: string): DeviceRecord | undefined;
  /** list returns every row ordered by device id. */
  list(): DeviceRecord[];
  /** insert adds a row; throws when the id already has one. */
  insert(record: DeviceRecord): void;
  /** update replaces the state and device path of a row and stamps updatedAtMs. */
  update(deviceId: string, change: { state?: RecordState; path?: string }, nowMs: number): void;
  /** delete drops the row; false when there was none. */
  delete(deviceId: string): boolean;
  /** close releases the store. */
  close(): void;
}
