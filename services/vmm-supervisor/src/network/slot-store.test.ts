import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { parseSlotRow, SlotStore, type SlotRow } from './slot-store';

const row = (slot: number, over: Partial<SlotRow> = {}): SlotRow => ({ slot, state: 'in-use', owner: 'sb-a', vmId: 'vm-a', egress: { allowOut: [], denyOut: [], blockAll: false }, ...over });

describe('SlotStore', () => {
  let db: Database.Database;
  beforeEach(() => {
    db = new Database(':memory:');
  });
  afterEach(() => db.close());

  test('put/get/list/delete, ordered by slot', () => {
    const s = new SlotStore(db);
    s.put(row(5));
    s.put(row(2, { state: 'spare', owner: '', vmId: '' }));
    expect(s.list().map((r) => r.slot)).toEqual([2, 5]);
    expect(s.get(5)).toEqual(row(5));
    expect(s.delete(5)).toBe(true);
    expect(s.get(5)).toBeUndefined();
  });

  test('a bad row is quarantined on read, never served, and its slot is never handed out', () => {
    const seen: number[] = [];
    const s = new SlotStore(db, (q) => seen.push(q.slot));
    s.put(row(1));
    db.prepare('INSERT INTO network_slots (slot, record) VALUES (?, ?)').run(3, '{"slot":3,"state":"weird"}');
    db.prepare('INSERT INTO network_slots (slot, record) VALUES (?, ?)').run(4, 'not json');
    db.prepare('INSERT INTO network_slots (slot, record) VALUES (?, ?)').run(6, JSON.stringify(row(7)));
    expect(s.list().map((r) => r.slot)).toEqual([1]);
    expect(seen).toEqual([3, 4, 6]);
    expect(s.quarantinedSlots()).toEqual(new Set([3, 4, 6]));
    expect(db.prepare('SELECT count(*) AS n FROM network_slots').get()).toEqual({ n: 1 });
  });

  test('a second row of one owner or one VM is quarantined (the in-use one is kept), with a reason naming the row kept', () => {
    const seen: { slot: number; reason: string }[] = [];
    const s = new SlotStore(db, (q) => seen.push(q));
    s.put(row(1, { state: 'reserved', vmId: '' }));
    s.put(row(4));
    s.put(row(6, { owner: 'sb-b' }));
    s.put(row(8, { owner: 'sb-c', vmId: 'vm-c' }));
    expect(s.list().map((r) => r.slot)).toEqual([4, 8]);
    expect(seen).toEqual([
      { slot: 1, reason: "a second row of owner sb-a: slot 4 (in-use) is that owner's" },
      { slot: 6, reason: "a second row of vm vm-a: slot 4 (in-use) is that vm's" },
    ]);
    expect(s.quarantinedSlots()).toEqual(new Set([1, 6]));
    // what ListNetworkSlots (and so `sandnode status`) reports, oldest first
    expect(s.quarantined().map(({ slot, reason }) => ({ slot, reason }))).toEqual(seen);
    expect(s.quarantined().every((q) => q.quarantinedAtMs > 0)).toBe(true);
    expect(s.list().map((r) => r.slot)).toEqual([4, 8]);
    expect(seen).toHaveLength(2);
  });

  test('a row keyed outside the slot range says so (not "slot -5 is not the row\'s key -5")', () => {
    expect(() => parseSlotRow(JSON.stringify(row(-5)), -5)).toThrow(/^slot -5 is outside 0\.\.268435455$/);
    expect(() => parseSlotRow(JSON.stringify(row(7)), 6)).toThrow(/^slot 7 is not the row's key 6$/);
  });

  test('parseSlotRow checks every field and canonicalises the policy', () => {
    const ok = parseSlotRow(JSON.stringify(row(1, { egress: { allowOut: ['b.com', '1.2.3.4', 'a.com'], denyOut: [], blockAll: true } })), 1);
    expect(ok.egress).toEqual({ allowOut: ['1.2.3.4/32', 'a.com', 'b.com'], denyOut: [], blockAll: true });
    expect(parseSlotRow(JSON.stringify({ ...row(1), wasReserved: true }), 1).wasReserved).toBe(true);
    const bad: [unknown, RegExp][] = [
      [JSON.stringify({ ...row(1), vmId: '' }), /needs a vmId/],
      [JSON.stringify({ ...row(1), state: 'reserved' }), /has a vmId/],
      [JSON.stringify({ ...row(1), state: 'reserved', vmId: '', owner: '' }), /needs an owner/],
      [JSON.stringify({ ...row(1), owner: 'Not An Id' }), /owner/],
      [JSON.stringify({ ...row(1), egress: { allowOut: ['10.1.2.3/8'], denyOut: [], blockAll: false } }), /egress: .*host bits/],
      [JSON.stringify({ ...row(1), egress: null }), /not a policy/],
      [42, /not a string/],
      [JSON.stringify({ ...row(1), wasReserved: 'yes' }), /wasReserved/],
    ];
    for (const [raw, why] of bad) expect(() => parseSlotRow(raw, 1)).toThrow(why);
  });

  test('on a WAL file (slot writes commit with synchronous=NORMAL) the connection is FULL again after put, and the row survives a kill -9 right after it', () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'slot-store-wal-'));
    try {
      const file = path.join(dir, 'vm-table.db');
      const child = `
        const Database = require(${JSON.stringify(require.resolve('better-sqlite3'))});
        const { SlotStore } = require(${JSON.stringify(path.resolve(__dirname, '../../dist/network/slot-store.js'))});
        const db = new Database(${JSON.stringify(file)}); db.pragma('journal_mode = WAL'); db.pragma('synchronous = FULL');
        const s = new SlotStore(db);
        s.put(${JSON.stringify(row(9))});
        if (db.pragma('synchronous', { simple: true }) !== 2) process.exit(5);
        process.kill(process.pid, 'SIGKILL');`;
      const r = spawnSync(process.execPath, ['-e', child], { encoding: 'utf8' });
      expect({ signal: r.signal, status: r.status, stderr: r.stderr }).toEqual({ signal: 'SIGKILL', status: null, stderr: '' });
      const again = new Database(file);
      try {
        expect(new SlotStore(again).get(9)).toEqual(row(9));
      } finally {
        again.close();
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
