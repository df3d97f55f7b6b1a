import { spawnSync } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import { describeWith, useTempDir, type Part } from '@sandnode/testkit';
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
  clonedFrom: '',
  ...over,
});

/** Release 0.1.0's own store code, from the compat matrix's build cache (compat-tests/.cache). */
const BUILDS = path.resolve(__dirname, '..', '..', '..', '..', 'compat-tests', '.cache', 'builds');
const STORE_JS = path.join('services', 'ublk-manager', 'dist', 'store', 'sqlite-device-store.js');
/** release010Store is 0.1.0's built store module in the cache, or undefined (no cache, or its build not finished). */
const release010 = (): { store: string; node: string } | undefined => {
  const dir = existsSync(BUILDS) ? readdirSync(BUILDS).find((d) => d.startsWith('0.1.0-')) : undefined;
  if (!dir || !existsSync(path.join(BUILDS, dir, STORE_JS))) return undefined;
  // the Node the build's node_modules were built for (its native addons load only there)
  try {
    const m = JSON.parse(readFileSync(path.join(BUILDS, dir, 'node_modules', '.sandnode-node.json'), 'utf8')) as { node?: string };
    return m.node && existsSync(m.node) ? { store: path.join(BUILDS, dir, STORE_JS), node: m.node } : undefined;
  } catch {
    return undefined;
  }
};
const release010Store = (): string | undefined => release010()?.store;

/**
 * withOld runs body (JavaScript, `S` is 0.1.0's SqliteDeviceStore class) in a child process on
 * 0.1.0's own Node, and returns what body returns (JSON).
 */
function withOld(body: string): unknown {
  const r010 = release010()!;
  const script = `const { SqliteDeviceStore: S } = require(${JSON.stringify(r010.store)}); const out = (() => { ${body} })(); process.stdout.write(JSON.stringify(out === undefined ? null : out));`;
  const r = spawnSync(r010.node, ['-e', script], { encoding: 'utf8', timeout: 30_000 });
  if (r.status !== 0) throw new Error(`0.1.0 store on ${r010.node}: ${r.stderr}`);
  return JSON.parse(r.stdout) as unknown;
}
/**
 * The 0.1.0 build in the compat cache. CI-provided: `.ci/run` builds the releases
 * (`npm run compat -- --only wire --skip`) before the tests, so under CI=true a missing build fails.
 */
const RELEASE_010: Part = {
  name: `a 0.1.0 build in ${BUILDS} (${STORE_JS} and the Node it was built for; npm run compat builds it)`,
  present: () => release010Store() !== undefined,
  ciProvides: true,
};

describe('SqliteDeviceStore', () => {
  const tempDir = useTempDir('ublk-store');
  let dir: string;
  beforeEach(() => (dir = tempDir()));

  it('lives at <stateDir>/ublk-manager/<slot or default>/devices.db with WAL and synchronous=FULL', () => {
    expect(deviceDbPath(dir, 'a')).toBe(path.join(dir, 'ublk-manager', 'a', 'devices.db'));
    const file = deviceDbPath(dir);
    expect(file).toBe(path.join(dir, 'ublk-manager', 'default', 'devices.db'));
    const s = new SqliteDeviceStore(file, { imagesDir: '/images' });
    s.close();
    const db = new Database(file);
    expect(db.pragma('journal_mode', { simple: true })).toBe('wal');
    expect(db.pragma('user_version', { simple: true })).toBe(DEVICE_DB_SCHEMA);
    db.close();
    const s2 = new SqliteDeviceStore(file, { imagesDir: '/images' });
    expect((s2 as unknown as { db: Database.Database }).db.pragma('synchronous', { simple: true })).toBe(2);
    s2.close();
  });

  it('a new devices.db and one left 0644 by an older release are 0600 after a write, and so are their -wal and -shm (the umask is not asked)', () => {
    const old = deviceDbPath(dir, 'old');
    mkdirSync(path.dirname(old), { recursive: true });
    writeFileSync(old, '');
    chmodSync(old, 0o644);
    const modes: Record<string, string> = {};
    for (const [name, f] of [
      ['new', deviceDbPath(dir, 'new')],
      ['old', old],
    ] as const) {
      const s = new SqliteDeviceStore(f, { imagesDir: '/images' });
      s.insert(rec('a'));
      for (const x of ['', '-wal', '-shm']) modes[name + x] = (statSync(f + x).mode & 0o777).toString(8);
      s.close();
    }
    expect(modes).toEqual({ new: '600', 'new-wal': '600', 'new-shm': '600', old: '600', 'old-wal': '600', 'old-shm': '600' });
  });

  it('inserts, updates, lists by id, deletes, and survives reopening', () => {
    const file = deviceDbPath(dir);
    const s = new SqliteDeviceStore(file, { imagesDir: '/images' });
    s.insert(rec('b'));
    s.insert(rec('a', { sourceImage: '/tpl/x.img', filesystem: 'inherited', readOnly: true }));
    expect(() => s.insert(rec('a'))).toThrow();
    s.update('b', { state: 'ready', path: '/dev/loop3' }, 20);
    s.update('b', { path: '/dev/loop4' }, 30);
    expect(() => s.update('zz', { state: 'ready' }, 1)).toThrow(/no row/);
    s.close();
    const r = new SqliteDeviceStore(file, { imagesDir: '/images' });
    expect(r.list().map((x) => x.deviceId)).toEqual(['a', 'b']);
    expect(r.get('a')).toEqual(rec('a', { sourceImage: '/tpl/x.img', filesystem: 'inherited', readOnly: true }));
    expect(r.get('b')).toEqual(rec('b', { state: 'ready', path: '/dev/loop4', updatedAtMs: 30 }));
    expect(r.delete('a')).toBe(true);
    expect(r.delete('a')).toBe(false);
    expect(r.get('a')).toBeUndefined();
    r.close();
  });

  it('keeps cloned_from; adds the column to a table without it (no schema bump) and keeps its rows', () => {
    const file = deviceDbPath(dir);
    // A table as release 0.1.0 creates it (schema 2, no cloned_from).
    new SqliteDeviceStore(file, { imagesDir: '/images' }).close();
    const db = new Database(file);
    db.exec('ALTER TABLE devices DROP COLUMN cloned_from');
    db.prepare(
      `INSERT INTO devices (device_id, state, size_bytes, source_image, filesystem, read_only, backing_file, path, created_at_ms, updated_at_ms, handover_token)
       VALUES ('old', 'ready', 1048576, '', 'ext4', 0, '/images/old.img', '', 10, 10, '')`,
    ).run();
    db.close();
    const s = new SqliteDeviceStore(file, { imagesDir: '/images' });
    expect(s.get('old')).toEqual(rec('old', { state: 'ready' }));
    s.insert(rec('kid', { state: 'ready', clonedFrom: 'old' }));
    s.update('kid', { path: '/dev/loop9' }, 11);
    expect(s.get('kid')).toMatchObject({ clonedFrom: 'old', path: '/dev/loop9' });
    s.close();
    const raw = new Database(file, { readonly: true });
    expect(raw.pragma('user_version', { simple: true })).toBe(DEVICE_DB_SCHEMA);
    raw.close();
  });

  describeWith('with release 0.1.0', [RELEASE_010], () => {
    it('a table written by this version is read and written by release 0.1.0, and vice versa, keeping cloned_from', () => {
      const file = deviceDbPath(dir);
      const s = new SqliteDeviceStore(file, { imagesDir: '/images' });
      s.insert(rec('parent', { state: 'ready' }));
      s.insert(rec('kid', { state: 'ready', clonedFrom: 'parent', path: '/dev/loop1' }));
      s.close();
      // 0.1.0 opens it, reads every row, updates one, inserts one and deletes one.
      const seen = withOld(`
        const o = new S(${JSON.stringify(file)});
        const ids = o.list().map((r) => r.deviceId);
        const kid = o.get('kid');
        o.update('kid', { path: '/dev/loop2' }, 50);
        o.insert(${JSON.stringify(rec('by-old', { state: 'ready' }))});
        o.delete('parent');
        o.close();
        return { ids, kid };`) as { ids: string[]; kid: DeviceRecord };
      expect(seen.ids).toEqual(['kid', 'parent']);
      expect(seen.kid).toMatchObject({ state: 'ready', path: '/dev/loop1' });
      // This version reads what 0.1.0 wrote; the clone's cloned_from survived 0.1.0's update.
      const n = new SqliteDeviceStore(file, { imagesDir: '/images' });
      expect(n.get('kid')).toMatchObject({ clonedFrom: 'parent', path: '/dev/loop2', updatedAtMs: 50 });
      expect(n.get('by-old')).toEqual(rec('by-old', { state: 'ready' }));
      n.close();
      // A table first made by 0.1.0 is opened by this version (column added), then by 0.1.0 again.
      const file2 = deviceDbPath(dir, 'b');
      withOld(`const o2 = new S(${JSON.stringify(file2)}); o2.insert(${JSON.stringify(rec('x', { state: 'ready' }))}); o2.close();`);
      const n2 = new SqliteDeviceStore(file2, { imagesDir: '/images' });
      n2.insert(rec('y', { state: 'ready', clonedFrom: 'x' }));
      n2.close();
      expect(withOld(`const o3 = new S(${JSON.stringify(file2)}); const ids = o3.list().map((r) => r.deviceId); o3.close(); return ids;`)).toEqual(['x', 'y']);
    });
  });

  it('refuses a database of a newer schema, naming both versions', () => {
    const file = deviceDbPath(dir);
    new SqliteDeviceStore(file, { imagesDir: '/images' }).close();
    const db = new Database(file);
    db.pragma(`user_version = ${DEVICE_DB_SCHEMA + 1}`);
    db.close();
    expect(() => new SqliteDeviceStore(file, { imagesDir: '/images' })).toThrow(new RegExp(`schema ${DEVICE_DB_SCHEMA + 1} .*\\(${DEVICE_DB_SCHEMA}\\)`));
  });
});
