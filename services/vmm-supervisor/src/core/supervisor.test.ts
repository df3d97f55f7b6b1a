import { mkdtempSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { AlreadyExistsError, createLogger, FailedPreconditionError, InternalError, NotFoundError } from '@sandnode/shared';
import type { LiveStatus, VmDriver } from './driver';
import { Supervisor } from './supervisor';
import type { EffectiveResources, VmProcess, VmRecord, VmSpec } from './types';
import { MemoryVmStore } from './vm-store';

type HostState = 'running' | 'paused' | 'stopped';

/** FakeDriver keeps "host" VMs in memory and records every call. */
class FakeDriver implements VmDriver {
  readonly name = 'fake';
  readonly features = ['vmm.fake'];
  readonly host = new Map<string, { state: HostState; proc: VmProcess }>();
  readonly calls: string[] = [];
  failCreate = false;
  private nextPid = 1000;

  async version() {
    return '9.9.9';
  }
  async create(vmId: string, _spec: VmSpec, res: EffectiveResources) {
    this.calls.push(`create ${vmId} ${res.vcpus}/${res.memoryMib}`);
    if (this.failCreate) throw new InternalError('create vm: runc run failed');
    const proc = { pid: this.nextPid++, startTimeTicks: 42 };
    this.host.set(vmId, { state: 'running', proc });
    return proc;
  }
  async inspect(vmId: string, expected: VmProcess): Promise<LiveStatus> {
    const h = this.host.get(vmId);
    if (!h || h.state === 'stopped') return { state: 'stopped', detail: 'gone' };
    if (h.proc.pid !== expected.pid || h.proc.startTimeTicks !== expected.startTimeTicks) return { state: 'stopped', detail: 'pid reused' };
    return { state: h.state, process: h.proc };
  }
  async pause(vmId: string) {
    this.calls.push(`pause ${vmId}`);
    this.host.get(vmId)!.state = 'paused';
  }
  async resume(vmId: string) {
    this.calls.push(`resume ${vmId}`);
    this.host.get(vmId)!.state = 'running';
  }
  async stop(vmId: string, timeoutMs: number) {
    this.calls.push(`stop ${vmId} ${timeoutMs}`);
    const h = this.host.get(vmId);
    if (h) h.state = 'stopped';
  }
  async destroy(vmId: string) {
    this.calls.push(`destroy ${vmId}`);
    this.host.delete(vmId);
  }
}

const log = createLogger('vmm-supervisor-test', '0.0.0', 'silent');
const template = mkdtempSync(path.join(os.tmpdir(), 'vmm-sup-'));
const spec: VmSpec = {
  templateRootfs: template,
  drives: [{ driveId: 'upper', path: '/dev/null', role: 'rootfs-upper', readOnly: false }],
  resources: { vcpus: 0, memoryMib: 0, diskBytes: 0 },
  poddSocketDir: path.join(template, 'podd'),
  hostname: '',
  env: {},
};

function setup() {
  const store = new MemoryVmStore();
  const driver = new FakeDriver();
  const sup = new Supervisor({ store, driver, log, defaults: { vcpus: 1, memoryMib: 512, stopTimeoutMs: 2000 } });
  return { store, driver, sup };
}

describe('Supervisor', () => {
  test('create persists running with the process and driver version; defaults applied', async () => {
    const { store, driver, sup } = setup();
    await sup.adopt();
    const vm = await sup.create('vm-1', spec);
    expect(vm).toMatchObject({ vmId: 'vm-1', state: 'running', pid: 1000, startTimeTicks: 42, driver: 'fake', driverVersion: '9.9.9' });
    expect(store.get('vm-1')?.state).toBe('running');
    expect(driver.calls).toEqual(['create vm-1 1/512']);
  });

  test('create is idempotent on the same spec and ALREADY_EXISTS on another', async () => {
    const { driver, sup } = setup();
    await sup.create('vm-1', spec);
    expect((await sup.create('vm-1', { ...spec })).pid).toBe(1000);
    await expect(sup.create('vm-1', { ...spec, hostname: 'x' })).rejects.toBeInstanceOf(AlreadyExistsError);
    expect(driver.calls).toEqual(['create vm-1 1/512']);
  });

  test('a failed create drops the row and rethrows', async () => {
    const { store, driver, sup } = setup();
    driver.failCreate = true;
    await expect(sup.create('vm-1', spec)).rejects.toThrow(/runc run failed/);
    expect(store.get('vm-1')).toBeUndefined();
  });

  test('the creating row is persisted before the driver runs', async () => {
    const { store, driver, sup } = setup();
    let seen: VmRecord | undefined;
    const orig = driver.create.bind(driver);
    driver.create = async (id, s, r) => {
      seen = store.get(id);
      return orig(id, s, r);
    };
    await sup.create('vm-1', spec);
    expect(seen?.state).toBe('creating');
  });

  test('pause/resume transitions; wrong state is FAILED_PRECONDITION; unknown is NOT_FOUND', async () => {
    const { store, sup } = setup();
    await sup.create('vm-1', spec);
    expect((await sup.pause('vm-1')).state).toBe('paused');
    expect(store.get('vm-1')?.state).toBe('paused');
    await expect(sup.pause('vm-1')).rejects.toBeInstanceOf(FailedPreconditionError);
    expect((await sup.resume('vm-1')).state).toBe('running');
    await expect(sup.resume('vm-1')).rejects.toBeInstanceOf(FailedPreconditionError);
    await expect(sup.pause('vm-2')).rejects.toBeInstanceOf(NotFoundError);
    await expect(sup.get('vm-2')).rejects.toBeInstanceOf(NotFoundError);
  });

  test('stop uses the default timeout for 0, is idempotent; delete is idempotent', async () => {
    const { store, driver, sup } = setup();
    await sup.create('vm-1', spec);
    await sup.pause('vm-1');
    expect((await sup.stop('vm-1', 0)).state).toBe('stopped');
    expect((await sup.stop('vm-1', 10)).state).toBe('stopped');
    expect(driver.calls.filter((c) => c.startsWith('stop'))).toEqual(['stop vm-1 2000']);
    expect(await sup.delete('vm-1')).toBe(true);
    expect(store.get('vm-1')).toBeUndefined();
    expect(await sup.delete('vm-1')).toBe(false);
  });

  test('a VM whose process vanished or was replaced is reported and persisted stopped', async () => {
    const { store, driver, sup } = setup();
    await sup.create('vm-1', spec);
    driver.host.get('vm-1')!.proc = { pid: 1000, startTimeTicks: 99 }; // pid reused
    const vm = await sup.get('vm-1');
    expect(vm).toMatchObject({ state: 'stopped', pid: 0 });
    expect(store.get('vm-1')?.state).toBe('stopped');
  });

  test('adopt: live VMs keep their state with no driver action; creating rows undone; gone VMs stopped', async () => {
    const { store, driver, sup } = setup();
    await sup.create('vm-run', spec);
    await sup.create('vm-paused', spec);
    await sup.pause('vm-paused');
    await sup.create('vm-gone', spec);
    driver.host.delete('vm-gone');
    store.put({ ...store.get('vm-run')!, vmId: 'vm-half', state: 'creating', pid: 0, startTimeTicks: 0 });
    driver.calls.length = 0;

    const restarted = new Supervisor({ store, driver, log, defaults: { vcpus: 1, memoryMib: 512, stopTimeoutMs: 2000 } });
    const report = await restarted.adopt();
    expect(report).toEqual({ adopted: ['vm-paused', 'vm-run'], stopped: ['vm-gone'], undone: ['vm-half'], failed: [] });
    expect(driver.calls).toEqual(['destroy vm-half']); // never create, pause, resume or stop
    expect(store.list().map((r) => [r.vmId, r.state])).toEqual([
      ['vm-gone', 'stopped'],
      ['vm-paused', 'paused'],
      ['vm-run', 'running'],
    ]);
  });

  test('operations on one VM are serialised', async () => {
    const { sup } = setup();
    const results = await Promise.allSettled([sup.create('vm-1', spec), sup.create('vm-1', spec), sup.pause('vm-1'), sup.pause('vm-1')]);
    expect(results.map((r) => r.status)).toEqual(['fulfilled', 'fulfilled', 'fulfilled', 'rejected']);
  });

  test('features add adoption to the driver features', () => {
    expect(setup().sup.features()).toEqual(['vmm.fake', 'vmm.adoption.v1']);
  });
});
