/**
 * SqliteRecordStore on a real SQLite file: rows that cannot be served (garbage, truncated, a
 * newer schema, a blob id other than the key, a key that is not a sandbox id, a VM or device id
 * that is not an id, a blob over 1 MiB, a copy of another sandbox's parts) are moved to the
 * quarantine table at open with the reason, never served and never thrown; the good rows are.
 */
import { chmodSync, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { createLogger } from '@sandnode/shared';
import { RuntimeRecord, type DeepPartial } from '@sandnode/shared/proto/server/v1/record';
import { SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { SqliteRecordStore } from './sqlite-record-store';

const log = createLogger('test', '0', 'silent');
const GOOD = 'sb-00000000000000a1';
const BAD = 'sb-00000000000000b2';

function bytes(fields: DeepPartial<RuntimeRecord>): Buffer {
  return Buffer.from(RuntimeRecord.encode(RuntimeRecord.fromPartial({ schema: 1, state: SandboxState.SANDBOX_STATE_RUNNING, template: 'base', ...fields })).finish());
}

describe('SqliteRecordStore', () => {
  let dir: string;
  let file: string;

  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-records-'));
    file = path.join(dir, 'records.db');
    new SqliteRecordStore(file, log).close(); // creates the tables
    rawRow(GOOD, bytes({ sandboxId: GOOD }));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('a new records.db and one left 0644 by an older release are 0600 after a write, and so are their -wal and -shm (the umask is not asked)', () => {
    const old = path.join(dir, 'old.db');
    writeFileSync(old, '');
    chmodSync(old, 0o644);
    const modes: Record<string, string> = {};
    for (const f of [path.join(dir, 'new.db'), old]) {
      const s = new SqliteRecordStore(f, log);
      s.tokens().create({ name: 'perm', role: 'read', ttlMs: 0 });
      for (const x of ['', '-wal', '-shm']) modes[path.basename(f) + x] = (statSync(f + x).mode & 0o777).toString(8);
      s.close();
    }
    expect(modes).toEqual({ 'new.db': '600', 'new.db-wal': '600', 'new.db-shm': '600', 'old.db': '600', 'old.db-wal': '600', 'old.db-shm': '600' });
  });

  /** rawRow writes a row as another process (or a bug) might, bypassing put(). */
  function rawRow(key: unknown, record: unknown): void {
    const db = new Database(file);
    db.prepare('INSERT INTO records (sandbox_id, state, updated_at_ms, record) VALUES (?, ?, 0, ?)').run(key, 'RUNNING', record);
    db.close();
  }

  function quarantineRows(): { sandbox_id: string; reason: string }[] {
    const db = new Database(file, { readonly: true });
    const rows = db.prepare<[], { sandbox_id: string; reason: string }>('SELECT sandbox_id, reason FROM quarantine ORDER BY rowid').all();
    db.close();
    return rows;
  }

  const bad: [string, () => unknown, RegExp][] = [
    ['garbage bytes', () => Buffer.from([0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]), /does not decode/],
    ['a truncated record', () => bytes({ sandboxId: BAD, template: 'a-long-template-name' }).subarray(0, 20), /does not decode/],
    ['a newer schema', () => bytes({ sandboxId: BAD, schema: 2 }), /does not decode: .*schema 2 is newer/],
    ['a JSON {} text', () => '{}', /not protobuf bytes/],
    ['an empty blob (no id)', () => Buffer.alloc(0), /carries sandbox id "", not its row key/],
    ['a blob naming another id (a duplicate of GOOD)', () => bytes({ sandboxId: GOOD }), /carries sandbox id "sb-00000000000000a1", not its row key/],
    ['a 5 MB blob', () => bytes({ sandboxId: BAD, metadata: { big: 'x'.repeat(5 << 20) } }), /is 5242\d{3} bytes, more than 1048576/],
    ['a VM id with path characters', () => bytes({ sandboxId: BAD, vm: { vmId: '../../../x', pid: 1 } }), /VM id "..\/..\/..\/x" is not an id/],
    [
      'a device id with path characters',
      () => bytes({ sandboxId: BAD, devices: [{ deviceId: '../../x', role: 1, path: '/dev/sda', backingFile: '/etc/passwd', sizeBytes: 1 }] }),
      /device id "..\/..\/x" is not an id/,
    ],
    ['a reset upper id in upper case', () => bytes({ sandboxId: BAD, resetUpperDeviceId: 'UPPER_CASE' }), /reset_upper_device_id "UPPER_CASE" is not an id/],
  ];
  it.each(bad)('sets aside a row holding %s at open; serves the good row; never throws', (_what, make, reason) => {
    rawRow(BAD, make());
    const s = new SqliteRecordStore(file, log);
    expect(s.list().map((r) => r.sandboxId)).toEqual([GOOD]);
    expect(s.get(BAD)).toBeUndefined();
    expect(s.get(GOOD)?.sandboxId).toBe(GOOD);
    expect(s.quarantined.get(BAD)).toMatch(reason);
    expect(s.quarantinedIds()).toEqual([BAD]);
    s.close();
    expect(quarantineRows()).toEqual([{ sandbox_id: BAD, reason: expect.stringMatching(reason) }]);
    // the row is gone from records, the quarantine remembered across opens
    const again = new SqliteRecordStore(file, log);
    expect(again.list().map((r) => r.sandboxId)).toEqual([GOOD]);
    expect(again.quarantinedIds()).toEqual([BAD]);
    again.close();
  });

  it.each([['SB-00000000000000A1'], [` ${GOOD}`], ['']])('sets aside a row keyed %j (not a sandbox id): list never shows what delete cannot remove', (key) => {
    rawRow(key, bytes({ sandboxId: key }));
    const s = new SqliteRecordStore(file, log);
    expect(s.list().map((r) => r.sandboxId)).toEqual([GOOD]);
    expect(s.quarantinedIds()).toEqual([]);
    s.close();
    expect(quarantineRows()).toEqual([{ sandbox_id: key, reason: expect.stringMatching(/is not a sandbox id/) }]);
  });

  it('every listed record is deleted by the id it shows', () => {
    rawRow(BAD, bytes({ sandboxId: GOOD })); // a second row carrying GOOD's id
    const s = new SqliteRecordStore(file, log);
    for (const r of s.list()) s.delete(r.sandboxId);
    expect(s.list()).toEqual([]);
    expect(s.get(GOOD)).toBeUndefined();
    s.close();
  });

  it('put refuses an id that is not a sandbox id and writes nothing', () => {
    const s = new SqliteRecordStore(file, log);
    const rec = s.get(GOOD)!;
    expect(() => s.put({ ...rec, sandboxId: `${GOOD} ` })).toThrow(/is not a sandbox id/);
    expect(s.list().map((r) => r.sandboxId)).toEqual([GOOD]);
    s.close();
  });

  it('put refuses a record that would be set aside when read (a bad part id, over 1 MiB) and writes nothing', () => {
    const s = new SqliteRecordStore(file, log);
    const rec = s.get(GOOD)!;
    expect(() => s.put({ ...rec, resetUpperDeviceId: 'UPPER_CASE' })).toThrow(/reset_upper_device_id "UPPER_CASE" is not an id/);
    expect(() => s.put({ ...rec, metadata: { big: 'x'.repeat(2 << 20) } })).toThrow(/more than 1048576/);
    expect(s.get(GOOD)).toMatchObject({ resetUpperDeviceId: '', metadata: {} });
    s.close();
  });

  it("sets aside at open a copy of another sandbox's record (its VM and devices), keeps the original", () => {
    const parts = (id: string) => ({
      vm: { vmId: id, pid: 7 },
      devices: [
        { deviceId: `${id}-upper`, role: 1, path: '/dev/loop1', backingFile: '/i/u', sizeBytes: 1 },
        { deviceId: `${id}-ws`, role: 2, path: '/dev/loop2', backingFile: '/i/w', sizeBytes: 1 },
      ],
    });
    const first = new SqliteRecordStore(file, log);
    first.delete(GOOD);
    first.close();
    rawRow(GOOD, bytes({ sandboxId: GOOD, ...parts(GOOD) }));
    rawRow(BAD, bytes({ sandboxId: BAD, state: SandboxState.SANDBOX_STATE_CREATING, ...parts(GOOD) }));
    const s = new SqliteRecordStore(file, log);
    expect(s.list().map((r) => r.sandboxId)).toEqual([GOOD]);
    expect(s.quarantined.get(BAD)).toBe(`it lists vm ${GOOD} of sandbox ${GOOD}`);
    s.close();
    expect(quarantineRows()).toEqual([{ sandbox_id: BAD, reason: `it lists vm ${GOOD} of sandbox ${GOOD}` }]);
  });

  it('mentioning finds the records that list an id (not the one excepted), ignoring empty needles', () => {
    rawRow(BAD, bytes({ sandboxId: BAD, devices: [{ deviceId: `${GOOD}-ws`, role: 2 }] }));
    const s = new SqliteRecordStore(file, log);
    expect(s.mentioning([`${GOOD}-ws`, ''], GOOD).map((r) => r.sandboxId)).toEqual([BAD]);
    expect(s.mentioning([`${GOOD}-ws`], BAD).map((r) => r.sandboxId)).toEqual([]);
    expect(s.mentioning([GOOD], '').map((r) => r.sandboxId)).toEqual([GOOD, BAD]);
    expect(s.mentioning([''], '')).toEqual([]);
    s.close();
  });

  it('a row that goes bad after open is set aside on read, not thrown', () => {
    const s = new SqliteRecordStore(file, log);
    rawRow(BAD, Buffer.from([0x0a, 0x40, 0x01]));
    expect(s.get(BAD)).toBeUndefined();
    expect(s.list().map((r) => r.sandboxId)).toEqual([GOOD]);
    expect(s.quarantinedIds()).toEqual([BAD]);
    s.close();
  });

  it('keeps a state value unknown to this version (9) on read and rewrite', () => {
    rawRow(BAD, bytes({ sandboxId: BAD, state: 9 as SandboxState }));
    const s = new SqliteRecordStore(file, log);
    const rec = s.get(BAD)!;
    expect(rec.state).toBe('UNKNOWN');
    s.put({ ...rec, expiresAtMs: 5 });
    expect(RuntimeRecord.decode(new Database(file, { readonly: true }).prepare<[string], { record: Buffer }>('SELECT record FROM records WHERE sandbox_id = ?').get(BAD)!.record).state).toBe(9);
    s.close();
  });
});
