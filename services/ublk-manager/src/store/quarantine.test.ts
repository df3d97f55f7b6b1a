import Database from 'better-sqlite3';
import { FailedPreconditionError, type Logger } from '@sandnode/shared';
import { useTempDir } from '@sandnode/testkit';
import type { DeviceRecord } from '../core/types';
import { deviceDbPath, SqliteDeviceStore } from './sqlite-device-store';

const rec = (id: string, over: Partial<DeviceRecord> = {}): DeviceRecord => ({
  deviceId: id,
  state: 'ready',
  sizeBytes: 1 << 20,
  sourceImage: '',
  filesystem: 'ext4',
  readOnly: false,
  backingFile: `/images/${id}.img`,
  path: '',
  createdAtMs: 10,
  updatedAtMs: 10,
  handoverToken: '',
  clonedFrom: '',
  ...over,
});

/** A logger that keeps its warn lines (fields and msg) in lines. */
function capture(): { log: Logger; lines: Record<string, unknown>[] } {
  const lines: Record<string, unknown>[] = [];
  const log = { warn: (obj: Record<string, unknown>, msg: string) => lines.push({ ...obj, level: 40, msg }) } as unknown as Logger;
  return { log, lines };
}

const RAW_INSERT = `INSERT INTO devices (device_id, state, size_bytes, source_image, filesystem, read_only, backing_file, path, created_at_ms, updated_at_ms)
  VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`;

describe('SqliteDeviceStore: rows this version cannot read', () => {
  const tempDir = useTempDir('ublk-quarantine');
  let file: string;
  beforeEach(() => {
    file = deviceDbPath(tempDir());
    const s = new SqliteDeviceStore(file, { imagesDir: '/images' });
    s.insert(rec('good-a'));
    s.insert(rec('good-b', { state: 'creating' }));
    s.close();
  });

  it('quarantines bad rows at open (one move, named and logged), serves the good ones', () => {
    const db = new Database(file);
    db.prepare(RAW_INSERT).run('newer-state', 'migrating', 1 << 20, '', 'ext4', 0, '/images/newer-state.img', '', 10, 10);
    db.prepare(RAW_INSERT).run('newer-fs', 'ready', 1 << 20, '', 'xfs', 0, '/images/newer-fs.img', '/dev/loop7', 10, 10);
    db.prepare(RAW_INSERT).run('../evil', 'ready', 1 << 20, '', 'ext4', 0, '/images/x.img', '', 10, 10);
    db.prepare(RAW_INSERT).run('neg-size', 'ready', -5, '', 'ext4', 0, '/images/neg-size.img', '', 10, 10);
    db.prepare(RAW_INSERT).run('rel-path', 'ready', 1 << 20, '', 'ext4', 2, 'images/rel.img', '', 10, 10);
    db.close();

    const { log, lines } = capture();
    const s = new SqliteDeviceStore(file, { log, imagesDir: '/images' });
    expect(s.list().map((r) => r.deviceId)).toEqual(['good-a', 'good-b']);
    expect(s.get('newer-state')).toBeUndefined();
    expect(s.get('good-a')).toEqual(rec('good-a'));
    const q = s.quarantined();
    expect(q.map((x) => [x.deviceId, x.reason])).toEqual(
      expect.arrayContaining([
        ['newer-state', 'unknown state "migrating"'],
        ['newer-fs', 'unknown filesystem "xfs"'],
        ['../evil', 'device_id "../evil" is not a device id'],
        ['neg-size', 'size_bytes -5 is not a non-negative integer'],
        ['rel-path', 'read_only 2 is not 0 or 1'],
      ]),
    );
    expect(q).toHaveLength(5);
    expect(JSON.parse(q.find((x) => x.deviceId === 'newer-fs')!.rowJson)).toMatchObject({ device_id: 'newer-fs', filesystem: 'xfs', path: '/dev/loop7' });
    expect(q.every((x) => x.quarantinedAtMs > 0)).toBe(true);
    const warns = lines.filter((l) => l.level === 40 && /quarantined/.test(String(l.msg)));
    expect(warns.map((w) => w.device_id).sort()).toEqual(['../evil', 'neg-size', 'newer-fs', 'newer-state', 'rel-path']);
    expect(warns.find((w) => w.device_id === 'newer-state')?.reason).toBe('unknown state "migrating"');
    // The id of a quarantined row is not reused (its image is not ours).
    expect(() => s.insert(rec('newer-state'))).toThrow(FailedPreconditionError);
    expect(() => s.insert(rec('newer-state'))).toThrow(/quarantined \(unknown state "migrating"\)/);
    s.close();

    // The move is durable: a reopen finds them in the quarantine table and not in devices.
    const raw = new Database(file, { readonly: true });
    expect((raw.prepare('SELECT device_id FROM devices ORDER BY device_id').all() as { device_id: string }[]).map((r) => r.device_id)).toEqual(['good-a', 'good-b']);
    expect((raw.prepare('SELECT count(*) AS n FROM quarantine').get() as { n: number }).n).toBe(5);
    raw.close();
  });

  it('a row that goes bad while running is quarantined by list/get, which never throw for it', () => {
    const { log } = capture();
    const s = new SqliteDeviceStore(file, { log, imagesDir: '/images' });
    const db = new Database(file);
    db.prepare(RAW_INSERT).run('late', 'frozen', 1 << 20, '', 'ext4', 0, '/images/late.img', '', 10, 10);
    db.prepare(RAW_INSERT).run('late-get', 'ready', 1 << 20, '', 'zfs', 0, '/images/late-get.img', '', 10, 10);
    db.close();
    expect(s.get('late-get')).toBeUndefined();
    expect(s.list().map((r) => r.deviceId)).toEqual(['good-a', 'good-b']);
    expect(s.quarantined().map((x) => x.deviceId)).toEqual(['late-get', 'late']);
    s.close();
  });

  it('garbage in a non-STRICT table (NULLs, wrong types) is quarantined, not a crash', () => {
    // A table not made by this version: no STRICT, no NOT NULL.
    const db0 = new Database(file);
    db0.exec('DROP TABLE devices');
    db0.exec(
      'CREATE TABLE devices (device_id TEXT PRIMARY KEY, state TEXT, size_bytes INTEGER, source_image TEXT, filesystem TEXT, read_only INTEGER, backing_file TEXT, path TEXT, created_at_ms INTEGER, updated_at_ms INTEGER, handover_token TEXT, cloned_from TEXT)',
    );
    db0.prepare(RAW_INSERT).run('ok', 'ready', 1 << 20, '', 'ext4', 0, '/images/ok.img', '', 10, 10);
    db0.prepare(RAW_INSERT).run('nulls', 'ready', null, null, 'ext4', 0, '/images/nulls.img', null, 10, 10);
    db0.prepare(RAW_INSERT).run('texty', 'ready', 'big', '', 'ext4', 0, '/images/texty.img', '', 10, 10);
    db0.prepare(RAW_INSERT).run(null, 'ready', 1, '', 'ext4', 0, '/images/none.img', '', 10, 10);
    db0.close();
    const s = new SqliteDeviceStore(file, { imagesDir: '/images' });
    expect(s.list().map((r) => r.deviceId)).toEqual(['ok']);
    expect(
      s
        .quarantined()
        .map((x) => x.deviceId)
        .sort(),
    ).toEqual(['', 'nulls', 'texty']);
    s.close();
  });

  it('keeps a column of a newer release (a device role, value 9) through update and re-insert, as read', () => {
    // A newer release added `role` without a schema bump (as 0.2.0 added cloned_from).
    const db = new Database(file);
    db.exec('ALTER TABLE devices ADD COLUMN role INTEGER NOT NULL DEFAULT 0');
    db.prepare('UPDATE devices SET role = 9 WHERE device_id = ?').run('good-a');
    db.close();
    const s = new SqliteDeviceStore(file, { imagesDir: '/images' });
    const a = s.get('good-a')!;
    expect(a.extra).toEqual({ role: 9 });
    expect(s.get('good-b')!.extra).toEqual({ role: 0 });
    // read-modify-write 1: update
    s.update('good-a', { state: 'released', handoverToken: 't1' }, 20);
    // read-modify-write 2: the row moves (takeover / RecoverDevice delete + insert of the read record)
    const moved = s.get('good-a')!;
    s.delete('good-a');
    s.insert({ ...moved, state: 'ready', path: '/dev/loop2', updatedAtMs: 30 });
    // ... and into another slot's table that has the column too
    const other = deviceDbPath(tempDir(), 'b');
    const o = new SqliteDeviceStore(other, { imagesDir: '/images' });
    o.close();
    const odb = new Database(other);
    odb.exec('ALTER TABLE devices ADD COLUMN role INTEGER NOT NULL DEFAULT 0');
    odb.close();
    const o2 = new SqliteDeviceStore(other, { imagesDir: '/images' });
    o2.insert(s.get('good-a')!);
    expect(o2.get('good-a')).toMatchObject({ state: 'ready', path: '/dev/loop2', extra: { role: 9 } });
    o2.close();
    s.close();
    const raw = new Database(file, { readonly: true });
    expect(raw.prepare("SELECT role, state FROM devices WHERE device_id = 'good-a'").get()).toEqual({ role: 9, state: 'ready' });
    raw.close();
  });
});
