/**
 * SlotStore: the network slot table, in the VM table's SQLite file (table `network_slots`, one
 * JSON row per slot that is not free). Rows are checked whenever read, like VM rows: a bad one
 * is moved to `network_slot_quarantine` (slot, raw, reason, quarantined_at_ms), logged through
 * onQuarantine and never used (its slot is then neither free nor served: the allocator skips
 * quarantined slot numbers so a half-known slot is never handed out twice).
 */
import type Database from 'better-sqlite3';
import { busyToUnavailable, formatEgressPolicy, parseEgressPolicy, RESOURCE_ID_RE, type EgressPolicyInput } from '@sandnode/shared';

/** SlotState: spare (pre-made, no owner), in-use (a VM of the table), reserved (kept for owner, forwarding refused). */
export type SlotState = 'spare' | 'in-use' | 'reserved';

/** SlotRow is one slot that is not free. */
export interface SlotRow {
  slot: number;
  state: SlotState;
  /** The owner (sandbox id); '' for a spare. */
  owner: string;
  /** The VM using it (in-use); else ''. */
  vmId: string;
  /** The egress policy in canonical wire form (parseEgressPolicy + formatEgressPolicy). */
  egress: EgressPolicyInput;
  /** in-use: the slot was reserved for owner before this VM took it (a VM lost in a crash gives it back to the owner). */
  wasReserved?: boolean;
}

/** A slot row that could not be read. */
export interface QuarantinedSlot {
  slot: number;
  reason: string;
}

const STATES: SlotState[] = ['spare', 'in-use', 'reserved'];
/** Largest slot number a row may name (a /2 pool; real pools are far smaller). */
const MAX_SLOT = 2 ** 28;

/** parseSlotRow checks one stored row; throws Error naming what is wrong. */
export function parseSlotRow(raw: unknown, key: number): SlotRow {
  if (typeof raw !== 'string' || raw.length > 64 * 1024) throw new Error('record is not a string of at most 64 KiB');
  let o: Record<string, unknown>;
  try {
    o = JSON.parse(raw) as Record<string, unknown>;
  } catch (err) {
    throw new Error(`record is not JSON: ${(err as Error).message}`, { cause: err });
  }
  if (typeof o !== 'object' || o === null || Array.isArray(o)) throw new Error('record is not an object');
  if (!Number.isSafeInteger(key) || key < 0 || key >= MAX_SLOT) throw new Error(`slot ${key} is outside 0..${MAX_SLOT - 1}`);
  if (o.slot !== key) throw new Error(`slot ${JSON.stringify(o.slot)} is not the row's key ${key}`);
  if (!STATES.includes(o.state as SlotState)) throw new Error(`state ${JSON.stringify(o.state)} is not one of ${STATES.join(', ')}`);
  const state = o.state as SlotState;
  if (typeof o.owner !== 'string' || (o.owner !== '' && !RESOURCE_ID_RE.test(o.owner))) throw new Error('owner is not a resource id');
  if (typeof o.vmId !== 'string' || (o.vmId !== '' && !RESOURCE_ID_RE.test(o.vmId))) throw new Error('vmId is not a resource id');
  if ((state === 'in-use') !== (o.vmId !== '')) throw new Error(`a ${state} slot ${state === 'in-use' ? 'needs' : 'has'} a vmId`);
  if (state !== 'spare' && o.owner === '') throw new Error(`a ${state} slot needs an owner`);
  const e = o.egress as EgressPolicyInput;
  if (typeof e !== 'object' || e === null || !Array.isArray(e.allowOut) || !Array.isArray(e.denyOut) || typeof e.blockAll !== 'boolean') throw new Error('egress is not a policy');
  let egress: EgressPolicyInput;
  try {
    egress = formatEgressPolicy(parseEgressPolicy(e));
  } catch (err) {
    throw new Error(`egress: ${(err as Error).message}`, { cause: err });
  }
  if (o.wasReserved !== undefined && typeof o.wasReserved !== 'boolean') throw new Error('wasReserved is not a boolean');
  return { slot: key, state, owner: o.owner, vmId: o.vmId, egress, ...(o.wasReserved ? { wasReserved: true } : {}) };
}

/** slotKeys: what a row holds that no other row may: its owner (not a spare) and its VM (in use). */
function slotKeys(row: SlotRow): string[] {
  const keys: string[] = [];
  if (row.state !== 'spare') keys.push(`owner:${row.owner}`);
  if (row.state === 'in-use') keys.push(`vm:${row.vmId}`);
  return keys;
}

interface Row {
  slot: number;
  record: unknown;
}

/**
 * SlotStore persists SlotRows. Writes commit with `synchronous=NORMAL` on a WAL file (the VM
 * table's own writes stay FULL): a committed row is in the WAL when put/delete returns, so it
 * survives a crash of the process (kill -9) but not a power loss, and skips the WAL fsync
 * (~3 ms of a pool acquire here). A power loss also takes every netns and veth the rows
 * describe, and adopt() re-makes or frees slots from the rows it finds (docs/decisions.md,
 * "Slot rows: durable against a crash, not a power loss"). On a file that is not WAL the
 * connection's own setting is used.
 */
export class SlotStore {
  private readonly wal: boolean;
  private readonly stmts = new Map<string, Database.Statement>();

  constructor(
    private readonly db: Database.Database,
    private readonly onQuarantine: (q: QuarantinedSlot) => void = () => {},
  ) {
    this.wal = String(db.pragma('journal_mode', { simple: true })).toLowerCase() === 'wal';
    db.exec('CREATE TABLE IF NOT EXISTS network_slots (slot INTEGER PRIMARY KEY, record TEXT NOT NULL)');
    db.exec('CREATE TABLE IF NOT EXISTS network_slot_quarantine (slot INTEGER NOT NULL, raw TEXT, reason TEXT NOT NULL, quarantined_at_ms INTEGER NOT NULL)');
  }

  /** list returns every good row, ordered by slot; bad rows and second rows of one owner or VM are quarantined. */
  list(): SlotRow[] {
    return this.read(
      busyToUnavailable('vm-table.db: read slots', () => this.stmt('SELECT slot, record FROM network_slots ORDER BY slot').all() as Row[]),
      true,
    );
  }

  /** get returns slot's row, or undefined (free, or quarantined just now). */
  get(slot: number): SlotRow | undefined {
    const r = busyToUnavailable('vm-table.db: read slot', () => this.stmt('SELECT slot, record FROM network_slots WHERE slot = ?').get(slot) as Row | undefined);
    return r ? this.read([r])[0] : undefined;
  }

  /** quarantinedSlots are the slot numbers with a quarantined row (never allocated). */
  quarantinedSlots(): Set<number> {
    return new Set((this.stmt('SELECT slot FROM network_slot_quarantine').all() as { slot: number }[]).map((r) => r.slot));
  }

  /** quarantined lists the quarantined rows (slot, reason, when: Unix epoch ms), oldest first. */
  quarantined(): { slot: number; reason: string; quarantinedAtMs: number }[] {
    return busyToUnavailable('vm-table.db: read slot quarantine', () =>
      (this.stmt('SELECT slot, reason, quarantined_at_ms FROM network_slot_quarantine ORDER BY rowid').all() as { slot: number; reason: string; quarantined_at_ms: number }[]).map((r) => ({
        slot: r.slot,
        reason: r.reason,
        quarantinedAtMs: r.quarantined_at_ms,
      })),
    );
  }

  /** put writes row (durable against a process crash on return; see the class). */
  put(row: SlotRow): void {
    const text = JSON.stringify(row);
    parseSlotRow(text, row.slot);
    busyToUnavailable(`vm-table.db: write slot ${row.slot}`, () =>
      this.crashSafe(() => this.stmt('INSERT INTO network_slots (slot, record) VALUES (?, ?) ON CONFLICT(slot) DO UPDATE SET record = excluded.record').run(row.slot, text)),
    );
  }

  /** stmt is sql prepared once per store (a prepare costs more than these one-row statements). */
  private stmt(sql: string): Database.Statement {
    let st = this.stmts.get(sql);
    if (!st) this.stmts.set(sql, (st = this.db.prepare(sql)));
    return st;
  }

  /** crashSafe runs one write committing with synchronous=NORMAL (WAL only), then restores the connection's setting. */
  private crashSafe<T>(fn: () => T): T {
    if (!this.wal || this.db.inTransaction) return fn();
    const was = Number(this.db.pragma('synchronous', { simple: true }));
    if (was <= 1) return fn();
    this.db.pragma('synchronous = NORMAL');
    try {
      return fn();
    } finally {
      this.db.pragma(`synchronous = ${was}`);
    }
  }

  /** delete frees slot (durable against a process crash on return); returns whether it had a row. */
  delete(slot: number): boolean {
    return busyToUnavailable(`vm-table.db: delete slot ${slot}`, () => this.crashSafe(() => this.stmt('DELETE FROM network_slots WHERE slot = ?').run(slot).changes > 0));
  }

  /**
   * read parses rows; a bad row is quarantined. When rows is the whole table (list), a second
   * row naming the owner or the VM of another is quarantined too: an owner holds one slot and
   * a VM uses one (release and the orphan sweep find one row by owner or VM, so the other would
   * stay in use for good). Of such rows the in-use one is kept (a running VM's rules come from
   * it), else the lowest slot.
   */
  private read(rows: Row[], whole = false): SlotRow[] {
    let good: SlotRow[] = [];
    for (const r of rows) {
      try {
        good.push(parseSlotRow(r.record, r.slot));
      } catch (err) {
        this.quarantine(r, (err as Error).message);
      }
    }
    if (!whole) return good;
    const keep = new Map<string, SlotRow>();
    for (const row of good) {
      for (const k of slotKeys(row)) {
        const had = keep.get(k);
        if (!had || (had.state !== 'in-use' && row.state === 'in-use')) keep.set(k, row);
      }
    }
    const dup = new Map<number, string>();
    for (const row of good) {
      for (const k of slotKeys(row)) {
        const kept = keep.get(k);
        if (kept && kept.slot !== row.slot && !dup.has(row.slot)) dup.set(row.slot, `a second row of ${k.replace(':', ' ')}: slot ${kept.slot} (${kept.state}) is that ${k.split(':')[0]}'s`);
      }
    }
    if (dup.size === 0) return good;
    for (const [slot, reason] of dup) this.quarantine({ slot, record: JSON.stringify(good.find((g) => g.slot === slot)) }, reason);
    good = good.filter((g) => !dup.has(g.slot));
    return good;
  }

  private quarantine(r: Row, why: string): void {
    const reason = why.slice(0, 512);
    this.db.transaction(() => {
      this.db.prepare('INSERT INTO network_slot_quarantine (slot, raw, reason, quarantined_at_ms) VALUES (?, ?, ?, ?)').run(r.slot, typeof r.record === 'string' ? r.record : null, reason, Date.now());
      this.stmt('DELETE FROM network_slots WHERE slot = ?').run(r.slot);
    })();
    this.onQuarantine({ slot: r.slot, reason });
  }
}
