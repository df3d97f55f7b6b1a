/**
 * devices.db locked by another process (a real sqlite3 CLI, issue 11 SQLITE_BUSY): reads go on,
 * a write is StoreBusyError (UNAVAILABLE) after a few ms instead of a 5 s event-loop stall, a
 * gated writing call answers UNAVAILABLE without running, and everything works once the lock is gone.
 */
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { DEADLINE_METADATA_KEY, gateWritesWhileBusy, StoreBusyError, waitWhileBusy } from '@sandnode/shared';
import { holdSqliteLock, useTempDir, type HeldSqliteLock } from '@sandnode/testkit';
import type { DeviceRecord } from '../core/types';
import { DEVICE_WRITES } from '../main';
import { deviceDbPath, SqliteDeviceStore } from './sqlite-device-store';

const rec = (id: string): DeviceRecord => ({
  deviceId: id,
  state: 'ready',
  sizeBytes: 1 << 20,
  sourceImage: '',
  filesystem: 'ext4',
  readOnly: false,
  backingFile: `/images/${id}.img`,
  path: '/dev/loop7',
  createdAtMs: 10,
  updatedAtMs: 10,
  handoverToken: '',
  clonedFrom: '',
});

const ctx = (deadlineMs: number) => ({ signal: new AbortController().signal, metadata: { get: (k: string) => (k === DEADLINE_METADATA_KEY ? String(deadlineMs) : undefined) } });

describe('devices.db held by another process', () => {
  const tmp = useTempDir('ublk-busy');
  let holder: HeldSqliteLock | undefined;
  afterEach(async () => holder?.release());

  test('reads go on, writes are StoreBusyError, a gated write does not run, and all succeed after the lock goes', async () => {
    const file = deviceDbPath(tmp());
    const store = new SqliteDeviceStore(file, { imagesDir: '/images' });
    store.insert(rec('dev-a'));
    holder = await holdSqliteLock(file);
    const loop = monitorEventLoopDelay({ resolution: 1 });
    loop.enable();
    expect(store.get('dev-a')?.state).toBe('ready');
    expect(() => store.insert(rec('dev-b'))).toThrow(StoreBusyError);
    expect(() => store.update('dev-a', { state: 'deleting' }, 20)).toThrow(StoreBusyError);
    expect(() => store.delete('dev-a')).toThrow(StoreBusyError);
    let ran = 0;
    const write = async (_req: unknown, _ctx: unknown) => ++ran;
    const impl = gateWritesWhileBusy(
      {
        createDevice: write,
        deleteDevice: write,
        releaseDevice: write,
        recoverDevice: write,
        abortHandover: write,
        handoverAll: write,
        cloneDevice: write,
        quiesceDevice: async (_req: unknown, _ctx: unknown) => 'no db',
      },
      DEVICE_WRITES,
      store,
      { what: 'devices.db', maxWaitMs: 200 },
    );
    await expect(impl.createDevice({}, ctx(Date.now() + 5000))).rejects.toThrow(/devices.db: createDevice: the database is locked/);
    // the call's deadline bounds the wait too
    await expect(impl.deleteDevice({}, ctx(Date.now() + 60))).rejects.toThrow(StoreBusyError);
    await expect(impl.quiesceDevice({}, ctx(Date.now() + 5000))).resolves.toBe('no db');
    loop.disable();
    expect(ran).toBe(0);
    process.stderr.write(`ublk sqlite-busy: event loop max block ${(loop.max / 1e6).toFixed(1)} ms with devices.db locked\n`);
    await holder.release();
    await expect(impl.createDevice({}, ctx(Date.now() + 5000))).resolves.toBe(1);
    store.insert(rec('dev-b'));
    expect(store.list().map((r) => [r.deviceId, r.state])).toEqual([
      ['dev-a', 'ready'],
      ['dev-b', 'ready'],
    ]);
    store.close();
  });

  test('an open of a table locked even for readers waits asynchronously, then is StoreBusyError; it opens once the lock goes', async () => {
    const file = deviceDbPath(tmp());
    new SqliteDeviceStore(file, { imagesDir: '/images' }).close();
    holder = await holdSqliteLock(file, { exclusive: true });
    await expect(waitWhileBusy(() => new SqliteDeviceStore(file, { imagesDir: '/images' }), { what: 'open', maxWaitMs: 200 })).rejects.toThrow(StoreBusyError);
    await holder.release();
    (await waitWhileBusy(() => new SqliteDeviceStore(file, { imagesDir: '/images' }), { what: 'open', maxWaitMs: 200 })).close();
  });
});
