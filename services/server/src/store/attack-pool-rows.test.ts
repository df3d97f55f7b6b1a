// Attacker findings (fixed).
// Warm-pool rows in records.db's pools table that are garbage (an operator's sqlite3, a bad
// restore, a bug of another release). The store must skip what it cannot serve and report it in
// quarantinedRows (status), and that report must stay small enough for status to answer.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { createLogger } from '@sandnode/shared';
import { SqliteRecordStore } from './sqlite-record-store';

const log = createLogger('test', '0', 'silent');

describe('garbage rows of the pools table', () => {
  let dir: string;
  let file: string;
  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'attacker-pools-'));
    file = path.join(dir, 'records.db');
    new SqliteRecordStore(file, log).close();
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  function withRow(sql: string): SqliteRecordStore {
    const s = new SqliteRecordStore(file, log);
    s.pools().list();
    s.close();
    const raw = new Database(file);
    raw.exec(sql);
    raw.close();
    return new SqliteRecordStore(file, log);
  }

  // fromRow accepts any safe integer: GetPoolStatus (PoolStatus.resources, uint32 fields) then
  // fails to serialize and `sandnode pool status` answers "INTERNAL: Error serializing response"
  // for every pool of the node.
  it('a row with resources beyond uint32 is skipped and reported, not served', () => {
    const big = 2 ** 53 - 1;
    const t = withRow(`INSERT INTO pools VALUES ('base@1c${big}m${big}d0p', 'base', 1, '{"vcpus":1,"memoryMib":${big},"diskBytes":${big},"pids":0}', 0)`);
    expect(t.pools().list()).toEqual([]);
    expect(t.quarantinedRows().map((r) => r.key)).toEqual([`pool base@1c${big}m${big}d0p`]);
    t.close();
  });

  // a template that is no template name (SetPool refuses it: validateTemplateName) is served by
  // the store; each refill fails for ever instead of the row being reported
  it('a row whose template is not a template name is skipped and reported', () => {
    const t = withRow(`INSERT INTO pools VALUES ('../../etc', '../../etc', 1, '', 0); INSERT INTO pools VALUES ('', '', 1, '', 0)`);
    expect(t.pools().list()).toEqual([]);
    expect(t.quarantinedRows()).toHaveLength(2);
    t.close();
  });

  // every skipped row is reported with its whole key, twice (key and reason): one row with a
  // 2.2 MB key makes GetLeaseStatus exceed gRPC's 4 MiB message, findActiveServer sees no answer,
  // and status / pool set / upgrade server all say "no active server" while the server runs.
  it('the report of a row with a huge key stays small', () => {
    const t = withRow(`INSERT INTO pools VALUES ('k' || printf('%.*c', 2200000, 'k'), 'base', 1, '', 0)`);
    expect(t.pools().list()).toEqual([]);
    const rows = t.quarantinedRows();
    expect(rows).toHaveLength(1);
    expect(JSON.stringify(rows).length).toBeLessThan(64 * 1024);
    t.close();
  });

  it('many bad rows: at most 200 reported one by one and one row counting the rest', () => {
    const values = Array.from({ length: 250 }, (_, i) => `('bad${i}', 'base', 1, '', 0)`).join(', ');
    const t = withRow(`INSERT INTO pools VALUES ${values}`);
    expect(t.pools().list()).toEqual([]);
    const rows = t.quarantinedRows();
    expect(rows).toHaveLength(201);
    expect(rows[200]).toEqual({ key: '', reason: expect.stringMatching(/^50 more rows not shown \(250 in all/), quarantinedAtMs: 0 });
    t.close();
  });
});
