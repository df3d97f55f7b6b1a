import { Adoption, RELEASE_SWEEP_DELAY_MS, RELEASE_SWEEP_MAX_DELAY_MS } from './adoption';
import { DIR, row, setup, input } from './__tests__/fakes';

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

describe('DeviceManager.adopt after a crashed clone', () => {
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

describe('the release sweep', () => {
  afterEach(() => {
    jest.useRealTimers();
    jest.restoreAllMocks();
  });

  it('waits until releases stop coming (it does not run between two moves of a handover), at most RELEASE_SWEEP_MAX_DELAY_MS', async () => {
    jest.useFakeTimers();
    const { manager } = setup();
    for (const id of ['a', 'b', 'c']) await manager.create(input({ deviceId: id }));
    const converge = jest.spyOn(Adoption.prototype, 'converge');
    const move = async (id: string) => {
      await manager.quiesce(id, 0);
      await manager.release(id);
    };
    await move('a');
    jest.advanceTimersByTime(RELEASE_SWEEP_DELAY_MS * 0.6);
    await move('b');
    jest.advanceTimersByTime(RELEASE_SWEEP_DELAY_MS * 0.6);
    expect(converge).not.toHaveBeenCalled();
    jest.advanceTimersByTime(RELEASE_SWEEP_DELAY_MS * 0.5);
    expect(converge).toHaveBeenCalledTimes(1);
    await converge.mock.results[0]?.value;

    // releases that never stop still get a sweep within RELEASE_SWEEP_MAX_DELAY_MS
    converge.mockClear();
    const adoption = (manager as unknown as { adoption: Adoption }).adoption;
    for (let t = 0; t < RELEASE_SWEEP_MAX_DELAY_MS; t += RELEASE_SWEEP_DELAY_MS / 2) {
      adoption.scheduleSweep();
      jest.advanceTimersByTime(RELEASE_SWEEP_DELAY_MS / 2);
    }
    expect(converge).toHaveBeenCalledTimes(1);
  });
});
