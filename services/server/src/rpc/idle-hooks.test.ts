/**
 * withIdle by the caller's role (security finding c): a read-role caller's read RPCs on a PAUSED
 * or hibernated sandbox are FAILED_PRECONDITION naming the state, resume nothing, reach no
 * handler and move no activity; on a RUNNING one they run but are neither activity nor a call in
 * flight (an open DownloadFile of a read token does not hold the idle pause off). An admin caller
 * and a caller of a server without an AuthPolicy (no role) keep auto-resume and activity. A real
 * SQLite store, scripted peers and a test clock.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createLogger, FailedPreconditionError, type Role, type SandnodeCallContext } from '@sandnode/shared';
import type { SandboxServiceImplementation } from '@sandnode/shared/proto/server/v1/sandbox';
import { SqliteRecordStore } from '../store/sqlite-record-store';
import { managerOptions, Peers } from '../core/__tests__/fake-peers';
import { SandboxManager, type CreateSandboxArgs } from '../core/sandbox-manager';
import { idleCall, withIdle } from './idle-hooks';

const log = createLogger('test', '0', 'silent');
/** The SandboxService methods a read-role token may call that name one sandbox and need it RUNNING (NO_SIDE_EFFECTS in sandbox.proto). */
const READ_UNARY = ['statFile', 'listDirectory', 'listProcesses', 'readFile'] as const;

describe('withIdle: a read-role caller is no activity and wakes nothing', () => {
  let dir: string;
  let store: SqliteRecordStore;
  let peers: Peers;
  let clock: number;
  let m: SandboxManager;
  let ran: string[];
  /** a fake implementation: every read method notes that it ran; downloadFile stays open after its first chunk until the test closes it */
  let svc: SandboxServiceImplementation<SandnodeCallContext>;

  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-idle-hooks-'));
    store = new SqliteRecordStore(path.join(dir, 'records.db'), log);
    peers = new Peers();
    clock = 1_000_000;
    m = new SandboxManager(managerOptions(peers, store, dir, { now: () => clock }));
    ran = [];
    const impl: Record<string, unknown> = {};
    for (const name of READ_UNARY) impl[name] = async () => (ran.push(name), {});
    impl.downloadFile = async function* () {
      ran.push('downloadFile');
      yield { part: { $case: 'data', value: Buffer.from('a') } };
      yield { part: { $case: 'data', value: Buffer.from('b') } };
    };
    svc = withIdle(impl as unknown as SandboxServiceImplementation<SandnodeCallContext>, m.idle);
  });
  afterEach(() => {
    store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const create = (idle: CreateSandboxArgs['idle']) => m.create({ template: 'base', timeoutSeconds: 0, metadata: {}, resources: undefined, requestId: '', idle });
  const resumes = () => peers.events.filter((e) => e.startsWith('resume ')).length;
  const ctx = (role: Role | undefined) => ({ log, signal: new AbortController().signal, callerRole: role }) as never;
  const call = (name: string, id: string, role: Role | undefined) => (svc as unknown as Record<string, (req: unknown, c: unknown) => Promise<unknown>>)[name]!({ sandboxId: id, path: 'f' }, ctx(role));
  const download = (id: string, role: Role | undefined) =>
    (svc.downloadFile as unknown as (req: unknown, c: unknown) => AsyncIterable<unknown>)({ sandboxId: id, path: 'f' }, ctx(role))[Symbol.asyncIterator]();
  const idlePaused = async () => {
    const { sandboxId: id } = await create({ pauseAfterS: 10, hibernateAfterS: 0, pausedTtlS: 0 });
    clock += 10_000;
    expect(await m.runIdle()).toEqual([{ sandboxId: id, action: 'pause' }]);
    return id;
  };

  it('on an idle-PAUSED sandbox every read RPC of a read caller is FAILED_PRECONDITION naming PAUSED; it stays PAUSED, no handler runs, no activity', async () => {
    const id = await idlePaused();
    const activity = m.idle.lastActivityMs(store.get(id)!);
    clock += 5_000;
    for (const name of READ_UNARY) {
      const err = await call(name, id, 'read').then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(FailedPreconditionError);
      expect((err as Error).message).toMatch(new RegExp(`sandbox ${id} is PAUSED .*read-role caller does not resume.*admin-role token`));
    }
    await expect(download(id, 'read').next()).rejects.toThrow(/is PAUSED and DownloadFile needs RUNNING/);
    expect(ran).toEqual([]);
    expect(resumes()).toBe(0);
    expect(store.get(id)?.state).toBe('PAUSED');
    expect(m.idle.lastActivityMs(store.get(id)!)).toBe(activity);
  });

  it('on a hibernated sandbox a read caller is FAILED_PRECONDITION naming it, and it stays DRAINED', async () => {
    const { sandboxId: id } = await create({ pauseAfterS: 0, hibernateAfterS: 10, pausedTtlS: 0 });
    clock += 10_000;
    expect(await m.runIdle()).toEqual([{ sandboxId: id, action: 'hibernate' }]);
    await expect(call('readFile', id, 'read')).rejects.toThrow(/is hibernated \(DRAINED\) and ReadFile needs RUNNING/);
    expect(store.get(id)?.state).toBe('DRAINED');
    expect(ran).toEqual([]);
  });

  it('on a RUNNING sandbox a read caller is served but is no activity and no call in flight: the idle pause still comes, even under an open download', async () => {
    const { sandboxId: id } = await create({ pauseAfterS: 10, hibernateAfterS: 0, pausedTtlS: 0 });
    const activity = m.idle.lastActivityMs(store.get(id)!);
    clock += 9_000;
    for (const name of READ_UNARY) await call(name, id, 'read');
    const it = download(id, 'read');
    await it.next();
    expect(ran).toEqual([...READ_UNARY, 'downloadFile']);
    expect(m.idle.lastActivityMs(store.get(id)!)).toBe(activity);
    clock += 1_000;
    expect(await m.runIdle()).toEqual([{ sandboxId: id, action: 'pause' }]);
    await it.return?.(undefined);
  });

  it.each([
    ['an admin', 'admin' as const],
    ['a no-AuthPolicy (no role)', undefined],
  ])('%s caller auto-resumes an idle-PAUSED sandbox and is activity (the behaviour before)', async (_what, role) => {
    const id = await idlePaused();
    clock += 5_000;
    await call('statFile', id, role);
    expect(store.get(id)?.state).toBe('RUNNING');
    expect(resumes()).toBe(1);
    expect(m.idle.lastActivityMs(store.get(id)!)).toBe(clock);
    // and its open download holds the next pause off
    const it = download(id, role);
    await it.next();
    clock += 60_000;
    expect(await m.runIdle()).toEqual([]);
    await it.return?.(undefined);
  });

  it('idleCall (UploadFile, ExecStream: client streams) refuses a read caller on a PAUSED sandbox and resumes for an admin', async () => {
    const id = await idlePaused();
    await expect(idleCall(m.idle, id, 'UploadFile', { callerRole: 'read' }, async () => 'ran')).rejects.toThrow(/is PAUSED and UploadFile needs RUNNING/);
    expect(store.get(id)?.state).toBe('PAUSED');
    expect(await idleCall(m.idle, id, 'UploadFile', { callerRole: 'admin' }, async () => 'ran')).toBe('ran');
    expect(store.get(id)?.state).toBe('RUNNING');
  });
});
