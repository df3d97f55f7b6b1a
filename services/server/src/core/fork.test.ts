/**
 * ForkSandbox negotiation and crash recovery of the SandboxManager, with a real SQLite record
 * store and scripted peers (the real-node path is in __tests__/fork.it.test.ts; the 0.1.0
 * peers in compat-tests): which way the parent is held, what a missing feature refuses, what a
 * failure leaves behind, and what adoption does with a fork or reset a crash interrupted.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { AbortedError, CommandError, DeadlineExceededError, FailedPreconditionError, InternalError, UnavailableError, UnimplementedError, createLogger } from '@sandnode/shared';
import { SqliteRecordStore } from '../store/sqlite-record-store';
import { adoptAll } from './adoption';
import { SandboxManager, type SandboxManagerOptions } from './sandbox-manager';
import type { SandboxRecord } from './types';
import { Peers, templates } from './__tests__/fake-peers';

const log = createLogger('test', '0', 'silent');

describe('ForkSandbox negotiation', () => {
  let dir: string;
  let store: SqliteRecordStore;
  let peers: Peers;
  let m: SandboxManager;
  let parent: SandboxRecord;

  beforeEach(async () => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-fork-'));
    store = new SqliteRecordStore(path.join(dir, 'records.db'), log);
    peers = new Peers();
    m = new SandboxManager(opts());
    parent = await m.create({ template: 'base', timeoutSeconds: 0, metadata: {}, resources: undefined, requestId: '' });
    peers.events = [];
  });
  afterEach(() => {
    store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const opts = (): SandboxManagerOptions => ({
    store,
    vms: peers.vmPort,
    devices: peers.devicePort,
    podd: peers.podd,
    templates,
    log,
    runDir: path.join(dir, 'run'),
    resourceDefaults: { vcpus: 1, memoryMib: 512, diskBytes: 1 << 20 },
    syncHost: async () => {
      peers.events.push('sync');
    },
  });
  const fork = (maxFreezeMs = 0) => m.fork({ parentId: parent.sandboxId, metadata: { k: 'v' }, timeoutSeconds: 0, maxFreezeMs, requestId: '' });
  const childIds = () =>
    store
      .list()
      .map((r) => r.sandboxId)
      .filter((id) => id !== parent.sandboxId);

  it('a podd with podd.quiesce: quiesce -> clone upper, workspace -> thaw; the child records its parent and a fresh machine id', async () => {
    const r = await fork(800);
    const p = parent.sandboxId;
    expect(peers.events).toEqual([`quiesce ${p} 800`, `clone ${p}-upper quiesced=true`, `clone ${p}-ws quiesced=true`, 'thaw t1']);
    expect(r).toMatchObject({ method: 'quiesce', parentHeldMs: 42 });
    const child = store.get(r.child.sandboxId)!;
    expect(child).toMatchObject({ state: 'RUNNING', forkedFrom: p, rootfsGeneration: 1, metadata: { k: 'v' } });
    expect(child.machineId).toMatch(/^[0-9a-f]{32}$/);
    expect(child.machineId).not.toBe(parent.machineId);
    expect(child.devices.map((d) => d.deviceId)).toEqual([`${child.sandboxId}-upper`, `${child.sandboxId}-ws`]);
    expect(store.get(p)!.state).toBe('RUNNING');
  });

  it("the child takes the parent's idle settings with its own timers from the fork; the parent's lease and activity are not inherited", async () => {
    const p = await m.create({
      template: 'base',
      timeoutSeconds: 0,
      metadata: {},
      resources: undefined,
      requestId: '',
      idle: { pauseAfterS: 60, hibernateAfterS: 600, pausedTtlS: 0, autoResume: false },
    });
    await m.keepAlive(p.sandboxId, 3600);
    const before = Date.now();
    const r = await m.fork({ parentId: p.sandboxId, metadata: {}, timeoutSeconds: 0, maxFreezeMs: 0, requestId: '' });
    const child = store.get(r.child.sandboxId)!;
    expect(child.idle?.settings).toEqual({ pauseAfterS: 60, hibernateAfterS: 600, pausedTtlS: 0, autoResume: false });
    expect(child.idle?.keepAliveUntilMs).toBe(0);
    expect(child.idle!.lastActivityMs).toBeGreaterThanOrEqual(before);
    expect(store.get(p.sandboxId)!.idle?.keepAliveUntilMs).toBeGreaterThan(0);
  });

  it("ForkSandboxRequest.idle replaces the parent's settings; a parent without idle settings gives none", async () => {
    const r1 = await m.fork({ parentId: parent.sandboxId, metadata: {}, timeoutSeconds: 0, maxFreezeMs: 0, requestId: '' });
    expect(store.get(r1.child.sandboxId)!.idle).toBeUndefined();
    const r2 = await m.fork({ parentId: parent.sandboxId, metadata: {}, timeoutSeconds: 0, maxFreezeMs: 0, requestId: '', idle: { pauseAfterS: 5, hibernateAfterS: 0, pausedTtlS: 30 } });
    expect(store.get(r2.child.sandboxId)!.idle?.settings).toEqual({ pauseAfterS: 5, hibernateAfterS: 0, pausedTtlS: 30, autoResume: true });
  });

  it('bad ForkSandboxRequest.idle: INVALID_ARGUMENT and nothing is forked or held', async () => {
    const bad = m.fork({ parentId: parent.sandboxId, metadata: {}, timeoutSeconds: 0, maxFreezeMs: 0, requestId: '', idle: { pauseAfterS: 60, hibernateAfterS: 30, pausedTtlS: 0 } });
    await expect(bad).rejects.toThrow(/idle\.hibernate_after_s: 30 must be above pause_after_s/);
    expect(childIds()).toEqual([]);
    expect(peers.events).toEqual([]);
  });

  it('a podd without podd.quiesce (an older template): pause -> host sync -> clone -> resume, marked on the parent while it is held', async () => {
    peers.poddFeatures = ['podd.exec.v1'];
    const marks: number[] = [];
    peers.onClone = () => marks.push(store.get(parent.sandboxId)!.forkPausedAtMs);
    const r = await fork();
    const p = parent.sandboxId;
    expect(peers.events).toEqual([`pause ${p}`, 'sync', `clone ${p}-upper quiesced=true`, `clone ${p}-ws quiesced=true`, `resume ${p}`]);
    expect(r.method).toBe('pause');
    expect(marks.every((x) => x > 0)).toBe(true);
    expect(store.get(p)!.forkPausedAtMs).toBe(0);
  });

  it('a supervisor with vmm.freeze-arm.v1: the parent is armed for its one freeze right before Quiesce (window = max_freeze_ms + 10 s), disarmed when nothing was frozen', async () => {
    peers.armFreezes = true;
    const p = parent.sandboxId;
    await fork();
    expect(peers.events).toEqual([`arm ${p} 11500`, `quiesce ${p} 1500`, `clone ${p}-upper quiesced=true`, `clone ${p}-ws quiesced=true`, 'thaw t1']);
    peers.events = [];
    peers.quiesceError = new UnavailableError('freeze port not reachable');
    expect((await fork()).method).toBe('pause');
    expect(peers.events.slice(0, 4)).toEqual([`arm ${p} 11500`, `quiesce ${p} 1500`, `disarm ${p}`, `pause ${p}`]);
  });

  it('a podd whose freeze port is unreachable (UNAVAILABLE: nothing frozen) falls back to pause', async () => {
    peers.quiesceError = new UnavailableError('freeze port not reachable');
    const r = await fork();
    const p = parent.sandboxId;
    expect(peers.events).toEqual([`quiesce ${p} 1500`, `pause ${p}`, 'sync', `clone ${p}-upper quiesced=true`, `clone ${p}-ws quiesced=true`, `resume ${p}`]);
    expect(r.method).toBe('pause');
    // any other Quiesce error fails the fork and leaves no child
    peers.quiesceError = new InternalError('FIFREEZE failed');
    peers.events = [];
    await expect(fork()).rejects.toThrow('FIFREEZE failed');
    expect(peers.events).toEqual([`quiesce ${p} 1500`]);
    expect(childIds()).toEqual([r.child.sandboxId]);
  });

  it('podd lists podd.quiesce, so an UNIMPLEMENTED Quiesce is an error, not a reason to fall back', async () => {
    peers.quiesceError = new UnimplementedError('Quiesce is not implemented');
    await expect(fork()).rejects.toBeInstanceOf(UnimplementedError);
    expect(peers.events).toEqual([`quiesce ${parent.sandboxId} 1500`]);
    expect(childIds()).toEqual([]);
  });

  it("a failed host sync fails the fork with an INTERNAL that carries none of the command's stderr, and the parent is resumed", async () => {
    peers.poddFeatures = [];
    m = new SandboxManager({ ...opts(), syncHost: () => Promise.reject(new CommandError('sync: exit 1: /secret/dev: I/O error', '/secret/dev: I/O error', 1)) });
    const err = await fork().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(InternalError);
    expect((err as Error).message).not.toMatch(/secret|I\/O/);
    expect(peers.events.at(-1)).toBe(`resume ${parent.sandboxId}`);
    expect(childIds()).toEqual([]);
  });

  it('a PAUSED parent is cloned as it is and stays paused', async () => {
    await m.pause(parent.sandboxId);
    peers.events = [];
    const r = await fork();
    // the paused parent's dirty pages are flushed to its devices before the clones
    expect(peers.events).toEqual(['sync', `clone ${parent.sandboxId}-upper quiesced=true`, `clone ${parent.sandboxId}-ws quiesced=true`]);
    expect(r).toMatchObject({ method: 'paused-parent', parentHeldMs: 0 });
    expect(store.get(parent.sandboxId)!.state).toBe('PAUSED');
  });

  it('a ublk-manager without ublk.clone: FAILED_PRECONDITION naming component, version and feature, before anything is made', async () => {
    peers.ublkFeatures = ['ublk.loop.v1'];
    const devicesBefore = [...peers.devices.keys()];
    const err = await fork().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(FailedPreconditionError);
    expect((err as Error).message).toMatch(/^ForkSandbox: ublk-manager 0\.1\.0 lacks feature/);
    expect((err as Error).message).toMatch(/"ublk\.clone"/);
    expect(peers.events).toEqual([]);
    expect(childIds()).toEqual([]);
    expect([...peers.devices.keys()]).toEqual(devicesBefore);
  });

  it('the watchdog ended the freeze before the clones finished: ABORTED, and the child is gone', async () => {
    peers.thawEndedBy = 'watchdog';
    await expect(fork()).rejects.toBeInstanceOf(AbortedError);
    expect(childIds()).toEqual([]);
    expect([...peers.devices.keys()].filter((d) => !d.startsWith(parent.sandboxId))).toEqual([]);
  });

  it('a clone that cannot finish within the freeze window (its deadline): ABORTED with advice, the parent thawed, no child, device or VM', async () => {
    peers.cloneTakesMs = 400;
    const vmsBefore = [...peers.vms.keys()];
    const devicesBefore = [...peers.devices.keys()];
    const err = await fork(100).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AbortedError);
    expect((err as Error).message).toMatch(/did not finish within the parent's 100 ms freeze window; retry with a larger max_freeze_ms \(at most 5000\)$/);
    expect(peers.events.at(-1)).toBe('thaw t1');
    expect(childIds()).toEqual([]);
    expect([...peers.vms.keys()]).toEqual(vmsBefore);
    expect([...peers.devices.keys()]).toEqual(devicesBefore);
    expect(store.get(parent.sandboxId)!.state).toBe('RUNNING');
  });

  it('a freeze the sandbox ended itself during the clone (the supervisor says so, whatever podd answers): ABORTED, no child', async () => {
    peers.onClone = () => {
      // something inside the parent called ThawFilesystems on its freeze port
      peers.hostFreeze = { ...peers.hostFreeze!, frozen: false, endedAtMs: Date.now() - 5, endedBy: 'caller' };
    };
    const err = await fork().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AbortedError);
    expect((err as Error).message).toMatch(/ended \d+ ms before the clone finished/);
    expect(childIds()).toEqual([]);
    // replaced by another freeze
    peers.onClone = () => {
      peers.hostFreeze = { token: 'other', frozen: true, frozenAtMs: Date.now(), endedAtMs: 0, endedBy: 'unknown' };
    };
    await expect(fork()).rejects.toThrow(/replaced by another freeze/);
    expect(childIds()).toEqual([]);
  });

  it('issue 10: a podd the sandbox replaced claims a freeze it never made (any token, a huge window): ABORTED, no child; the clone never gets more than 5000 ms', async () => {
    let deadline = 0;
    peers.onClone = (d?: number) => {
      deadline = d ?? 0;
    };
    for (const token of ['', 'made-up', 'f'.repeat(32)]) {
      peers.lyingQuiesce = { token, maxFreezeMs: 4_000_000_000, syncMs: 0, freezeMs: 0 };
      peers.thawEndedBy = 'caller';
      const err = await fork().catch((e: unknown) => e);
      expect(err).toBeInstanceOf(AbortedError);
      expect((err as Error).message).toMatch(/replaced by another freeze, or never made/);
      expect(deadline).toBeLessThanOrEqual(5000);
      expect(childIds()).toEqual([]);
      expect(store.get(parent.sandboxId)!.state).toBe('RUNNING');
    }
    // the token of an earlier freeze that the sandbox ended itself: not this fork's window
    peers.hostFreeze = { token: 'old', frozen: false, frozenAtMs: Date.now() - 100, endedAtMs: Date.now() - 50, endedBy: 'caller' };
    peers.lyingQuiesce = { token: 'old', maxFreezeMs: 1500, syncMs: 0, freezeMs: 0 };
    await expect(fork()).rejects.toThrow(/ended \d+ ms before the clone finished/);
    expect(childIds()).toEqual([]);
  });

  it('issue 10: a supervisor that cannot confirm a freeze (no vmm.freeze-status.v1): the parent is paused, whatever podd lists', async () => {
    peers.noFreezeStatus = true;
    const r = await fork();
    expect(r.method).toBe('pause');
    expect(peers.events.some((e) => e.startsWith('quiesce'))).toBe(false);
  });

  it('a request_id names one call: a concurrent fork of another parent or a create with it is INVALID_ARGUMENT', async () => {
    const other = await m.create({ template: 'base', timeoutSeconds: 0, metadata: {}, resources: undefined, requestId: '' });
    const rq = { metadata: {}, timeoutSeconds: 0, maxFreezeMs: 0, requestId: 'rq-1' };
    const first = m.fork({ parentId: parent.sandboxId, ...rq });
    const again = m.fork({ parentId: parent.sandboxId, ...rq });
    await expect(m.fork({ parentId: other.sandboxId, ...rq })).rejects.toThrow(/in use by a fork of/);
    await expect(m.create({ template: 'base', timeoutSeconds: 0, metadata: {}, resources: undefined, requestId: 'rq-1' })).rejects.toThrow(/in use by a fork of/);
    const [a, b] = await Promise.all([first, again]);
    expect(b.child.sandboxId).toBe(a.child.sandboxId);
    // once done, the id still names that fork only
    await expect(m.fork({ parentId: other.sandboxId, ...rq })).rejects.toThrow(/not a fork of/);
    await expect(m.create({ template: 'base', timeoutSeconds: 0, metadata: {}, resources: undefined, requestId: 'rq-1' })).rejects.toThrow(/a fork of/);
    expect(childIds().filter((id) => id !== other.sandboxId)).toEqual([a.child.sandboxId]);
  });

  it('a ublk-manager gone during the clone (UNAVAILABLE): UNAVAILABLE naming ublk-manager, not the freeze advice; the parent thawed or resumed, no child', async () => {
    // what DevicePeer.clone answers when the manager is gone (also once its retries met the deadline)
    const gone = () => new UnavailableError('ublk-manager CloneDevice: UNAVAILABLE until the deadline (the manager is gone or restarting; the server log has the last error)');
    const vmsBefore = [...peers.vms.keys()];
    const devicesBefore = [...peers.devices.keys()];
    const expectUnavailable = async () => {
      const err = await fork(100).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(UnavailableError);
      expect((err as Error).message).toMatch(
        new RegExp(`^fork of ${parent.sandboxId}: ublk-manager is unavailable, the clone failed \\(.*\\); the fork was undone .*retry once ublk-manager is back$`),
      );
      expect((err as Error).message).not.toMatch(/freeze/);
      expect(childIds()).toEqual([]);
      expect([...peers.vms.keys()]).toEqual(vmsBefore);
      expect([...peers.devices.keys()]).toEqual(devicesBefore);
      expect(store.get(parent.sandboxId)!).toMatchObject({ state: 'RUNNING', forkPausedAtMs: 0 });
    };
    // quiesce: both clones fail, the parent is thawed
    peers.cloneFails = gone;
    await expectUnavailable();
    expect(peers.events.at(-1)).toBe('thaw t1');
    // one clone ran into the window, the other saw the manager gone: the manager is the cause
    peers.events = [];
    peers.cloneFails = (src) => (src.endsWith('-upper') ? new DeadlineExceededError('Deadline exceeded') : gone());
    await expectUnavailable();
    expect(peers.events.at(-1)).toBe('thaw t1');
    // pause (a podd without podd.quiesce): the parent is resumed
    peers.poddFeatures = [];
    peers.events = [];
    peers.cloneFails = gone;
    await expectUnavailable();
    expect(peers.events.at(-1)).toBe(`resume ${parent.sandboxId}`);
  });

  it('a ublk-manager with ublk.clone-snapshot.v1: only SnapshotDevices runs in the freeze; the snapshots are attached (CloneDevice, not quiesced) after the thaw', async () => {
    peers.ublkFeatures = ['ublk.clone', 'ublk.clone-snapshot.v1'];
    const r = await fork(800);
    const p = parent.sandboxId;
    expect(peers.events).toEqual([`quiesce ${p} 800`, `snapshot ${p}-upper,${p}-ws quiesced=true`, 'thaw t1', `clone ${p}-upper quiesced=false`, `clone ${p}-ws quiesced=false`]);
    expect(r).toMatchObject({ method: 'quiesce', parentHeldMs: 42 });
    const child = store.get(r.child.sandboxId)!;
    expect(child.state).toBe('RUNNING');
    expect(child.devices.map((d) => [d.deviceId, d.path])).toEqual([
      [`${child.sandboxId}-upper`, `/dev/loop-${child.sandboxId}-upper`],
      [`${child.sandboxId}-ws`, `/dev/loop-${child.sandboxId}-ws`],
    ]);
    // a paused parent (pause path) is held for the snapshot only too
    peers.poddFeatures = [];
    peers.events = [];
    await fork();
    expect(peers.events).toEqual([`pause ${p}`, 'sync', `snapshot ${p}-upper,${p}-ws quiesced=true`, `resume ${p}`, `clone ${p}-upper quiesced=false`, `clone ${p}-ws quiesced=false`]);
  });

  it('a snapshot that fails (the manager gone, a full disk) or outlasts the window: the parent thawed, the child and its snapshots gone', async () => {
    peers.ublkFeatures = ['ublk.clone', 'ublk.clone-snapshot.v1'];
    const devicesBefore = [...peers.devices.keys()];
    peers.cloneFails = () => new UnavailableError('ublk-manager SnapshotDevices: UNAVAILABLE until the deadline');
    await expect(fork(100)).rejects.toThrow(/ublk-manager is unavailable, the clone failed/);
    expect(peers.events.at(-1)).toBe('thaw t1');
    peers.cloneFails = () => new DeadlineExceededError('Deadline exceeded');
    await expect(fork(100)).rejects.toThrow(/did not finish within the parent's 100 ms freeze window/);
    peers.cloneFails = undefined;
    peers.failClone = true;
    await expect(fork()).rejects.toThrow('disk full');
    expect(childIds()).toEqual([]);
    expect([...peers.devices.keys()]).toEqual(devicesBefore);
    expect(store.get(parent.sandboxId)!.state).toBe('RUNNING');
  });

  it('a supervisor with vmm.host-thaw.v1 thaws the parent from the host (not through podd); a failed ThawVmFreeze thaws through podd', async () => {
    peers.hostThaw = true;
    const r = await fork(800);
    const p = parent.sandboxId;
    expect(peers.events).toEqual([`quiesce ${p} 800`, `clone ${p}-upper quiesced=true`, `clone ${p}-ws quiesced=true`, 'host-thaw t1']);
    expect(r).toMatchObject({ method: 'quiesce', parentHeldMs: 17 });
    peers.hostThaw = 'fails';
    peers.events = [];
    const r2 = await fork(800);
    expect(peers.events.slice(-2)).toEqual(['host-thaw t1', 'thaw t1']);
    expect(r2).toMatchObject({ method: 'quiesce', parentHeldMs: 42 });
    // the host's word on the freeze is still checked: a watchdog end is ABORTED
    peers.hostThaw = true;
    peers.thawEndedBy = 'watchdog';
    await expect(fork()).rejects.toBeInstanceOf(AbortedError);
    expect(childIds().sort()).toEqual([r.child.sandboxId, r2.child.sandboxId].sort());
  });

  it('a failed clone still thaws (quiesce) or resumes (pause) the parent and leaves no child', async () => {
    peers.failClone = true;
    await expect(fork()).rejects.toThrow('disk full');
    expect(peers.events.at(-1)).toBe('thaw t1');
    peers.poddFeatures = [];
    peers.events = [];
    await expect(fork()).rejects.toThrow('disk full');
    expect(peers.events.at(-1)).toBe(`resume ${parent.sandboxId}`);
    expect(store.get(parent.sandboxId)!).toMatchObject({ state: 'RUNNING', forkPausedAtMs: 0 });
    expect(childIds()).toEqual([]);
  });

  it('adoption resumes a parent a crashed server left paused for a fork, and keeps it RUNNING', async () => {
    const rec = store.get(parent.sandboxId)!;
    rec.forkPausedAtMs = Date.now();
    store.put(rec);
    peers.vms.get(parent.sandboxId)!.state = 'PAUSED';
    const report = await adoptAll({ store, vms: peers.vmPort, devices: peers.devicePort, podd: peers.podd, manager: m, log });
    expect(report.adopted).toEqual([parent.sandboxId]);
    expect(peers.events).toEqual([`resume ${parent.sandboxId}`]);
    expect(store.get(parent.sandboxId)!).toMatchObject({ state: 'RUNNING', forkPausedAtMs: 0 });
  });

  it('adoption undoes a reset that never stopped the VM, and finishes one that did', async () => {
    const id = parent.sandboxId;
    // 1: fresh upper made and recorded, VM alive
    await peers.devicePort.createEmpty(`${id}-upper-g2`, 1);
    let rec = store.get(id)!;
    rec.resetUpperDeviceId = `${id}-upper-g2`;
    store.put(rec);
    await adoptAll({ store, vms: peers.vmPort, devices: peers.devicePort, podd: peers.podd, manager: m, log });
    expect(store.get(id)!).toMatchObject({ state: 'RUNNING', resetUpperDeviceId: '', rootfsGeneration: 1 });
    expect(peers.devices.has(`${id}-upper-g2`)).toBe(false);
    // 2: fresh upper recorded and the VM stopped
    await peers.devicePort.createEmpty(`${id}-upper-g2`, 1);
    rec = store.get(id)!;
    rec.resetUpperDeviceId = `${id}-upper-g2`;
    store.put(rec);
    peers.vms.delete(id);
    await adoptAll({ store, vms: peers.vmPort, devices: peers.devicePort, podd: peers.podd, manager: m, log });
    rec = store.get(id)!;
    expect(rec).toMatchObject({ state: 'DRAINED', resumeMethod: 'cold-start', resetUpperDeviceId: '', rootfsGeneration: 2 });
    expect(rec.devices.map((d) => d.deviceId).sort()).toEqual([`${id}-upper-g2`, `${id}-ws`]);
    expect(peers.devices.has(`${id}-upper`)).toBe(false);
    // ResumeSandbox boots it on the new upper
    await m.resume(id);
    expect(store.get(id)!.state).toBe('RUNNING');
  });
});
