import { AlreadyExistsError, DeadlineExceededError, FailedPreconditionError, InvalidArgumentError, NotFoundError, ResourceExhaustedError } from '@sandnode/shared';
import { DIR, input, setup } from './__tests__/fakes';
import { MIB, type DeviceRecord } from './types';

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

  it('a copy whose caller went away (signal) is stopped and undone: DEADLINE_EXCEEDED, nothing left', async () => {
    const { store, images, manager } = setup();
    await manager.create(input());
    const ac = new AbortController();
    ac.abort();
    await expect(manager.clone(cl(), { signal: ac.signal })).rejects.toBeInstanceOf(DeadlineExceededError);
    expect(images.clones).toEqual([`${DIR}/dev-a.img -> ${DIR}/child.img`]);
    expect(store.get('child')).toBeUndefined();
    expect(images.files.has(`${DIR}/child.img`)).toBe(false);
    // The same clone without a signal still works afterwards.
    expect((await manager.clone(cl())).created).toBe(true);
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
});

describe('DeviceManager.snapshot (SnapshotDevices)', () => {
  const item = (deviceId: string, sourceDeviceId: string) => ({ deviceId, sourceDeviceId, sourceQuiesced: true, readOnly: false });

  it('clones every item and persists it ready without attaching it; a clone of the same ids attaches it, copying nothing more', async () => {
    const { store, driver, images, manager } = setup();
    await manager.create(input());
    await manager.create(input({ deviceId: 'dev-b', filesystem: 'none' }));
    let attaches = 0;
    const attach = driver.attach.bind(driver);
    driver.attach = async (f, o) => (attaches++, attach(f, o));
    const rs = await manager.snapshot([item('c-up', 'dev-a'), item('c-ws', 'dev-b')]);
    expect(attaches).toBe(0);
    expect(rs.map((r) => [r.device.deviceId, r.device.state, r.device.path, r.created])).toEqual([
      ['c-up', 'detached', '', true],
      ['c-ws', 'detached', '', true],
    ]);
    expect(store.get('c-up')).toMatchObject({ state: 'ready', clonedFrom: 'dev-a', path: '' });
    expect(images.clones).toEqual([`${DIR}/dev-a.img -> ${DIR}/c-up.img`, `${DIR}/dev-b.img -> ${DIR}/c-ws.img`]);
    // idempotent: the same snapshot again copies nothing and attaches nothing
    expect((await manager.snapshot([item('c-up', 'dev-a')]))[0]).toMatchObject({ created: false, cloneMs: 0 });
    expect(attaches).toBe(0);
    // after the source is thawed: CloneDevice without source_quiesced attaches the snapshot
    const r = await manager.clone({ ...item('c-up', 'dev-a'), sourceQuiesced: false });
    expect(r).toMatchObject({ created: false, device: { state: 'attached', clonedFrom: 'dev-a' } });
    expect(store.get('c-up')!.path).toBe(r.device.path);
    expect(attaches).toBe(1);
    expect(images.clones).toHaveLength(2);
  });

  it('all or nothing: one failed item removes the snapshots this call made (rows and images), and leaves an earlier one', async () => {
    const { store, images, manager } = setup();
    await manager.create(input());
    await manager.snapshot([item('old', 'dev-a')]);
    const before = store.list();
    await expect(manager.snapshot([item('c-up', 'dev-a'), item('old', 'dev-a'), item('c-ws', 'nope')])).rejects.toBeInstanceOf(NotFoundError);
    expect(store.list()).toEqual(before);
    expect(images.files.has(`${DIR}/c-up.img`)).toBe(false);
    expect(images.files.has(`${DIR}/old.img`)).toBe(true);
  });

  it('bad requests: INVALID_ARGUMENT (no items, more than 8, a device_id twice, a bad id); a rw source without source_quiesced: FAILED_PRECONDITION; nothing changed', async () => {
    const { store, images, manager } = setup();
    await manager.create(input());
    const before = store.list();
    await expect(manager.snapshot([])).rejects.toBeInstanceOf(InvalidArgumentError);
    await expect(manager.snapshot(Array.from({ length: 9 }, (_, i) => item(`c${i}`, 'dev-a')))).rejects.toThrow(/1 to 8/);
    await expect(manager.snapshot([item('c1', 'dev-a'), item('c1', 'dev-a')])).rejects.toThrow(/appears twice/);
    await expect(manager.snapshot([item('c1', 'dev-a'), item('Bad_Id', 'dev-a')])).rejects.toThrow(/items.device_id/);
    await expect(manager.snapshot([item('c1', '../x')])).rejects.toThrow(/items.source_device_id/);
    await expect(manager.snapshot([{ ...item('c1', 'dev-a'), sourceQuiesced: false }])).rejects.toBeInstanceOf(FailedPreconditionError);
    expect(store.list()).toEqual(before);
    expect(images.clones).toEqual([]);
  });

  it('a caller that went away (signal): DEADLINE_EXCEEDED, nothing left', async () => {
    const { store, manager } = setup();
    await manager.create(input());
    const ac = new AbortController();
    ac.abort();
    await expect(manager.snapshot([item('c-up', 'dev-a')], { signal: ac.signal })).rejects.toBeInstanceOf(DeadlineExceededError);
    expect(store.get('c-up')).toBeUndefined();
  });
});
