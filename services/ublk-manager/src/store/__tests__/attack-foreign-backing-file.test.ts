/**
 * Adversarial finding (issue 11, bad rows): a devices.db row is trusted for the file it names.
 * A row whose backing_file lies outside the images dir, or is another row's image, passes the
 * quarantine (it only asks for an absolute path) and then:
 * - state creating/deleting: adoption's cleanup unlinks that file (seen on a real node:
 *   /tmp/victim1.txt outside the state dir was removed at `sandnode up`; a `deleting` row naming
 *   another sandbox's workspace image removed that image under the running sandbox);
 * - state ready: adoption attaches the foreign file as a loop device, and DeleteDevice (the
 *   server's orphan sweep at takeover does it) unlinks it and leaves the loop device attached
 *   (it is not in the images dir, so the delete does not see it).
 * The store must set such rows aside and nothing may act on a path taken from them.
 * Real SQLite store and real image files; the block driver is the in-memory fake.
 */
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import { createLogger } from '@sandnode/shared';
import { useTempDir } from '@sandnode/testkit';
import { FakeDriver } from '../../core/__tests__/fakes';
import { DeviceManager } from '../../core/device-manager';
import { FileImages } from '../../drivers/images';
import { deviceDbPath, MAX_DEVICE_ROW_BYTES, SqliteDeviceStore } from '../sqlite-device-store';

const log = createLogger('test', '0', 'silent');
const RAW_INSERT = `INSERT INTO devices (device_id, state, size_bytes, source_image, filesystem, read_only, backing_file, path, created_at_ms, updated_at_ms)
  VALUES (?, ?, ?, ?, ?, ?, ?, ?, 10, 10)`;

describe('device rows naming a file that is not their own image', () => {
  const tempDir = useTempDir('ublk-attack-backing');

  it('are never attached, and the files they name are never unlinked', async () => {
    const root = tempDir();
    const imagesDir = path.join(root, 'state', 'images');
    const outside = path.join(root, 'outside');
    mkdirSync(imagesDir, { recursive: true });
    mkdirSync(outside, { recursive: true });
    const victim1 = path.join(outside, 'victim1.txt');
    const victim2 = path.join(outside, 'victim2.img');
    const goodImage = path.join(imagesDir, 'good-a.img');
    for (const f of [victim1, victim2, goodImage]) writeFileSync(f, 'precious');

    const file = deviceDbPath(path.join(root, 'state'));
    new SqliteDeviceStore(file).close();
    const db = new Database(file);
    db.prepare(RAW_INSERT).run('good-a', 'ready', 8, '', 'ext4', 0, goodImage, '/dev/loop0');
    db.prepare(RAW_INSERT).run('evil-creating', 'creating', 8, '', 'ext4', 0, victim1, '');
    db.prepare(RAW_INSERT).run('evil-ready', 'ready', 8, '', 'ext4', 0, victim2, '');
    db.prepare(RAW_INSERT).run('evil-deleting', 'deleting', 8, '', 'ext4', 0, goodImage, '/dev/loop0');
    db.close();

    const driver = new FakeDriver();
    driver.devices.set('/dev/loop0', { path: '/dev/loop0', backingFile: goodImage, readOnly: false, flags: [] });
    const store = new SqliteDeviceStore(file, { log });
    try {
      const manager = new DeviceManager({ store, driver, images: new FileImages(imagesDir), log, limits: { maxDeviceSizeBytes: 1 << 30 } });
      await manager.adopt();
      // what the server's orphan sweep does with a device no record owns
      for (const id of ['evil-creating', 'evil-ready', 'evil-deleting']) await manager.delete(id).catch(() => undefined);

      expect({ victim1: existsSync(victim1), victim2: existsSync(victim2), goodImage: existsSync(goodImage) }).toEqual({ victim1: true, victim2: true, goodImage: true });
      expect(driver.calls.filter((c) => c.startsWith('attach'))).toEqual([]);
      expect(driver.devices.get('/dev/loop0')?.backingFile).toBe(goodImage);
      expect(store.get('good-a')?.backingFile).toBe(goodImage);
    } finally {
      store.close();
    }
  });

  it('a row over the size bound is quarantined with a short reason', () => {
    const root = tempDir();
    const imagesDir = path.join(root, 'state', 'images');
    mkdirSync(imagesDir, { recursive: true });
    const file = deviceDbPath(path.join(root, 'state'));
    new SqliteDeviceStore(file).close();
    const db = new Database(file);
    db.prepare(RAW_INSERT).run('huge', 'ready', 8, '/x/'.repeat(2 * 1024 * 1024), 'ext4', 0, path.join(imagesDir, 'huge.img'), '');
    db.prepare(RAW_INSERT).run('huge-state', 'x'.repeat(MAX_DEVICE_ROW_BYTES - 500), 8, '', 'ext4', 0, path.join(imagesDir, 'huge-state.img'), '');
    db.prepare(RAW_INSERT).run('fine', 'ready', 8, '/tmp/src.img', 'ext4', 0, path.join(imagesDir, 'fine.img'), '/dev/loop1');
    db.close();
    const store = new SqliteDeviceStore(file, { log });
    try {
      expect(store.list().map((r) => r.deviceId)).toEqual(['fine']);
      const q = store.quarantined();
      expect(q.map((x) => x.deviceId).sort()).toEqual(['huge', 'huge-state']);
      expect(q.find((x) => x.deviceId === 'huge')?.reason).toMatch(/over the 16384-byte bound/);
      expect(q.every((x) => x.reason.length < 1024)).toBe(true);
    } finally {
      store.close();
    }
  });
});
