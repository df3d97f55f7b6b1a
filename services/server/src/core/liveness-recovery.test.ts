/**
 * recoverLiveness (reaper.ts): an ERROR record the liveness check (or an older server, which
 * took a failed /proc read for "gone") marked while its VM still ran comes back to the VM's
 * state; a record whose VM, process or devices are really gone, or whose error is another one,
 * stays ERROR (and says why when its process runs). The VMs are real processes (sleep), so
 * /proc answers for them; the supervisor and device manager are the fakes of fake-peers.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createLogger, processStartTicks } from '@sandnode/shared';
import { SqliteRecordStore } from '../store/sqlite-record-store';
import { managerOptions, Peers } from './__tests__/fake-peers';
import { livenessError } from './reaper';
import { SandboxManager } from './sandbox-manager';

const log = createLogger('test', '0', 'silent');

describe('recoverLiveness', () => {
  let dir: string;
  let store: SqliteRecordStore;
  let peers: Peers;
  let m: SandboxManager;
  const children: ChildProcess[] = [];

  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-liveness-'));
    store = new SqliteRecordStore(path.join(dir, 'records.db'), log);
    peers = new Peers();
    m = new SandboxManager(managerOptions(peers, store, dir));
  });
  afterEach(async () => {
    for (const c of children.splice(0)) {
      if (c.exitCode === null && c.signalCode === null) {
        c.kill('SIGKILL');
        await new Promise((r) => c.once('exit', r));
      }
    }
    store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  /** a RUNNING sandbox whose VM is a real process, then marked ERROR by the liveness check as a server short of descriptors did */
  async function wronglyMarked(state: 'RUNNING' | 'PAUSED' = 'RUNNING', message?: (pid: number) => string): Promise<{ id: string; child: ChildProcess }> {
    const { sandboxId: id } = await m.create({ template: 'base', timeoutSeconds: 0, metadata: {}, resources: undefined, requestId: '' });
    if (state === 'PAUSED') await m.pause(id);
    const child = spawn('sleep', ['60'], { stdio: 'ignore' });
    children.push(child);
    await new Promise((r) => child.once('spawn', r));
    const pid = child.pid!;
    const ticks = processStartTicks(pid)!;
    const rec = store.get(id)!;
    const vm = peers.vms.get(rec.vm!.vmId)!;
    vm.pid = pid;
    vm.startTimeTicks = ticks;
    store.put({ ...rec, state: 'ERROR', errorMessage: (message ?? livenessError)(pid), vm: { ...rec.vm!, pid, startTimeTicks: ticks } });
    return { id, child };
  }

  it('brings back a sandbox whose VM runs as the same process, to the VM state, its error cleared', async () => {
    const a = await wronglyMarked('RUNNING');
    const b = await wronglyMarked('PAUSED');
    const r = await m.recoverLiveness();
    expect({ recovered: [...r.recovered].sort(), kept: r.kept }).toEqual({ recovered: [a.id, b.id].sort(), kept: [] });
    expect(store.get(a.id)).toMatchObject({ state: 'RUNNING', errorMessage: '' });
    expect(store.get(b.id)).toMatchObject({ state: 'PAUSED', errorMessage: '' });
    // back for good: lifecycle calls work again
    expect((await m.pause(a.id)).state).toBe('PAUSED');
  });

  it('leaves ERROR a sandbox whose process is gone, or whose error is another one (unchanged)', async () => {
    const gone = await wronglyMarked();
    gone.child.kill('SIGKILL');
    await new Promise((r) => gone.child.once('exit', r));
    const other = await wronglyMarked('RUNNING', () => 'its VM is gone');
    const otherPid = await wronglyMarked('RUNNING', (pid) => livenessError(pid + 1));
    const before = [gone.id, other.id, otherPid.id].map((id) => store.get(id)!.errorMessage);
    expect(await m.recoverLiveness()).toEqual({ recovered: [], kept: [] });
    expect([gone.id, other.id, otherPid.id].map((id) => store.get(id)!.state)).toEqual(['ERROR', 'ERROR', 'ERROR']);
    expect([gone.id, other.id, otherPid.id].map((id) => store.get(id)!.errorMessage)).toEqual(before);
  });

  it('keeps ERROR, saying why, a sandbox whose process runs but whose VM the supervisor no longer has, is another process, or whose device is gone', async () => {
    const noVm = await wronglyMarked();
    peers.vms.delete(store.get(noVm.id)!.vm!.vmId);
    const otherVm = await wronglyMarked();
    peers.vms.get(store.get(otherVm.id)!.vm!.vmId)!.startTimeTicks += 1;
    const noDisk = await wronglyMarked();
    const dev = store.get(noDisk.id)!.devices[0]!;
    peers.devices.get(dev.deviceId)!.attached = false;
    const r = await m.recoverLiveness();
    expect(r.recovered).toEqual([]);
    expect(Object.fromEntries(r.kept.map((k) => [k.sandboxId, k.reason]))).toEqual({
      [noVm.id]: `the vmm-supervisor has no VM ${store.get(noVm.id)!.vm!.vmId}`,
      [otherVm.id]: `the vmm-supervisor's VM ${store.get(otherVm.id)!.vm!.vmId} is another process (pid ${otherVm.child.pid})`,
      [noDisk.id]: `device ${dev.deviceId} is gone`,
    });
    for (const id of [noVm.id, otherVm.id, noDisk.id]) {
      expect(store.get(id)).toMatchObject({ state: 'ERROR', errorMessage: expect.stringMatching(/^its VM process \(pid \d+\) is gone; its process runs again but it was not recovered: /) });
    }
    // asked once: the next round does not ask again
    expect(await m.recoverLiveness()).toEqual({ recovered: [], kept: [] });
  });
});
