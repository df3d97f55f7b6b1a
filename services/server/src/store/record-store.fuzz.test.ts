/**
 * Store fuzz (issue 11 §3): for each seed, records.db gets good rows plus random, truncated,
 * bit-flipped, duplicated, newer-schema, mistyped and mis-keyed rows (written as another process
 * or a bug might, bypassing put()). Opening the store never throws; every good row is served as
 * written; every row that cannot be served is quarantined with a reason (and stays so across a
 * reopen); a row that is served is keyed by the id it carries; the store still writes. A failure
 * names its seed (re-run with FUZZ_SEED=n).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { createLogger, SANDBOX_ID_RE } from '@sandnode/shared';
import { RuntimeRecord } from '@sandnode/shared/proto/server/v1/record';
import { SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { seededRandom, type Rng } from '@sandnode/testkit';
import { RECORD_SCHEMA } from '../core/types';
import { SqliteRecordStore } from './sqlite-record-store';

const log = createLogger('test', '0', 'silent');
const SEEDS = process.env.FUZZ_SEED ? [Number(process.env.FUZZ_SEED)] : Array.from({ length: 60 }, (_, i) => i + 1);

const id = (r: Rng) => `sb-${r.bytes(8).toString('hex')}`;
const blob = (fields: Partial<RuntimeRecord>) =>
  Buffer.from(RuntimeRecord.encode(RuntimeRecord.fromPartial({ schema: 1, state: SandboxState.SANDBOX_STATE_RUNNING, template: 'base', poddAddress: 'unix:///run/p.sock', ...fields })).finish());

/** must: the row cannot be served (quarantined); either: it may decode (then it is keyed by its id) or be quarantined. */
type Expect = 'must' | 'either';
type Bad = { key: unknown; record: unknown; expect: Expect; kind: string };

function badRow(r: Rng, goods: string[]): Bad {
  const key = id(r);
  const valid = blob({ sandboxId: key, template: `t-${r.int(0, 1e6)}`, metadata: { k: 'v'.repeat(r.int(0, 40)) } });
  switch (r.int(0, 7)) {
    case 0:
      return { key, record: r.bytes(r.int(1, 64)), expect: 'must', kind: 'random bytes' };
    case 1:
      return { key, record: valid.subarray(0, r.int(1, valid.length - 1)), expect: 'either', kind: 'truncated' };
    case 2: {
      const b = Buffer.from(valid);
      const at = r.int(0, b.length - 1);
      b[at] = b[at]! ^ (1 << r.int(0, 7));
      return { key, record: b, expect: 'either', kind: 'bit flip' };
    }
    case 3:
      return { key, record: blob({ sandboxId: r.pick(goods) }), expect: 'must', kind: 'duplicate of a good record' };
    case 4:
      return { key, record: blob({ sandboxId: key, schema: RECORD_SCHEMA + r.int(1, 1000) }), expect: 'must', kind: 'newer schema' };
    case 5:
      return { key, record: r.pick(['{}', '', 'null', r.bytes(8).toString('hex'), r.int(-1e9, 1e9), 1.5]), expect: 'must', kind: 'not a blob' };
    case 6: {
      const k = r.pick(['', 'sb-', '../x', 'SB-0000000000000000', `sb-${r.bytes(7).toString('hex')}`, r.bytes(6).toString('base64')]);
      return { key: k, record: blob({ sandboxId: k }), expect: 'must', kind: 'key not a sandbox id' };
    }
    default:
      return { key, record: Buffer.alloc(0), expect: 'must', kind: 'empty blob' };
  }
}

describe('records.db fuzz at open', () => {
  let dir: string;
  beforeEach(() => (dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-recfuzz-'))));
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it.each(SEEDS)('seed %i: the store opens, serves the good rows, quarantines the bad ones with a reason', (seed) => {
    const r = seededRandom(seed);
    const file = path.join(dir, `records-${seed}.db`);
    new SqliteRecordStore(file, log).close();
    const goods = Array.from({ length: r.int(1, 5) }, () => id(r));
    // a state from a newer server (9) is a good row too: served as UNKNOWN, never quarantined
    const newerState = r.chance(0.5) ? goods[0] : undefined;
    const bads = Array.from({ length: r.int(1, 12) }, () => badRow(r, goods));
    const db = new Database(file);
    const ins = db.prepare('INSERT OR IGNORE INTO records (sandbox_id, state, updated_at_ms, record) VALUES (?, ?, 0, ?)');
    db.transaction(() => {
      for (const g of goods) ins.run(g, 'RUNNING', blob({ sandboxId: g, state: g === newerState ? (9 as SandboxState) : SandboxState.SANDBOX_STATE_RUNNING }));
      for (const b of bads) ins.run(b.key, r.pick(['RUNNING', 'NOPE', '']), b.record);
    })();
    db.close();

    let s!: SqliteRecordStore;
    expect(() => (s = new SqliteRecordStore(file, log))).not.toThrow();
    const listed = s.list();
    for (const g of goods) {
      const rec = s.get(g);
      expect({ seed, id: g, rec: rec && { sandboxId: rec.sandboxId, state: rec.state } }).toEqual({ seed, id: g, rec: { sandboxId: g, state: g === newerState ? 'UNKNOWN' : 'RUNNING' } });
    }
    for (const rec of listed) expect(SANDBOX_ID_RE.test(rec.sandboxId)).toBe(true);
    for (const b of bads) {
      if (typeof b.key !== 'string' || goods.includes(b.key)) continue;
      const served = s.get(b.key);
      const reason = s.quarantined.get(b.key);
      if (b.expect === 'must' || !served) {
        expect({ kind: b.kind, served: served !== undefined, reason: typeof reason === 'string' && reason.length > 0 }).toEqual({ kind: b.kind, served: false, reason: true });
      } else {
        expect({ kind: b.kind, sandboxId: served.sandboxId, quarantined: reason !== undefined }).toEqual({ kind: b.kind, sandboxId: b.key, quarantined: false });
      }
    }
    const ids = listed.map((x) => x.sandboxId);
    expect(ids).toEqual([...ids].sort());
    expect(ids).toEqual(expect.arrayContaining(goods));
    // the store still writes, and the quarantine is remembered across a reopen
    s.delete(goods[0]!);
    s.close();
    const again = new SqliteRecordStore(file, log);
    expect(again.list().map((x) => x.sandboxId)).toEqual(ids.filter((x) => x !== goods[0]));
    expect([...again.quarantined.keys()].sort()).toEqual([...s.quarantined.keys()].sort());
    again.close();
  });
});
