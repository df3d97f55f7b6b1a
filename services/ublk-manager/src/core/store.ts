/**
 * DeviceStore: the device table. Every write is durable when the call returns (the SQLite
 * store runs with synchronous=FULL), so the manager can write a row before a step and trust
 * it after a crash.
 */
import type { DeviceRecord, RecordState } from './types';

/** The fields of a row that {@link DeviceStore.update} may change. */
export interface RecordChange {
  state?: RecordState;
  path?: string;
  handoverToken?: string;
}

/** A row set aside because this version cannot read it (see the SQLite store). */
export interface QuarantinedRow {
  /** The row's device_id as read ('' when it had none). */
  deviceId: string;
  /** The row as read, as JSON. */
  rowJson: string;
  /** Why it cannot be read, e.g. `unknown state "migrating"`. */
  reason: string;
  /** Unix epoch ms of the move. */
  quarantinedAtMs: number;
}

/** DeviceStore keeps one row per device id. */
export interface DeviceStore {
  /** get returns the row of deviceId or undefined. */
  get(deviceId: string): DeviceRecord | undefined;
  /** list returns every row ordered by device id. */
  list(): DeviceRecord[];
  /** insert adds a row; throws when the id already has one. */
  insert(record: DeviceRecord): void;
  /** update replaces the state, device path and/or handover token of a row and stamps updatedAtMs. */
  update(deviceId: string, change: RecordChange, nowMs: number): void;
  /** delete drops the row; false when there was none. */
  delete(deviceId: string): boolean;
  /** quarantined returns the rows set aside as unreadable; they are never served or swept. */
  quarantined(): QuarantinedRow[];
  /** close releases the store. */
  close(): void;
}

/** A row of another slot's table, as {@link SlotPeers.peerRows} reports it. */
export interface PeerRow {
  /** The other slot ("a", "b" or "default"). */
  slot: string;
  record: DeviceRecord;
}

/**
 * SlotPeers gives a slot a read-only view of the other slots' tables (they share the state
 * dir) and a lock that serialises decisions that read another slot's table and then write
 * this slot's (RecoverDevice, AbortHandover, the crash-convergence rule), so that no device is
 * ever owned by two tables.
 */
export interface SlotPeers {
  /** This slot ("a", "b" or "default"). */
  readonly self: string;
  /** peerRows returns the rows of deviceId in the other slots' tables. */
  peerRows(deviceId: string): PeerRow[];
  /** exclusive runs fn while no other slot runs an exclusive section. */
  exclusive<T>(fn: () => Promise<T>): Promise<T>;
  /** The other slots, by name. */
  readonly others: readonly string[];
  /**
   * ifStopped: when no process holds slot's lock (the slot is not running), holds that lock
   * while fn runs with the slot's table opened read-write (undefined when it has none), so
   * the slot cannot start meanwhile, and resolves true; resolves false (fn not run) when the
   * slot runs. Call it inside {@link exclusive}.
   */
  ifStopped(slot: string, fn: (table: DeviceStore | undefined) => Promise<void>): Promise<boolean>;
}

/** NoPeers is SlotPeers for a manager alone on its state dir (tests). */
export class NoPeers implements SlotPeers {
  readonly self = 'default';
  private tail: Promise<unknown> = Promise.resolve();
  /** peerRows: none. */
  peerRows(): PeerRow[] {
    return [];
  }
  readonly others: readonly string[] = [];
  /** ifStopped: there are no other slots. */
  async ifStopped(_slot: string, fn: (table: DeviceStore | undefined) => Promise<void>): Promise<boolean> {
    await fn(undefined);
    return true;
  }
  /** exclusive: a promise chain in this process. */
  exclusive<T>(fn: () => Promise<T>): Promise<T> {
    const next = this.tail.then(fn);
    this.tail = next.catch(() => undefined);
    return next;
  }
}
