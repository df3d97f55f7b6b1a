/**
 * Idle actions with a real SQLite store, scripted peers and a test clock: pause, hibernate and the
 * paused TTL come at the times the record says (a new manager on the same store — a handover or
 * a crash — acts on the same times), activity and the KeepAlive lease hold them off, auto-resume
 * resumes once however many callers, auto_resume=false and bad input are refused, and the idle
 * fields survive a rewrite by a server that does not know them.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createLogger, FailedPreconditionError, InvalidArgumentError, retryAfterMsOf, UnavailableError } from '@sandnode/shared';
import { RuntimeRecord } from '@sandnode/shared/proto/server/v1/record';
import { SqliteRecordStore } from '../store/sqlite-record-store';
import { decodeRecord, encodeRecord } from '../store/record-codec';
import { managerOptions, Peers } from './__tests__/fake-peers';
import { BULK_HOLD_MAX_MS, nextIdleAction, ResumeWaitError, validateIdle } from './idle';
import { SandboxManager, type CreateSandboxArgs } from './sandbox-manager';

const log = createLogger('test', '0', 'silent');

describe('idle actions', () => {
  let dir: string;
  let store: SqliteRecordStore;
  let peers: Peers;
  let clock: number;
  let m: SandboxManager;
  const manager = (extra = {}) => new SandboxManager(managerOptions(peers, store, dir, { now: () => clock, ...extra }));

  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-idle-'));
    store = new SqliteRecordStore(path.join(dir, 'records.db'), log);
    peers = new Peers();
    clock = 1_000_000;
    m = manager();
  });
  afterEach(() => {
    store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const create = (idle: CreateSandboxArgs['idle']) => m.create({ template: 'base', timeoutSeconds: 0, metadata: {}, resources: undefined, requestId: '', idle });
  const pauses = () => peers.events.filter((e) => e.startsWith('pause ')).length;
  const resumes = () => peers.events.filter((e) => e.startsWith('resume ')).length;

  it('pauses a RUNNING sandbox pause_after_s after its last activity, not before; activity moves the time', async () => {
    const { sandboxId: id } = await create({ pauseAfterS: 60, hibernateAfterS: 0, pausedTtlS: 0 });
    expect(nextIdleAction(store.get(id)!, m.idle.lastActivityMs(store.get(id)!))).toEqual({ action: 'pause', atMs: clock + 60_000 });
    clock += 59_000;
    expect(await m.runIdle()).toEqual([]);
    m.idle.activity(id);
    clock += 59_000;
    expect(await m.runIdle()).toEqual([]);
    clock += 1_000;
    expect(await m.runIdle()).toEqual([{ sandboxId: id, action: 'pause' }]);
    expect(store.get(id)).toMatchObject({ state: 'PAUSED', idle: { pausedAtMs: clock } });
    expect(pauses()).toBe(1);
  });

  it('a call in flight (an Exec stream) holds the pause off however long it runs', async () => {
    const { sandboxId: id } = await create({ pauseAfterS: 10, hibernateAfterS: 0, pausedTtlS: 0 });
    const leave = m.idle.enter(id);
    clock += 3_600_000;
    expect(await m.runIdle()).toEqual([]);
    leave();
    clock += 10_000;
    expect(await m.runIdle()).toEqual([{ sandboxId: id, action: 'pause' }]);
  });

  it("a bulk transfer podd serves (out of the server's sight) holds pause and hibernate off; it ends, the action comes", async () => {
    const { sandboxId: id } = await create({ pauseAfterS: 10, hibernateAfterS: 20, pausedTtlS: 0 });
    peers.poddBulk = 1;
    clock += 30_000;
    expect(await m.runIdle()).toEqual([]);
    clock += 9_000;
    expect(await m.runIdle()).toEqual([]);
    // the end of the transfer is activity: the next action is pause_after_s after it
    peers.poddBulk = 0;
    expect(await m.runIdle()).toEqual([]);
    clock += 9_000;
    expect(await m.runIdle()).toEqual([]);
    clock += 1_000;
    expect(await m.runIdle()).toEqual([{ sandboxId: id, action: 'pause' }]);
    expect(pauses()).toBe(1);
  });

  it('podd claiming a bulk transfer forever holds the actions off for BULK_HOLD_MAX_MS at most; a podd that fails or hangs holds nothing', async () => {
    const { sandboxId: id } = await create({ pauseAfterS: 10, hibernateAfterS: 0, pausedTtlS: 0 });
    // the bound counts from the last activity (the create here; a PrepareBulkTransfer for a copy)
    const lastActivity = clock;
    peers.poddBulk = 3;
    clock += 10_000;
    expect(await m.runIdle()).toEqual([]);
    while (clock + 500_000 < lastActivity + BULK_HOLD_MAX_MS) {
      clock += 500_000;
      expect(await m.runIdle()).toEqual([]);
    }
    clock = lastActivity + BULK_HOLD_MAX_MS;
    expect(await m.runIdle()).toEqual([{ sandboxId: id, action: 'pause' }]);

    const { sandboxId: b } = await create({ pauseAfterS: 10, hibernateAfterS: 0, pausedTtlS: 0 });
    peers.poddBulk = new Error('podd: UNAVAILABLE');
    clock += 10_000;
    expect(await m.runIdle()).toEqual([{ sandboxId: b, action: 'pause' }]);
    const { sandboxId: c } = await create({ pauseAfterS: 10, hibernateAfterS: 0, pausedTtlS: 0 });
    peers.poddBulk = 'hang';
    clock += 10_000;
    expect(await m.runIdle()).toEqual([{ sandboxId: c, action: 'pause' }]);
  });

  it('KeepAlive holds the idle actions off until the lease ends; 0 ends it', async () => {
    const { sandboxId: id } = await create({ pauseAfterS: 10, hibernateAfterS: 0, pausedTtlS: 0 });
    const rec = await m.keepAlive(id, 300);
    expect(rec.idle?.keepAliveUntilMs).toBe(clock + 300_000);
    clock += 299_000;
    expect(await m.runIdle()).toEqual([]);
    clock += 10_000;
    expect(await m.runIdle()).toEqual([]);
    clock += 1_000;
    expect(await m.runIdle()).toEqual([{ sandboxId: id, action: 'pause' }]);
    await m.resume(id);
    await m.keepAlive(id, 300);
    await m.keepAlive(id, 0);
    clock += 10_000;
    expect(await m.runIdle()).toEqual([{ sandboxId: id, action: 'pause' }]);
  });

  it('hibernates (DRAINED, cold-start, slot kept), auto-resumes with a new pid, and the TTL deletes a hibernated one', async () => {
    peers.network = true;
    const { sandboxId: id, vm, network } = await create({ pauseAfterS: 10, hibernateAfterS: 20, pausedTtlS: 100 });
    expect(network?.address).toMatch(/^10\.209\./);
    clock += 10_000;
    expect(await m.runIdle()).toEqual([{ sandboxId: id, action: 'pause' }]);
    const pausedAt = clock;
    clock += 10_000;
    expect(await m.runIdle()).toEqual([{ sandboxId: id, action: 'hibernate' }]);
    expect(store.get(id)).toMatchObject({ state: 'DRAINED', resumeMethod: 'cold-start', idle: { pausedAtMs: pausedAt, hibernatedAtMs: clock } });
    expect(peers.vms.has(id)).toBe(false);
    expect(peers.netEvents).toContain(`delete ${id} keep=true`);
    expect(peers.slots.get(network!.slot)).toMatchObject({ state: 'RESERVED', owner: id });
    await m.idle.ensureRunning(id, 'Exec');
    const back = store.get(id)!;
    expect(back).toMatchObject({ state: 'RUNNING', resumeMethod: '', idle: { pausedAtMs: 0, hibernatedAtMs: 0, lastActivityMs: clock } });
    expect(back.vm?.pid).not.toBe(vm?.pid);
    expect(back.network?.address).toBe(network?.address);
    // past both times: hibernated straight from RUNNING (freeze first, no pause of its own), then deleted paused_ttl_s after it
    clock += 20_000;
    const before = pauses();
    expect((await m.runIdle()).map((a) => a.action)).toEqual(['hibernate']);
    expect(pauses()).toBe(before + 1);
    expect(store.get(id)?.state).toBe('DRAINED');
    clock += 99_000;
    expect(await m.runIdle()).toEqual([]);
    clock += 1_000;
    expect(await m.runIdle()).toEqual([{ sandboxId: id, action: 'delete' }]);
    expect(store.get(id)).toBeUndefined();
  });

  it('the paused TTL counts from a PauseSandbox too', async () => {
    const { sandboxId: id } = await create({ pauseAfterS: 0, hibernateAfterS: 0, pausedTtlS: 30 });
    clock += 1_000_000;
    expect(await m.runIdle()).toEqual([]);
    await m.pause(id);
    clock += 30_000;
    expect(await m.runIdle()).toEqual([{ sandboxId: id, action: 'delete' }]);
  });

  it('timers live in the record: a new manager on the same store (handover, crash) acts at the same time', async () => {
    const { sandboxId: id } = await create({ pauseAfterS: 60, hibernateAfterS: 0, pausedTtlS: 0 });
    clock += 30_000;
    m.idle.activity(id);
    // a handover flushes every newer activity (checkpoint); a crash keeps what the last flush wrote
    m.idle.flush(true);
    const next = manager();
    clock += 59_000;
    expect(await next.runIdle()).toEqual([]);
    clock += 1_000;
    expect(await next.runIdle()).toEqual([{ sandboxId: id, action: 'pause' }]);
  });

  it('activity is written at most every idleActivityFlushMs, and always at a transition', async () => {
    m = manager({ idleActivityFlushMs: 5_000 });
    const { sandboxId: id } = await create({ pauseAfterS: 60, hibernateAfterS: 0, pausedTtlS: 0 });
    const t0 = store.get(id)!.idle!.lastActivityMs;
    clock += 1_000;
    m.idle.activity(id);
    expect(m.idle.flush()).toEqual([]);
    clock += 4_000;
    m.idle.activity(id);
    expect(m.idle.flush()).toEqual([id]);
    expect(store.get(id)!.idle!.lastActivityMs).toBe(t0 + 5_000);
    clock += 1_000;
    m.idle.activity(id);
    await m.setTimeout(id, 0);
    expect(store.get(id)!.idle!.lastActivityMs).toBe(t0 + 6_000);
  });

  it('two concurrent auto-resumes of a PAUSED sandbox resume it once', async () => {
    const { sandboxId: id } = await create({ pauseAfterS: 10, hibernateAfterS: 0, pausedTtlS: 0 });
    clock += 10_000;
    await m.runIdle();
    await Promise.all([m.idle.ensureRunning(id, 'Exec'), m.idle.ensureRunning(id, 'Exec'), m.resume(id).catch(() => undefined)]);
    expect(store.get(id)?.state).toBe('RUNNING');
    expect(resumes()).toBe(1);
  });

  it('an auto-resume during an idle pause waits for it, then resumes: one pause, one resume', async () => {
    const { sandboxId: id } = await create({ pauseAfterS: 10, hibernateAfterS: 0, pausedTtlS: 0 });
    clock += 10_000;
    const tick = m.runIdle();
    const resumed = m.idle.ensureRunning(id, 'Exec');
    await Promise.all([tick, resumed]);
    expect(store.get(id)?.state).toBe('RUNNING');
    expect([pauses(), resumes()]).toEqual([1, 1]);
  });

  it('auto_resume=false: FAILED_PRECONDITION naming the state; a sandbox without idle settings is left to the operation', async () => {
    const { sandboxId: id } = await create({ pauseAfterS: 10, hibernateAfterS: 0, pausedTtlS: 0, autoResume: false });
    clock += 10_000;
    await m.runIdle();
    await expect(m.idle.ensureRunning(id, 'Exec')).rejects.toThrow(new FailedPreconditionError(`sandbox ${id} is PAUSED and its idle.auto_resume is off: ResumeSandbox it first (Exec needs RUNNING)`));
    const { sandboxId: plain } = await create(undefined);
    await m.pause(plain);
    await m.idle.ensureRunning(plain, 'Exec');
    expect(store.get(plain)?.state).toBe('PAUSED');
    expect(resumes()).toBe(0);
  });

  it('an auto-resume that does not finish within autoResumeTimeoutMs is UNAVAILABLE with a retry delay; the resume goes on', async () => {
    m = manager({ autoResumeTimeoutMs: 50 });
    const { sandboxId: id } = await create({ pauseAfterS: 10, hibernateAfterS: 0, pausedTtlS: 0 });
    clock += 10_000;
    await m.runIdle();
    let release!: () => void;
    const slow = new Promise<void>((r) => (release = r));
    const orig = peers.vmPort.resume;
    peers.vmPort.resume = async (vmId) => {
      await slow;
      return orig(vmId);
    };
    const err = await m.idle.ensureRunning(id, 'Exec').catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ResumeWaitError);
    expect(err).toBeInstanceOf(UnavailableError);
    expect((err as ResumeWaitError).retryAfterMs).toBeGreaterThan(0);
    // the server's error middleware sends it as trailer retry-after-ms
    expect(retryAfterMsOf(err)).toBe((err as ResumeWaitError).retryAfterMs);
    release();
    await m.idle.ensureRunning(id, 'Exec');
    expect(store.get(id)?.state).toBe('RUNNING');
    expect(resumes()).toBe(1);
  });

  it('bad idle settings and leases are INVALID_ARGUMENT and change nothing', async () => {
    const bad = [
      { pauseAfterS: -1, hibernateAfterS: 0, pausedTtlS: 0 },
      { pauseAfterS: 1.5, hibernateAfterS: 0, pausedTtlS: 0 },
      { pauseAfterS: 0, hibernateAfterS: 2_592_001, pausedTtlS: 0 },
      { pauseAfterS: 0, hibernateAfterS: 0, pausedTtlS: 4_294_967_295 },
      { pauseAfterS: 60, hibernateAfterS: 60, pausedTtlS: 0 },
    ];
    for (const idle of bad) await expect(create(idle)).rejects.toThrow(InvalidArgumentError);
    expect(store.list()).toEqual([]);
    expect(peers.devices.size).toBe(0);
    const { sandboxId: id } = await create({ pauseAfterS: 10, hibernateAfterS: 0, pausedTtlS: 0 });
    const before = encodeRecord(store.get(id)!);
    expect(() => m.keepAlive(id, 2_592_001)).toThrow(new InvalidArgumentError('for_s: 2592001 is not a whole number of seconds in 0..2592000 (30 days)'));
    expect(encodeRecord(store.get(id)!)).toEqual(before);
    expect(validateIdle('idle', undefined)).toBeUndefined();
    expect(validateIdle('idle', { pauseAfterS: 1, hibernateAfterS: 0, pausedTtlS: 0 })?.autoResume).toBe(true);
  });

  it('the idle fields survive a rewrite by a server that does not know field 30 (kept as an unknown field)', async () => {
    const { sandboxId: id } = await create({ pauseAfterS: 10, hibernateAfterS: 20, pausedTtlS: 30, autoResume: false });
    await m.keepAlive(id, 5);
    const bytes = encodeRecord(store.get(id)!);
    // what an older reader holds: field 30 only as raw bytes in _unknownFields (ts-proto unknownFields=true)
    const full = RuntimeRecord.decode(bytes);
    const alone = RuntimeRecord.encode(RuntimeRecord.fromPartial({ idle: full.idle })).finish();
    // tag of field 30, length-delimited: (30 << 3) | 2 = 242 = varint f2 01; ts-proto keeps what follows the tag
    expect([...alone.subarray(0, 2)]).toEqual([0xf2, 0x01]);
    const old = { ...full, idle: undefined, _unknownFields: { 242: [alone.subarray(2)] } };
    const rewritten = RuntimeRecord.encode({ ...old, expiresAtMs: 42 }).finish();
    const back = decodeRecord(rewritten);
    expect(back.expiresAtMs).toBe(42);
    expect(back.idle).toEqual(store.get(id)!.idle);
    expect(back.idle?.settings).toEqual({ pauseAfterS: 10, hibernateAfterS: 20, pausedTtlS: 30, autoResume: false });
  });
});
