/**
 * VmStore is the supervisor's persisted VM table. Every write is durable (fsynced) when the
 * promise-free call returns, so a transition is persisted before it is acknowledged.
 */
import type { VmRecord } from './types';

/** VmStore persists {@link VmRecord}s keyed by vm id. */
export interface VmStore {
  /** get returns the row of vmId, or undefined. */
  get(vmId: string): VmRecord | undefined;
  /** list returns every row ordered by vm id. */
  list(): VmRecord[];
  /**
   * put inserts or replaces the row of record.vmId. Fields of a stored row that this release
   * does not know (written by a newer one) are kept.
   */
  put(record: VmRecord): void;
  /** delete drops the row of vmId; returns whether it existed. */
  delete(vmId: string): boolean;
  /** close releases the store. */
  close(): void;
}

/** MemoryVmStore keeps the table in memory (tests). */
export class MemoryVmStore implements VmStore {
  private readonly rows = new Map<string, VmRecord>();
  get(vmId: string): VmRecord | undefined {
    const r = this.rows.get(vmId);
    return r && structuredClone(r);
  }
  list(): VmRecord[] {
    return [...this.rows.keys()].sort().map((k) => structuredClone(this.rows.get(k)!));
  }
  put(record: VmRecord): void {
    this.rows.set(record.vmId, structuredClone(record));
  }
  delete(vmId: string): boolean {
    return this.rows.delete(vmId);
  }
  close(): void {}
}
