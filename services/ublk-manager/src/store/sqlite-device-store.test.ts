import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import type { DeviceRecord } from '../core/types';
import { DEVICE_DB_SCHEMA, deviceDbPath, SqliteDeviceStore } from './sqlite-device-store';

const rec = (id: string, over: Partial<DeviceRecord> = {}): DeviceRecord => ({
  deviceId: id,
  state: 'creating',
  sizeBytes: 1 << 20,
  sourceImage: '',
  filesystem: 'ext4',
  readOnly: false,
  backingFile: `/images/${id}.img`,
  path: '',
  createdAtMs: 10,
  updatedAtMs: 10,
  handoverToken: '',
  ...over,
});

describe('SqliteDeviceStore', () => {
  let dir: string;
  beforeEach(() => (dir = mkdtempSync(path.join(os.tmpdir(), 'ublk-store-'))));
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('lives at <stateDir>/ublk-manager/<slot or default>/devices.db with WAL and synchronous=FULL', () => {
    expect(deviceDbPath(dir, 'a')).toBe(path.join(dir, 'ublk-manager', 'a', 'devices.db'));
    const file = deviceDbPath(dir);
    expect(file).toBe(path.join(dir, 'ublk-manager', 'default', 'devices.db'));
    const s = new SqliteDeviceStore(file);
    s.close();
    const db = new Database(file);
    expect(db.pragma('journal_mode', { simple: true })).toBe('wal');
    expect(db.pragma('user_version', { simple: true })).toBe(DEVICE_DB_SCHEMA);
    db.close();
    const s2 = new SqliteDeviceStore(file);
    expect((s2 as unknown as { db: Database.Database }).db.pragma('synchronous', { simple: true })).toBe(2);
    s2.close();
  });

  it('inserts, updates, lists by id, deletes, and survives reopening', () => {
    const file = deviceDbPath(dir);
    const s = new SqliteDeviceStore(file);
    s.insert(rec('b'));
    s.insert(rec('a', { sourceImage: '/tpl/x.img', filesystem: 'inherited', readOnly: true }));
    expect(() => s.insert(rec('a'))).toThrow();
    s.update('b', { state: 'ready', path: '/dev/loop3' }, 20);
    s.update('b', { path: '/dev/loop4' }, 30);
    expect(() => s.update('zz', { state: 'ready' }, 1)).toThrow(/no row/);
    s.close();
    const r = new SqliteDeviceStore(file);
    expect(r.list().map((x) => x.deviceId)).toEqual(['a', 'b']);
    expect(r.get('a')).toEqual(rec('a', { sourceImage: '/tpl/x.img', filesystem: 'inherited', readOnly: true }));
    expect(r.get('b')).toEqual(rec('b', { state: 'ready', path: '/dev/loop4', updatedAtMs: 30 }));
    expect(r.delete('a')).toBe(true);
    expect(r.delete('a')).toBe(false);
    expect(r.get('a')).toBeUndefined();
    r.close();
  });

  it('refuses a database of a newer schema, naming both versions', () => {
    const file = deviceDbPath(dir);
    new SqliteDeviceStore(file).close();
    const db = new Database(file);
    db.pragma(`user_version = ${DEVICE_DB_SCHEMA + 1}`);
    db.close();
    expect(() => new SqliteDeviceStore(file)).toThrow(new RegExp(`schema ${DEVICE_DB_SCHEMA + 1} .*\\(${DEVICE_DB_SCHEMA}\\)`));
  });
});
