/**
 * Store fuzz (issue 11 §3): for each seed, devices.db gets good rows plus rows with random,
 * truncated or mistyped fields, unknown states and filesystems (a newer release's), ids that are
 * not device ids and columns a newer release added (written as another process might, bypassing
 * insert()). Opening the store never throws; every good row is served as written (a newer
 * release's extra column kept); every bad row is quarantined with a reason, never served, and its
 * id refused by insert(); the store still writes. A failure names its seed (FUZZ_SEED=n re-runs it).
 */
import Database from 'better-sqlite3';
import { RESOURCE_ID_RE } from '@sandnode/shared';
import { seededRandom, useTempDir, type Rng } from '@sandnode/testkit';
import type { DeviceRecord } from '../core/types';
import { checkRow, deviceDbPath, SqliteDeviceStore } from './sqlite-device-store';

const SEEDS = process.env.FUZZ_SEED ? [Number(process.env.FUZZ_SEED)] : Array.from({ length: 60 }, (_, i) => i + 1);

const good = (id: string, r: Rng): DeviceRecord => ({
  deviceId: id,
  state: r.pick(['creating', 'ready', 'deleting', 'released'] as const),
  sizeBytes: r.int(0, 1 << 30),
  sourceImage: r.pick(['', '/templates/base.img']),
  filesystem: r.pick(['ext4', 'none', 'inherited'] as const),
  readOnly: r.chance(0.5),
  backingFile: `/images/${id}.img`,
  path: r.pick(['', '/dev/loop3']),
  createdAtMs: r.int(0, 1e12),
  updatedAtMs: r.int(0, 1e12),
  handoverToken: '',
  clonedFrom: '',
});

type Row = Record<string, string | number>;
const toRow = (d: DeviceRecord): Row => ({
  device_id: d.deviceId,
  state: d.state,
  size_bytes: d.sizeBytes,
  source_image: d.sourceImage,
  filesystem: d.filesystem,
  read_only: d.readOnly ? 1 : 0,
  backing_file: d.backingFile,
  path: d.path,
  created_at_ms: d.createdAtMs,
  updated_at_ms: d.updatedAtMs,
});

/** badRow damages one field of a good row so that this version cannot read it (checkRow says why). */
function badRow(r: Rng, row: Row): Row {
  const b = { ...row };
  const text = (s: string) => s.slice(0, r.int(0, s.length - 1));
  switch (r.int(0, 7)) {
    case 0:
      b.state = r.pick(['migrating', 'READY', '', r.bytes(4).toString('hex'), text('ready')]);
      break;
    case 1:
      b.filesystem = r.pick(['xfs', 'btrfs', '', text('ext4')]);
      break;
    case 2:
      b.device_id = r.pick(['', '../evil', 'a/b', '.', ' ', `x${'y'.repeat(300)}`, r.bytes(6).toString('base64')]);
      break;
    case 3:
      b[r.pick(['size_bytes', 'created_at_ms', 'updated_at_ms'])] = -r.int(1, 1e9);
      break;
    case 4:
      b.read_only = r.pick([2, -1, 7]);
      break;
    case 5:
      b.backing_file = r.pick(['', 'images/rel.img', text(String(b.backing_file)).replace(/^\//, '')]);
      break;
    case 6:
      b.state = `${String(b.state)}\u0000${r.bytes(3).toString('hex')}`;
      break;
    default:
      b.filesystem = r.pick(['zfs', 'EXT4']);
      b.state = r.pick(['ready', 'frozen']);
  }
  return b;
}

describe('devices.db fuzz at open', () => {
  const tmp = useTempDir('ublk-devfuzz');

  it.each(SEEDS)('seed %i: the store opens, serves the good rows, quarantines the bad ones with a reason', (seed) => {
    const r = seededRandom(seed);
    const file = deviceDbPath(tmp());
    const withExtra = r.chance(0.5);
    const s0 = new SqliteDeviceStore(file, { imagesDir: '/images' });
    s0.close();
    const goods = Array.from({ length: r.int(1, 5) }, (_, i) => good(`dev-g${i}-${r.int(0, 999)}`, r));
    const bads = Array.from({ length: r.int(1, 10) }, (_, i) => badRow(r, { ...toRow(good(`dev-b${i}-${r.int(0, 999)}`, r)) }));
    const db = new Database(file);
    // a column added by a newer release (no schema bump): kept, the row still served
    if (withExtra) db.exec("ALTER TABLE devices ADD COLUMN future TEXT NOT NULL DEFAULT 'f'");
    const insert = (row: Row) => {
      const cols = Object.keys(row);
      db.prepare(`INSERT OR IGNORE INTO devices (${cols.join(', ')}) VALUES (${cols.map(() => '?').join(', ')})`).run(...cols.map((c) => row[c]));
    };
    db.transaction(() => {
      for (const g of goods) insert(toRow(g));
      for (const b of bads) insert(b);
    })();
    db.close();

    let s!: SqliteDeviceStore;
    expect(() => (s = new SqliteDeviceStore(file, { imagesDir: '/images' }))).not.toThrow();
    const want = goods.map((g) => (withExtra ? { ...g, extra: { future: 'f' } } : g)).sort((a, b) => (a.deviceId < b.deviceId ? -1 : 1));
    expect({ seed, list: s.list() }).toEqual({ seed, list: want });
    const held = new Map(s.quarantined().map((q) => [q.deviceId, q.reason]));
    for (const b of bads) {
      const id = String(b.device_id);
      if (goods.some((g) => g.deviceId === id)) continue;
      expect({ seed, id, why: checkRow(b, '/images') !== undefined }).toEqual({ seed, id, why: true });
      expect({ seed, id, served: s.get(id) !== undefined, reason: (held.get(id) ?? '').length > 0 }).toEqual({ seed, id, served: false, reason: true });
      if (RESOURCE_ID_RE.test(id)) expect(() => s.insert(good(id, r))).toThrow(/quarantined/);
    }
    // the store still writes; the quarantine and the good rows survive a reopen
    const fresh = good(`dev-new-${seed}`, r);
    s.insert(fresh);
    s.close();
    const again = new SqliteDeviceStore(file, { imagesDir: '/images' });
    expect(again.list().map((d) => d.deviceId)).toEqual([...want.map((d) => d.deviceId), fresh.deviceId].sort());
    expect(again.quarantined().length).toBe(held.size);
    again.close();
  });
});
