import { existsSync, mkdirSync, writeFileSync, rmSync } from 'node:fs';
import path from 'node:path';
import { AlreadyExistsError, createLogger, FailedPreconditionError, InternalError, NotFoundError } from '@sandnode/shared';
import type { LiveStatus, VmDriver, VmRef } from './driver';
import { Supervisor } from './supervisor';
import type { EffectiveResources, VmProcess, VmRecord, VmSpec } from './types';
import { MemoryVmStore } from './vm-store';
import { DriverBinaries } from '../store/driver-binaries';
import { makeTempDir, useTempDir } from '@sandnode/testkit';

type HostState = 'running' | 'paused' | 'stopped';

/** FakeDriver keeps "host" VMs in memory and records every call. */
class FakeDriver implements VmDriver {
  readonly name = 'fake';
  readonly features = ['vmm.fake'];
  readonly host = new Map<string, { state: HostState; proc: VmProcess }>();
  readonly calls: string[] = [];
  /** Binary each call used, by call. */
  readonly binaries: string[] = [];
  failCreate = false;
  versionString = '9.9.9';
  configured = '/usr/bin/fake';
  private current: string | undefined;
  private nextPid = 1000;

  async version() {
    return this.versionString;
  }
  configuredBinary() {
    return this.configured;
  }
  useBinary(p: string) {
    this.current = p;
  }
  currentBinary() {
    return this.current ?? this.configured;
  }
  async create(vmId: string, _spec: VmSpec, res: EffectiveResources) {
    this.calls.push(`create ${vmId} ${res.vcpus}/${res.memoryMib}`);
    this.binaries.push(`create ${this.currentBinary()}`);
    if (this.failCreate) throw new InternalError('create vm: runc run failed');
    const proc = { pid: this.nextPid++, startTimeTicks: 42 };
    this.host.set(vmId, { state: 'running', proc });
    return { process: proc, apiSocket: '', isolation: ['vmm.pids-limit.v1'] };
  }
  async inspect(ref: VmRef): Promise<LiveStatus> {
    const { vmId, process: expected } = ref;
    const h = this.host.get(vmId);
    if (!h || h.state === 'stopped') return { state: 'stopped', detail: 'gone' };
    if (h.proc.pid !== expected.pid || h.proc.startTimeTicks !== expected.startTimeTicks) return { state: 'stopped', detail: 'pid reused' };
    return { state: h.state, process: h.proc };
  }
  async pause({ vmId, binary }: VmRef) {
    this.calls.push(`pause ${vmId}`);
    this.binaries.push(`pause ${binary}`);
    this.host.get(vmId)!.state = 'paused';
  }
  async resume({ vmId }: VmRef) {
    this.calls.push(`resume ${vmId}`);
    this.host.get(vmId)!.state = 'running';
  }
  async stop({ vmId }: VmRef, timeoutMs: number, _signal?: AbortSignal) {
    this.calls.push(`stop ${vmId} ${timeoutMs}`);
    const h = this.host.get(vmId);
    if (h) h.state = 'stopped';
  }
  async destroy({ vmId }: VmRef) {
    this.calls.push(`destroy ${vmId}`);
    this.host.delete(vmId);
  }
}

const log = createLogger('vmm-supervisor-test', '0.0.0', 'silent');
const template = makeTempDir('vmm-sup');
afterAll(() => rmSync(template, { recursive: true, force: true }));
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
    expect(vm).toMatchObject({ vmId: 'vm-1', state: 'running', pid: 1000, startTimeTicks: 42, driver: 'fake', driverVersion: '9.9.9', isolation: ['vmm.pids-limit.v1'] });
    expect(store.get('vm-1')?.state).toBe('running');
    expect(store.get('vm-1')?.isolation).toEqual(['vmm.pids-limit.v1']);
    expect(driver.calls).toEqual(['create vm-1 1/512']);
  });

  test('create is idempotent on the same spec and ALREADY_EXISTS on another', async () => {
    const { driver, sup } = setup();
    await sup.create('vm-1', spec);
    expect((await sup.create('vm-1', { ...spec })).pid).toBe(1000);
    await expect(sup.create('vm-1', { ...spec, hostname: 'x' })).rejects.toBeInstanceOf(AlreadyExistsError);
    expect(driver.calls).toEqual(['create vm-1 1/512']);
  });

  test('a failed create drops the row and throws a short INTERNAL without the host detail', async () => {
    const { store, driver, sup } = setup();
    driver.failCreate = true;
    const err = await sup.create('vm-1', spec).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(InternalError);
    expect((err as Error).message).toBe('create vm vm-1 failed on the host (see the vmm-supervisor log)');
    expect(store.get('vm-1')).toBeUndefined();
  });

  test('stop hands the caller signal to the driver; an abort stays an abort (CANCELLED), the VM is not recorded stopped', async () => {
    const { store, driver, sup } = setup();
    await sup.create('vm-1', spec);
    const ac = new AbortController();
    let seen: AbortSignal | undefined;
    driver.stop = async (_ref, _ms, signal) => {
      seen = signal;
      ac.abort();
      signal?.throwIfAborted();
    };
    await expect(sup.stop('vm-1', 0, ac.signal)).rejects.toMatchObject({ name: 'AbortError' });
    expect(seen).toBe(ac.signal);
    expect(store.get('vm-1')?.state).toBe('running');
  });

  test('a domain error of the driver keeps its code (NOT_FOUND stays NOT_FOUND)', async () => {
    const { driver, sup } = setup();
    await sup.create('vm-1', spec);
    driver.pause = async () => {
      throw new NotFoundError('vm-1: no such container');
    };
    await expect(sup.pause('vm-1')).rejects.toThrow(new NotFoundError('vm-1: no such container'));
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
    expect(report).toEqual({ adopted: ['vm-paused', 'vm-run'], stopped: ['vm-gone'], undone: ['vm-half'], failed: [], prunedBinaries: [] });
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

  test('features add adoption, the epoch fence, the freeze status and FenceEpoch to the driver features', () => {
    expect(setup().sup.features()).toEqual(['vmm.fake', 'vmm.adoption.v1', 'vmm.epoch-fence.v1', 'vmm.freeze-status.v1', 'vmm.fence-epoch.v1', 'vmm.quarantine-report.v1', 'vmm.vm-isolation.v1']);
  });
});

describe('Supervisor driver binaries', () => {
  const tmp = useTempDir('vmm-sup-bin');
  test('a VM keeps the versioned binary it started with across an upgrade; unused dirs are pruned at start and after delete', async () => {
    const dir = tmp();
    const host = path.join(dir, 'host');
    mkdirSync(host);
    writeFileSync(path.join(host, 'fake'), '#!/bin/sh\necho v1\n', { mode: 0o755 });
    const binaries = new DriverBinaries(path.join(dir, 'bin'));
    mkdirSync(path.join(binaries.dir, 'fake-0.0.1'), { recursive: true }); // a stale dir nobody uses
    const store = new MemoryVmStore();
    const driver = new FakeDriver();
    driver.configured = path.join(host, 'fake');
    driver.versionString = '1.0.0';
    const defaults = { vcpus: 1, memoryMib: 512, stopTimeoutMs: 2000 };
    const sup1 = new Supervisor({ store, driver, log, defaults, binaries });
    expect((await sup1.adopt()).prunedBinaries).toEqual(['fake-0.0.1']);
    const v1 = path.join(binaries.dir, 'fake-1.0.0', 'fake');
    expect(existsSync(v1)).toBe(true);
    await sup1.create('vm-old', spec);
    expect(store.get('vm-old')?.driverBinary).toBe(v1);

    // The host package is upgraded; the supervisor restarts.
    writeFileSync(path.join(host, 'fake'), '#!/bin/sh\necho v2\n', { mode: 0o755 });
    driver.versionString = '2.0.0';
    const sup2 = new Supervisor({ store, driver, log, defaults, binaries });
    expect((await sup2.adopt()).prunedBinaries).toEqual([]);
    const v2 = path.join(binaries.dir, 'fake-2.0.0', 'fake');
    expect(binaries.list()).toEqual(['fake-1.0.0', 'fake-2.0.0']);
    await sup2.pause('vm-old');
    await sup2.create('vm-new', spec);
    expect(driver.binaries.slice(-2)).toEqual([`pause ${v1}`, `create ${v2}`]);
    expect(store.get('vm-new')?.driverBinary).toBe(v2);

    // a delete of a VM on the current binary cannot free a dir: no prune (no read of the table)
    const list = jest.spyOn(store, 'list');
    await sup2.delete('vm-new');
    expect(list).not.toHaveBeenCalled();
    expect(binaries.list()).toEqual(['fake-1.0.0', 'fake-2.0.0']); // v2 is current
    await sup2.delete('vm-old');
    expect(list).toHaveBeenCalled();
    expect(binaries.list()).toEqual(['fake-2.0.0']);
  });
});
