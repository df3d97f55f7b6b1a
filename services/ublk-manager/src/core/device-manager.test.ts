import { createLogger, AlreadyExistsError, CommandError, FailedPreconditionError, InternalError, InvalidArgumentError, NotFoundError, ResourceExhaustedError } from '@sandnode/shared';
import { DeviceManager, EXCLUSIVE_SETTLE_MS } from './device-manager';
import { EXCLUSIVE_USE } from './driver';
import { MemoryDeviceStore } from './memory-store';
import { MIB } from './types';
import { DIR, FakeImages, input, LookupDriver, row, setup } from './__tests__/fakes';

describe('DeviceManager.create', () => {
  it('writes the row (creating) before making the image, then attaches and marks it ready', async () => {
    const { store, driver, images, manager } = setup();
    let stateAtCreate: string | undefined;
    images.onCreate = () => (stateAtCreate = store.get('dev-a')?.state);
    const d = await manager.create(input());
    expect(stateAtCreate).toBe('creating');
    expect(d).toMatchObject({ deviceId: 'dev-a', path: '/dev/loop0', state: 'attached', sizeBytes: 64 * MIB, backingFile: `${DIR}/dev-a.img`, driver: 'loop', flags: ['direct-io'] });
    expect(store.get('dev-a')).toMatchObject({ state: 'ready', path: '/dev/loop0' });
    expect(driver.calls).toEqual([`attach ${DIR}/dev-a.img`]);
  });

  it('is idempotent on device_id with the same spec (no second attach)', async () => {
    const { driver, manager } = setup();
    const a = await manager.create(input());
    const b = await manager.create(input());
    expect(b.path).toBe(a.path);
    expect(driver.calls).toHaveLength(1);
  });

  it('serialises concurrent creates of one id', async () => {
    const { driver, manager } = setup();
    const [a, b] = await Promise.all([manager.create(input()), manager.create(input())]);
    expect(a.path).toBe(b.path);
    expect(driver.calls).toHaveLength(1);
  });

  it('re-attaches an existing device that was detached', async () => {
    const { driver, manager } = setup();
    await manager.create(input());
    await driver.detach('/dev/loop0');
    const d = await manager.create(input());
    expect(d).toMatchObject({ state: 'attached', path: '/dev/loop1' });
  });

  it('refuses the same id with a different spec (ALREADY_EXISTS)', async () => {
    const { manager } = setup();
    await manager.create(input());
    await expect(manager.create(input({ sizeBytes: 32 * MIB }))).rejects.toBeInstanceOf(AlreadyExistsError);
    await expect(manager.create(input({ readOnly: true }))).rejects.toThrow(/different spec/);
  });

  it('clones a source image with its size and filesystem inherited', async () => {
    const { images, manager } = setup();
    images.files.set('/tpl/base.img', 16 * MIB);
    const d = await manager.create(input({ deviceId: 'c1', sizeBytes: 0, sourceImage: '/tpl/base.img', readOnly: true }));
    expect(d).toMatchObject({ sizeBytes: 16 * MIB, sourceImage: '/tpl/base.img', filesystem: 'inherited', readOnly: true });
    expect(images.files.get(`${DIR}/c1.img`)).toBe(16 * MIB);
  });

  it('reports a missing source_image as NOT_FOUND and changes nothing', async () => {
    const { store, images, manager } = setup();
    await expect(manager.create(input({ sizeBytes: 0, sourceImage: '/tpl/none.img' }))).rejects.toBeInstanceOf(NotFoundError);
    expect(store.list()).toEqual([]);
    expect(images.files.size).toBe(0);
  });

  it('rejects a source above the maximum naming source_image', async () => {
    const { images, manager } = setup(8 * MIB);
    images.files.set('/tpl/big.img', 16 * MIB);
    await expect(manager.create(input({ sizeBytes: 0, sourceImage: '/tpl/big.img' }))).rejects.toThrow(InvalidArgumentError);
  });

  it("undoes everything when mkfs fails and says which step failed, without the command's stderr", async () => {
    const { store, images, driver, manager } = setup();
    images.failFormat = new CommandError('mkfs.ext4 -q -F /images/dev-a.img: exit 1: mkfs.ext4: secret stderr line', 'mkfs.ext4: secret stderr line', 1);
    const err = await manager.create(input()).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(InternalError);
    expect((err as Error).message).toBe('CreateDevice "dev-a": format ext4 failed: host command mkfs.ext4 failed (exit 1); details in the ublk-manager log');
    expect(store.get('dev-a')).toBeUndefined();
    expect(images.files.size).toBe(0);
    expect(driver.calls).toEqual([]);
  });

  it('maps no free loop device to RESOURCE_EXHAUSTED and undoes the image', async () => {
    const { store, images, driver, manager } = setup();
    driver.failAttach = new ResourceExhaustedError('no free loop device');
    const err = await manager.create(input()).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ResourceExhaustedError);
    expect((err as Error).message).toContain('attach failed');
    expect(store.get('dev-a')).toBeUndefined();
    expect(images.files.size).toBe(0);
  });

  it('skips mkfs for filesystem none', async () => {
    const { images, manager } = setup();
    images.failFormat = new Error('must not run');
    await expect(manager.create(input({ filesystem: 'none' }))).resolves.toMatchObject({ filesystem: 'none' });
  });

  it('refuses to reuse an image file that no row owns (FAILED_PRECONDITION), leaving it alone', async () => {
    const { store, images, manager } = setup();
    images.files.set(`${DIR}/dev-a.img`, 5);
    await expect(manager.create(input())).rejects.toBeInstanceOf(FailedPreconditionError);
    expect(images.files.get(`${DIR}/dev-a.img`)).toBe(5);
    expect(store.list()).toEqual([]);
  });

  it('cleans up a leftover creating row before creating again', async () => {
    const { store, images, driver, manager } = setup();
    store.insert(row({ deviceId: 'dev-a', state: 'creating', backingFile: `${DIR}/dev-a.img` }));
    images.files.set(`${DIR}/dev-a.img`, 1);
    driver.devices.set('/dev/loop9', { path: '/dev/loop9', backingFile: `${DIR}/dev-a.img`, readOnly: false, flags: [] });
    const d = await manager.create(input());
    expect(d.state).toBe('attached');
    expect(driver.devices.has('/dev/loop9')).toBe(false);
  });

  it("a failed cleanup of a leftover row is INTERNAL without the command's stderr; the row stays", async () => {
    const { store, images, driver, manager } = setup();
    store.insert(row({ deviceId: 'dev-a', state: 'deleting', backingFile: `${DIR}/dev-a.img` }));
    images.files.set(`${DIR}/dev-a.img`, 1);
    driver.devices.set('/dev/loop9', { path: '/dev/loop9', backingFile: `${DIR}/dev-a.img`, readOnly: false, flags: [] });
    driver.failDetach = new CommandError('losetup -d /dev/loop9: exit 1: losetup: /dev/loop9: detach failed: secret', 'secret', 1);
    const err = await manager.create(input()).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(InternalError);
    expect((err as Error).message).toBe('CreateDevice "dev-a": cleaning up the interrupted deleting row failed: host command losetup failed (exit 1); details in the ublk-manager log');
    expect(store.get('dev-a')?.state).toBe('deleting');
  });
});

describe('DeviceManager get/list', () => {
  it('reports live state and orders by id', async () => {
    const { driver, images, manager } = setup();
    await manager.create(input({ deviceId: 'b' }));
    await manager.create(input({ deviceId: 'a' }));
    await manager.create(input({ deviceId: 'c' }));
    await driver.detach((await manager.get('b')).path);
    images.files.delete(`${DIR}/c.img`);
    await driver.detach((await manager.get('c')).path);
    const list = await manager.list();
    expect(list.map((d) => [d.deviceId, d.state, d.path])).toEqual([
      ['a', 'attached', '/dev/loop1'],
      ['b', 'detached', ''],
      ['c', 'missing', ''],
    ]);
  });

  it('GetDevice: NOT_FOUND for unknown, INVALID_ARGUMENT for a bad id, hides unfinished rows', async () => {
    const { store, manager } = setup();
    await expect(manager.get('nope')).rejects.toBeInstanceOf(NotFoundError);
    await expect(manager.get('Bad/Id')).rejects.toBeInstanceOf(InvalidArgumentError);
    store.insert(row({ deviceId: 'half', state: 'creating' }));
    await expect(manager.get('half')).rejects.toBeInstanceOf(NotFoundError);
    expect(await manager.list()).toEqual([]);
  });
});

describe('DeviceManager.delete', () => {
  it('detaches, removes the image and drops the row', async () => {
    const { store, images, driver, manager } = setup();
    await manager.create(input());
    expect(await manager.delete('dev-a')).toBe(true);
    expect(driver.devices.size).toBe(0);
    expect(images.files.size).toBe(0);
    expect(store.get('dev-a')).toBeUndefined();
  });

  it('succeeds with existed=false for an unknown id; INVALID_ARGUMENT for a bad id', async () => {
    const { manager } = setup();
    expect(await manager.delete('nope')).toBe(false);
    await expect(manager.delete('')).rejects.toBeInstanceOf(InvalidArgumentError);
  });

  it('refuses a busy device (FAILED_PRECONDITION) and changes nothing', async () => {
    const { store, images, driver, manager } = setup();
    const d = await manager.create(input());
    driver.busy.set(d.path, 'mounted at /mnt/x');
    const err = await manager.delete('dev-a').catch((e: unknown) => e);
    expect(err).toBeInstanceOf(FailedPreconditionError);
    expect((err as Error).message).toContain('mounted at /mnt/x');
    expect(driver.devices.has(d.path)).toBe(true);
    expect(images.files.size).toBe(1);
    expect(store.get('dev-a')?.state).toBe('ready');
  });

  it('waits a moment for an exclusive claim without a mount to go (a container that just exited), not for a mount', async () => {
    const { store, driver, manager } = setup();
    const d = await manager.create(input());
    driver.busy.set(d.path, `${EXCLUSIVE_USE} (open with O_EXCL failed: EBUSY)`);
    setTimeout(() => driver.busy.delete(d.path), 150);
    expect(await manager.delete('dev-a')).toBe(true);
    expect(store.get('dev-a')).toBeUndefined();
    // a claim that stays: FAILED_PRECONDITION after the bound, nothing changed
    const e = await manager.create(input());
    driver.busy.set(e.path, `${EXCLUSIVE_USE} (open with O_EXCL failed: EBUSY)`);
    const t0 = Date.now();
    await expect(manager.delete('dev-a')).rejects.toBeInstanceOf(FailedPreconditionError);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(EXCLUSIVE_SETTLE_MS - 100);
    expect(store.get('dev-a')?.state).toBe('ready');
  });

  it('deletes a detached device', async () => {
    const { images, driver, manager } = setup();
    const d = await manager.create(input());
    await driver.detach(d.path);
    expect(await manager.delete('dev-a')).toBe(true);
    expect(images.files.size).toBe(0);
  });
});

describe('DeviceManager device lookup (quiesce/release/resume/get)', () => {
  function setupLookup() {
    const store = new MemoryDeviceStore();
    const driver = new LookupDriver();
    const images = new FakeImages();
    const manager = new DeviceManager({ store, driver, images, log: createLogger('test', '0', 'silent'), limits: { maxDeviceSizeBytes: 1024 * MIB } });
    return { store, driver, manager };
  }

  it('reads the row’s own device directly: no scan of every device on quiesce, resume, release, get', async () => {
    const { store, driver, manager } = setupLookup();
    await manager.create(input());
    driver.scans = 0;
    expect((await manager.get('dev-a')).path).toBe('/dev/loop0');
    expect((await manager.quiesce('dev-a', 0)).device.path).toBe('/dev/loop0');
    expect((await manager.resume('dev-a')).path).toBe('/dev/loop0');
    await manager.quiesce('dev-a', 0);
    const r = await manager.release('dev-a');
    expect(r.device.path).toBe('/dev/loop0');
    expect(store.get('dev-a')).toMatchObject({ state: 'released', path: '/dev/loop0', handoverToken: r.token });
    expect(driver.scans).toBe(0);
    expect(driver.calls.filter((c) => c.startsWith('quiesce'))).toEqual(['quiesce /dev/loop0', 'quiesce /dev/loop0']);
    manager.stop();
  });

  it('falls back to a scan when the recorded device now serves another file or is gone', async () => {
    const { store, driver, manager } = setupLookup();
    await manager.create(input());
    // The image moved to another device node; loop0 now serves someone else's file.
    driver.devices.set('/dev/loop5', { path: '/dev/loop5', backingFile: `${DIR}/dev-a.img`, readOnly: false, flags: [] });
    driver.devices.set('/dev/loop0', { path: '/dev/loop0', backingFile: '/elsewhere/x.img', readOnly: false, flags: [] });
    driver.scans = 0;
    expect((await manager.quiesce('dev-a', 0)).device.path).toBe('/dev/loop5');
    expect(driver.scans).toBe(1);
    expect((await manager.release('dev-a')).device.path).toBe('/dev/loop5');
    expect(store.get('dev-a')?.path).toBe('/dev/loop5');
    // Not attached anywhere: FAILED_PRECONDITION as before.
    await manager.create(input({ deviceId: 'dev-b' }));
    driver.devices.clear();
    await expect(manager.quiesce('dev-b', 0)).rejects.toBeInstanceOf(FailedPreconditionError);
    manager.stop();
  });
});
