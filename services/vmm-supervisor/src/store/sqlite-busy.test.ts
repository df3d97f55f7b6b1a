/**
 * The VM table locked by another process (a real sqlite3 CLI, issue 11 SQLITE_BUSY): reads go
 * on, a write is StoreBusyError (UNAVAILABLE) after a few ms instead of a 5 s event-loop stall, a
 * gated writing call answers UNAVAILABLE without running, and everything works once the lock is gone.
 */
import path from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { DEADLINE_METADATA_KEY, gateWritesWhileBusy, StoreBusyError, waitWhileBusy } from '@sandnode/shared';
import { holdSqliteLock, useTempDir, type HeldSqliteLock } from '@sandnode/testkit';
import type { VmRecord } from '../core/types';
import { VM_WRITES } from '../main';
import { SqliteVmStore, VM_TABLE_FILE } from './sqlite-vm-store';

const rec = (vmId: string): VmRecord => ({
  schema: 1,
  vmId,
  state: 'running',
  pid: 10,
  startTimeTicks: 20,
  driver: 'runc',
  driverVersion: '1.1.5',
  spec: { templateRootfs: '/t', drives: [], resources: { vcpus: 0, memoryMib: 0, diskBytes: 0 }, poddSocketDir: '/p', hostname: '', env: {} },
  createdAtMs: 1,
  apiSocket: '',
  driverBinary: '',
});

const ctx = (deadlineMs: number) => ({ signal: new AbortController().signal, metadata: { get: (k: string) => (k === DEADLINE_METADATA_KEY ? String(deadlineMs) : undefined) } });

describe('VM table held by another process', () => {
  const tmp = useTempDir('vmm-busy');
  let holder: HeldSqliteLock | undefined;
  afterEach(async () => holder?.release());

  test('reads go on, writes are StoreBusyError, a gated write does not run, and all succeed after the lock goes', async () => {
    const dir = tmp();
    const store = SqliteVmStore.forStateDir(dir);
    store.put(rec('vm-a'));
    holder = await holdSqliteLock(path.join(dir, VM_TABLE_FILE));
    const loop = monitorEventLoopDelay({ resolution: 1 });
    loop.enable();
    expect(store.get('vm-a')?.state).toBe('running');
    expect(() => store.put(rec('vm-b'))).toThrow(StoreBusyError);
    expect(() => store.delete('vm-a')).toThrow(StoreBusyError);
    let ran = 0;
    const impl = gateWritesWhileBusy(
      {
        createVm: async (_req: unknown, _ctx: unknown) => ++ran,
        pauseVm: async (_req: unknown, _ctx: unknown) => ++ran,
        resumeVm: async (_req: unknown, _ctx: unknown) => ++ran,
        stopVm: async (_req: unknown, _ctx: unknown) => ++ran,
        deleteVm: async (_req: unknown, _ctx: unknown) => ++ran,
        updateVmNetwork: async (_req: unknown, _ctx: unknown) => ++ran,
        releaseNetworkSlot: async (_req: unknown, _ctx: unknown) => ++ran,
        getVm: async (_req: unknown, _ctx: unknown) => 'read',
      },
      VM_WRITES,
      store,
      { what: 'vm-table.db', maxWaitMs: 200 },
    );
    await expect(impl.createVm({}, ctx(Date.now() + 5000))).rejects.toThrow(StoreBusyError);
    await expect(impl.getVm({}, ctx(Date.now() + 5000))).resolves.toBe('read');
    loop.disable();
    expect(ran).toBe(0);
    process.stderr.write(`vmm sqlite-busy: event loop max block ${(loop.max / 1e6).toFixed(1)} ms with the VM table locked\n`);
    await holder.release();
    await expect(impl.createVm({}, ctx(Date.now() + 5000))).resolves.toBe(1);
    store.put(rec('vm-b'));
    expect(store.list().map((r) => r.vmId)).toEqual(['vm-a', 'vm-b']);
    store.close();
  });

  test('an open of a table locked even for readers waits asynchronously, then is StoreBusyError; it opens once the lock goes', async () => {
    const dir = tmp();
    SqliteVmStore.forStateDir(dir).close();
    holder = await holdSqliteLock(path.join(dir, VM_TABLE_FILE), { exclusive: true });
    await expect(waitWhileBusy(() => SqliteVmStore.forStateDir(dir), { what: 'open', maxWaitMs: 200 })).rejects.toThrow(StoreBusyError);
    await holder.release();
    (await waitWhileBusy(() => SqliteVmStore.forStateDir(dir), { what: 'open', maxWaitMs: 200 })).close();
  });
});
