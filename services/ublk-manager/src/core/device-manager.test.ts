import path from 'node:path';
import {
  AlreadyExistsError,
  createLogger,
  FailedPreconditionError,
  InternalError,
  InvalidArgumentError,
  NotFoundError,
  ResourceExhaustedError,
} from '@sandnode/shared';
import { DeviceManager } from './device-manager';
import type { AttachOptions, BlockDriver, CloneResult, ImageOps, SourceImageInfo } from './driver';
import { MemoryDeviceStore } from './memory-store';
import { MIB, type AttachedDevice, type DeviceRecord, type DriverCapability } from './types';
import type { CreateDeviceInput } from './validate';

const DIR = '/images';

/** A BlockDriver in memory; records calls; failures injectable. */
class FakeDriver implements BlockDriver {
  readonly name = 'loop' as const;
  devices = new Map<string, AttachedDevice>();
  busy = new Map<string, string>();
  failAttach: Error | undefined;
  calls: string[] = [];
  private next = 0;
  capabilities(): DriverCapability[] {
    return [];
  }
  async checkAvailable(): Promise<void> {}
  async attach(backingFile: string, opts: AttachOptions): Promise<AttachedDevice> {
    this.calls.push(`attach ${backingFile}`);
    if (this.failAttach) throw this.failAttach;
    const d = { path: `/dev/loop${this.next++}`, backingFile, readOnly: opts.readOnly, flags: ['direct-io'] };
    this.devices.set(d.path, d);
    return { ...d };
  }
  async detach(p: string): Promise<void> {
    this.calls.push(`detach ${p}`);
    this.devices.delete(p);
  }
  async listAttached(dir: string): Promise<AttachedDevice[]> {
    return [...this.devices.values()].filter((d) => path.dirname(d.backingFile) === dir).map((d) => ({ ...d }));
  }
  async busyReason(p: string): Promise<string | undefined> {
    return this.busy.get(p);
  }
  async quiesce(d: AttachedDevice): Promise<void> {
    this.calls.push(`quiesce ${d.path}`);
  }
  async resume(d: AttachedDevice): Promise<void> {
    this.calls.push(`resume ${d.path}`);
  }
  async release(d: AttachedDevice): Promise<void> {
    this.calls.push(`release ${d.path}`);
  }
  async recover(d: AttachedDevice): Promise<AttachedDevice> {
    this.calls.push(`recover ${d.path}`);
    const live = [...this.devices.values()].find((x) => x.backingFile === d.backingFile);
    if (!live) throw new FailedPreconditionError(`${d.backingFile} is not attached`);
    return { ...live };
  }
}

/** ImageOps in memory: file -> size. */
class FakeImages implements ImageOps {
  readonly dir = DIR;
  files = new Map<string, number>();
  failFormat: Error | undefined;
  onCreate: (() => void) | undefined;
  imagePath(id: string): string {
    return `${DIR}/${id}.img`;
  }
  async exists(f: string): Promise<boolean> {
    return this.files.has(f);
  }
  async inspectSource(f: string): Promise<SourceImageInfo> {
    const size = this.files.get(f);
    if (size === undefined) throw new NotFoundError(`source_image: ${f} does not exist`);
    return { sizeBytes: size };
  }
  async createEmpty(f: string, size: number): Promise<void> {
    this.onCreate?.();
    if (this.files.has(f)) throw new Error('EEXIST');
    this.files.set(f, size);
  }
  async formatExt4(): Promise<void> {
    if (this.failFormat) throw this.failFormat;
  }
  /** Files the clone of a test left as temps: file -> target. */
  temps = new Map<string, string>();
  failClone: Error | undefined;
  clones: string[] = [];
  async clone(src: string, dst: string): Promise<CloneResult> {
    this.clones.push(`${src} -> ${dst}`);
    if (this.failClone) throw this.failClone;
    if (this.files.has(dst)) throw new Error('EEXIST');
    this.files.set(dst, this.files.get(src) ?? 0);
    return { reflinked: false, copyMs: 3, syncMs: 1, sourceAllocatedBytes: 4096 };
  }
  async cloneTemps(): Promise<{ file: string; target: string }[]> {
    return [...this.temps].map(([file, target]) => ({ file, target }));
  }
  async remove(f: string): Promise<boolean> {
    return this.temps.delete(f) || this.files.delete(f);
  }
}

function setup(maxDeviceSizeBytes = 1024 * MIB) {
  const store = new MemoryDeviceStore();
  const driver = new FakeDriver();
  const images = new FakeImages();
  const log = createLogger('test', '0', 'silent');
  let t = 1000;
  const manager = new DeviceManager({ store, driver, images, log, limits: { maxDeviceSizeBytes }, now: () => t++ });
  return { store, driver, images, manager };
}

const input = (over: Partial<CreateDeviceInput> = {}): CreateDeviceInput => ({
  deviceId: 'dev-a',
  sizeBytes: 64 * MIB,
  sourceImage: '',
  filesystem: 'ext4',
  readOnly: false,
  ...over,
});

const row = (over: Partial<DeviceRecord>): DeviceRecord => ({
  deviceId: 'x',
  state: 'ready',
  sizeBytes: 8 * MIB,
  sourceImage: '',
  filesystem: 'ext4',
  readOnly: false,
  backingFile: `${DIR}/x.img`,
  path: '',
  createdAtMs: 1,
  updatedAtMs: 1,
  handoverToken: '',
  clonedFrom: '',
  ...over,
});

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

  it('undoes everything when mkfs fails and says which step failed', async () => {
    const { store, images, driver, manager } = setup();
    images.failFormat = new Error('mkfs.ext4 exploded');
    const err = await manager.create(input()).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(InternalError);
    expect((err as Error).message).toMatch(/CreateDevice "dev-a": format ext4 failed: mkfs.ext4 exploded/);
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

  it('deletes a detached device', async () => {
    const { images, driver, manager } = setup();
    const d = await manager.create(input());
    await driver.detach(d.path);
    expect(await manager.delete('dev-a')).toBe(true);
    expect(images.files.size).toBe(0);
  });
});

describe('DeviceManager.adopt', () => {
  it('keeps attached, re-attaches detached, cleans unfinished rows, keeps missing, never touches unowned devices', async () => {
    const { store, images, driver, manager } = setup();
    const f = (id: string) => `${DIR}/${id}.img`;
    store.insert(row({ deviceId: 'kept', backingFile: f('kept'), path: '/dev/loop5' }));
    images.files.set(f('kept'), 1);
    driver.devices.set('/dev/loop7', { path: '/dev/loop7', backingFile: f('kept'), readOnly: false, flags: [] });
    store.insert(row({ deviceId: 'detached', backingFile: f('detached'), path: '/dev/loop6' }));
    images.files.set(f('detached'), 1);
    store.insert(row({ deviceId: 'half', state: 'creating', backingFile: f('half') }));
    images.files.set(f('half'), 1);
    driver.devices.set('/dev/loop8', { path: '/dev/loop8', backingFile: f('half'), readOnly: false, flags: [] });
    store.insert(row({ deviceId: 'going', state: 'deleting', backingFile: f('going') }));
    images.files.set(f('going'), 1);
    store.insert(row({ deviceId: 'lost', backingFile: f('lost') }));
    driver.devices.set('/dev/loop20', { path: '/dev/loop20', backingFile: '/elsewhere/x.img', readOnly: false, flags: [] });
    driver.devices.set('/dev/loop21', { path: '/dev/loop21', backingFile: f('stranger'), readOnly: false, flags: [] });

    const report = await manager.adopt();
    expect(report).toEqual({ kept: ['kept'], reattached: ['detached'], cleanedUp: ['going', 'half'], missing: ['lost'], failed: [], removedTemps: [] });
    expect(store.get('kept')?.path).toBe('/dev/loop7');
    expect(store.get('detached')?.path).toBe('/dev/loop0');
    expect(store.get('half')).toBeUndefined();
    expect(store.get('going')).toBeUndefined();
    expect(images.files.has(f('half'))).toBe(false);
    expect(images.files.has(f('going'))).toBe(false);
    expect(driver.devices.has('/dev/loop8')).toBe(false);
    expect(driver.devices.has('/dev/loop20')).toBe(true);
    expect(driver.devices.has('/dev/loop21')).toBe(true);
    expect((await manager.get('lost')).state).toBe('missing');
  });

  it('reports a device it cannot re-attach as failed and goes on', async () => {
    const { store, images, driver, manager } = setup();
    store.insert(row({ deviceId: 'a', backingFile: `${DIR}/a.img` }));
    images.files.set(`${DIR}/a.img`, 1);
    driver.failAttach = new Error('losetup broke');
    expect((await manager.adopt()).failed).toEqual(['a']);
  });
});

/** A FakeDriver that can look one device up directly, counting full scans. */
class LookupDriver extends FakeDriver {
  scans = 0;
  override async listAttached(dir: string): Promise<AttachedDevice[]> {
    this.scans++;
    return super.listAttached(dir);
  }
  async lookup(p: string): Promise<AttachedDevice | undefined> {
    const d = this.devices.get(p);
    return d ? { ...d } : undefined;
  }
}

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

describe('DeviceManager.clone', () => {
  const cl = (over: Partial<{ deviceId: string; sourceDeviceId: string; sourceQuiesced: boolean; readOnly: boolean }> = {}) => ({
    deviceId: 'child',
    sourceDeviceId: 'dev-a',
    sourceQuiesced: true,
    readOnly: false,
    ...over,
  });

  it('copies the source image, persists the row ready with cloned_from before attaching, attaches like a new device', async () => {
    const { store, driver, images, manager } = setup();
    await manager.create(input({ filesystem: 'none' }));
    let rowAtAttach: DeviceRecord | undefined;
    const attach = driver.attach.bind(driver);
    driver.attach = async (f, o) => {
      rowAtAttach = store.get('child');
      return attach(f, o);
    };
    const r = await manager.clone(cl());
    expect(images.clones).toEqual([`${DIR}/dev-a.img -> ${DIR}/child.img`]);
    expect(rowAtAttach).toMatchObject({ state: 'ready', clonedFrom: 'dev-a', path: '' });
    expect(r).toMatchObject({ created: true, cloneMs: 3, reflinked: false, copiedBytes: 4096 });
    expect(r.device).toMatchObject({ deviceId: 'child', state: 'attached', sizeBytes: 64 * MIB, filesystem: 'none', clonedFrom: 'dev-a', sourceImage: '', readOnly: false });
    expect(store.get('child')).toMatchObject({ state: 'ready', clonedFrom: 'dev-a', path: r.device.path, sizeBytes: 64 * MIB });
    expect(store.get('dev-a')).toMatchObject({ state: 'ready', clonedFrom: '' });
  });

  it('is idempotent: a retry returns the existing clone with clone_ms 0 and copies nothing', async () => {
    const { images, manager } = setup();
    await manager.create(input());
    const a = await manager.clone(cl());
    const b = await manager.clone(cl());
    expect(b).toMatchObject({ created: false, cloneMs: 0, copiedBytes: 0 });
    expect(b.device.path).toBe(a.device.path);
    expect(images.clones).toHaveLength(1);
  });

  it('validates ids first (INVALID_ARGUMENT), same id twice too; nothing changed', async () => {
    const { store, images, manager } = setup();
    await manager.create(input());
    const before = store.list();
    await expect(manager.clone(cl({ deviceId: 'Bad_Id' }))).rejects.toThrow(/device_id/);
    await expect(manager.clone(cl({ sourceDeviceId: '' }))).rejects.toThrow(/source_device_id/);
    await expect(manager.clone(cl({ deviceId: 'dev-a' }))).rejects.toBeInstanceOf(InvalidArgumentError);
    expect(store.list()).toEqual(before);
    expect(images.clones).toEqual([]);
  });

  it('unknown source: NOT_FOUND; rw source without source_quiesced: FAILED_PRECONDITION; other device: ALREADY_EXISTS; nothing changed', async () => {
    const { store, images, manager } = setup();
    await manager.create(input());
    await manager.create(input({ deviceId: 'other', filesystem: 'none' }));
    const before = store.list();
    await expect(manager.clone(cl({ sourceDeviceId: 'nope' }))).rejects.toBeInstanceOf(NotFoundError);
    await expect(manager.clone(cl({ sourceQuiesced: false }))).rejects.toBeInstanceOf(FailedPreconditionError);
    await expect(manager.clone(cl({ deviceId: 'other' }))).rejects.toBeInstanceOf(AlreadyExistsError);
    await manager.clone(cl());
    await expect(manager.clone(cl({ sourceDeviceId: 'other' }))).rejects.toThrow(/a clone of "dev-a"/);
    await expect(manager.clone(cl({ readOnly: true }))).rejects.toBeInstanceOf(AlreadyExistsError);
    // CreateDevice never mistakes a clone for an empty device of the same size.
    await expect(manager.create(input({ deviceId: 'child' }))).rejects.toBeInstanceOf(AlreadyExistsError);
    expect(store.list().filter((r) => r.deviceId !== 'child')).toEqual(before);
    expect(images.clones).toHaveLength(1);
  });

  it('clones a detached or read-only source without source_quiesced', async () => {
    const { driver, manager } = setup();
    await manager.create(input({ deviceId: 'ro', readOnly: true }));
    await manager.create(input({ deviceId: 'det' }));
    await driver.detach((await manager.get('det')).path);
    await expect(manager.clone(cl({ deviceId: 'c1', sourceDeviceId: 'ro', sourceQuiesced: false }))).resolves.toMatchObject({ created: true });
    await expect(manager.clone(cl({ deviceId: 'c2', sourceDeviceId: 'det', sourceQuiesced: false }))).resolves.toMatchObject({ created: true });
  });

  it('undoes a failed copy (row dropped, no image) and keeps the error meaning', async () => {
    const { store, images, manager } = setup();
    await manager.create(input());
    images.failClone = new ResourceExhaustedError('no disk space left');
    await expect(manager.clone(cl())).rejects.toBeInstanceOf(ResourceExhaustedError);
    expect(store.get('child')).toBeUndefined();
    expect(images.files.has(`${DIR}/child.img`)).toBe(false);
  });

  it('undoes a failed attach after the row was ready', async () => {
    const { store, driver, images, manager } = setup();
    await manager.create(input());
    driver.failAttach = new ResourceExhaustedError('no free loop device');
    await expect(manager.clone(cl())).rejects.toThrow(/CloneDevice "child" from "dev-a": attach failed/);
    expect(store.get('child')).toBeUndefined();
    expect(images.files.has(`${DIR}/child.img`)).toBe(false);
  });

  it('while the slot is retiring: UNAVAILABLE, nothing changed', async () => {
    const { store, manager } = setup();
    await manager.create(input());
    manager.beginRetiring('b');
    const err = await manager.clone(cl()).catch((e: unknown) => e);
    expect((err as Error).constructor.name).toBe('UnavailableError');
    expect(store.get('child')).toBeUndefined();
  });

  it('adoption removes the temp file of a crashed clone and finishes its creating row', async () => {
    const { store, images, manager } = setup();
    await manager.create(input());
    store.insert(row({ deviceId: 'half', state: 'creating', backingFile: `${DIR}/half.img`, clonedFrom: 'dev-a' }));
    images.temps.set(`${DIR}/.half.img.clone-1.tmp`, `${DIR}/half.img`);
    images.temps.set(`${DIR}/.gone.img.clone-2.tmp`, `${DIR}/gone.img`);
    const report = await manager.adopt();
    expect(report.cleanedUp).toEqual(['half']);
    expect(report.removedTemps).toEqual([`${DIR}/.gone.img.clone-2.tmp`]);
    expect(images.temps.size).toBe(0);
    expect(store.get('half')).toBeUndefined();
  });
});
