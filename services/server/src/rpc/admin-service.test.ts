import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { FailedPreconditionError, InvalidArgumentError, SERVER_FEATURES, Status } from '@sandnode/shared';
import { ServerRole, TokenRole } from '@sandnode/shared/proto/server/v1/admin';
import { FlockLease } from '../store/flock-lease';
import type { Role } from '../handover/roles';
import { adminService, roleToPb, type AdminPort } from './admin-service';

/** AdminService handlers: validation before the node is called, defaults, role mapping. */
describe('AdminService handlers', () => {
  let dir: string;
  let calls: string[];
  let node: AdminPort;
  /** the server call context the handlers get (only its signal is used) */
  type Ctx = Parameters<ReturnType<typeof adminService>['takeover']>[1];
  const ctx = { signal: new AbortController().signal } as unknown as Ctx;

  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-admin-'));
    calls = [];
    let role: Role = 'ACTIVE';
    node = {
      get role() {
        return role;
      },
      epoch: 7,
      roles: { activeSinceMs: 1234 },
      lease: new FlockLease(path.join(dir, 'server.lease')),
      cfg: { slot: 'a' },
      handingOver: false,
      manager: { gate: { inFlight: 2 } },
      sandboxCount: () => 5,
      handOver: async (req) => {
        calls.push(`handOver ${JSON.stringify(req)}`);
        role = 'HANDING_OVER';
        return { token: 't', epoch: 7, listeners: [], inFlightFinished: 0, holdStartedAtMs: 0, oldPid: 1, oldVersion: 'x' };
      },
      finishHandover: (token) => {
        if (token !== 't') throw new FailedPreconditionError('finish_handover: no handover with that token is in progress');
        return { streamsRunning: 0 };
      },
      takeover: async (o) => {
        calls.push(`takeover ${o.holdMs} ${o.finishTimeoutMs} ${o.signal === ctx.signal}`);
        throw new FailedPreconditionError('takeover: this server is ACTIVE, not an idle STANDBY');
      },
      drain: async (o) => {
        calls.push(`drain ${o.deadlineMs} ${o.concurrency}`);
        return { sandboxes: [], durationMs: 0, deviceManagerStopped: true, deviceManagerError: '' };
      },
    };
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('maps every role', () => {
    expect((['STANDBY', 'ACTIVE', 'HANDING_OVER', 'RETIRING'] as Role[]).map(roleToPb)).toEqual([
      ServerRole.SERVER_ROLE_STANDBY,
      ServerRole.SERVER_ROLE_ACTIVE,
      ServerRole.SERVER_ROLE_HANDING_OVER,
      ServerRole.SERVER_ROLE_RETIRING,
    ]);
  });

  it('GetLeaseStatus and PrepareHandover report the node', async () => {
    const a = adminService(node);
    expect(await a.getLeaseStatus({}, ctx)).toMatchObject({ role: ServerRole.SERVER_ROLE_ACTIVE, epoch: 7, holderPid: 0, slot: 'a', sinceMs: 1234, networkMismatches: [] });
    const adopted = { ...node, lastAdoption: { networkMismatch: [{ sandboxId: 'sb-00000000000000a1', reason: 'its VM has no network' }] } };
    expect((await adminService(adopted).getLeaseStatus({}, ctx)).networkMismatches).toEqual(['sb-00000000000000a1: its VM has no network']);
    expect(await a.prepareHandover({ standbyVersion: 'y', standbyFeatures: Object.values(SERVER_FEATURES) }, ctx)).toEqual({ ok: true, reasons: [], sandboxes: 5, inFlight: 2, losses: [] });
  });

  it('PrepareHandover to a standby without the network features (a rollback to 0.2.0) says what stops and which sandboxes it affects, and still says ok', async () => {
    const ids = ['sb-00000000000000b2', 'sb-00000000000000a1'];
    const withNet = { ...node, manager: { gate: { inFlight: 0 }, directory: { sandboxIds: () => ids } } };
    const old = Object.values(SERVER_FEATURES).filter((f) => ![SERVER_FEATURES.network, SERVER_FEATURES.ingress, SERVER_FEATURES.egressProxy].includes(f as never));
    const r = await adminService(withNet).prepareHandover({ standbyVersion: '0.2.0', standbyFeatures: old }, ctx);
    expect(r.ok).toBe(true);
    const losses = r.losses ?? [];
    expect(losses).toHaveLength(2);
    expect(losses[0]).toMatch(/^the standby \(0\.2\.0\) lacks "server\.ingress\.v1": the ingress listener stops .*"server\.egress-proxy\.v1": the egress proxy and DNS resolver stop/);
    expect(losses[0]).toMatch(/kernel network of running sandboxes .* keeps working; 2 networked sandbox\(es\) affected: sb-00000000000000a1, sb-00000000000000b2$/);
    expect(losses[1]).toMatch(/lacks "server\.network\.v1": new sandboxes get no network/);
    // a standby with every feature loses nothing
    expect((await adminService(withNet).prepareHandover({ standbyVersion: '0.3.0', standbyFeatures: Object.values(SERVER_FEATURES) }, ctx)).losses).toEqual([]);
  });

  it('Handover: a relative fd_socket or a pid of 0 is INVALID_ARGUMENT and the node is not called', async () => {
    const a = adminService(node);
    const req = { standbyPid: 42, standbyVersion: 'y', fdSocket: '/run/x.sock', holdTimeoutMs: 0, finishTimeoutMs: 0, standbyFeatures: ['server.ingress.v1'] };
    await expect(a.handover({ ...req, fdSocket: 'x.sock' }, ctx)).rejects.toThrow(new InvalidArgumentError('fd_socket: must be an absolute path, got "x.sock"'));
    await expect(a.handover({ ...req, standbyPid: 0 }, ctx)).rejects.toMatchObject({ code: Status.INVALID_ARGUMENT, message: expect.stringMatching(/^standby_pid/) });
    expect(calls).toEqual([]);
    await a.handover(req, ctx);
    expect(calls).toEqual([`handOver ${JSON.stringify({ standbyPid: 42, fdSocket: '/run/x.sock', holdTimeoutMs: 0, finishTimeoutMs: 0, standbyFeatures: ['server.ingress.v1'] })}`]);
    expect(await a.prepareHandover({ standbyVersion: 'y', standbyFeatures: [] }, ctx)).toMatchObject({ ok: false, reasons: ['this server is HANDING_OVER, not ACTIVE'] });
  });

  it('FinishHandover with a wrong token is FAILED_PRECONDITION', async () => {
    await expect(adminService(node).finishHandover({ token: 'nope', newEpoch: 8 }, ctx)).rejects.toMatchObject({ code: Status.FAILED_PRECONDITION });
  });

  it('Takeover passes the call signal and 0 as "default"', async () => {
    await expect(adminService(node).takeover({ holdTimeoutMs: 0, finishTimeoutMs: 900 }, ctx)).rejects.toMatchObject({ code: Status.FAILED_PRECONDITION });
    expect(calls).toEqual(['takeover undefined 900 true']);
  });

  it('Drain: 0 means the named defaults; concurrency above 256 is INVALID_ARGUMENT', async () => {
    const a = adminService(node);
    await a.drain({ deadlineMs: 0, concurrency: 0 }, ctx);
    await a.drain({ deadlineMs: 5000, concurrency: 3 }, ctx);
    await expect(a.drain({ deadlineMs: 0, concurrency: 257 }, ctx)).rejects.toMatchObject({ code: Status.INVALID_ARGUMENT, message: 'concurrency: at most 256, got 257' });
    expect(calls).toEqual(['drain 20000 8', 'drain 5000 3']);
  });

  /** collect reads a DrainStream to its end. */
  async function collect(it: AsyncIterable<unknown>): Promise<unknown[]> {
    const out: unknown[] = [];
    for await (const e of it) out.push(e);
    return out;
  }

  it('DrainStream: started, each sandbox as it ends (in that order), then the report; the call signal and defaults passed on', async () => {
    let release!: () => void;
    const second = new Promise<void>((r) => (release = r));
    node.drain = async (o) => {
      calls.push(`drain ${o.deadlineMs} ${o.concurrency} ${o.signal === ctx.signal}`);
      o.onStart?.({ sandboxes: 2, deadlineMs: o.deadlineMs, concurrency: o.concurrency });
      o.onSandbox?.({ sandboxId: 'sb-b', outcome: 'preserved', resumeMethod: 'cold-start', error: '', ms: 12 });
      await second;
      o.onSandbox?.({ sandboxId: 'sb-a', outcome: 'failed', resumeMethod: '', error: 'step stop failed', ms: 40 });
      return { sandboxes: [], durationMs: 55, deviceManagerStopped: true, deviceManagerError: '' };
    };
    const it = adminService(node).drainStream({ deadlineMs: 0, concurrency: 0 }, ctx)[Symbol.asyncIterator]();
    // the events come as they happen, not at the end
    expect((await it.next()).value).toEqual({ event: { $case: 'started', value: { sandboxes: 2, deadlineMs: 20000, concurrency: 8 } } });
    expect((await it.next()).value).toMatchObject({ event: { $case: 'sandbox', value: { sandboxId: 'sb-b', outcome: 1, ms: 12 } } });
    const third = it.next();
    release();
    expect((await third).value).toMatchObject({ event: { $case: 'sandbox', value: { sandboxId: 'sb-a', outcome: 2, error: 'step stop failed' } } });
    expect((await it.next()).value).toMatchObject({ event: { $case: 'result', value: { durationMs: 55, deviceManagerStopped: true } } });
    expect((await it.next()).done).toBe(true);
    expect(calls).toEqual(['drain 20000 8 true']);
  });

  it('DrainStream: concurrency above 256 is INVALID_ARGUMENT and a node error (not ACTIVE) ends the stream with its code, nothing sent', async () => {
    await expect(collect(adminService(node).drainStream({ deadlineMs: 0, concurrency: 257 }, ctx))).rejects.toMatchObject({ code: Status.INVALID_ARGUMENT });
    expect(calls).toEqual([]);
    node.drain = async () => {
      throw new FailedPreconditionError('drain: this server is STANDBY, not ACTIVE');
    };
    await expect(collect(adminService(node).drainStream({ deadlineMs: 0, concurrency: 0 }, ctx))).rejects.toMatchObject({ code: Status.FAILED_PRECONDITION });
  });
});

/** The token RPCs (issue 10 §4): roles mapped both ways, an unspecified role refused before the store is touched, no store is FAILED_PRECONDITION. */
describe('AdminService token handlers', () => {
  it('maps roles, refuses TOKEN_ROLE_UNSPECIFIED, and says FAILED_PRECONDITION without a store', async () => {
    const made: unknown[] = [];
    const t = { id: 'tok_0000000000000001', name: 'n', role: 'read' as const, createdAtMs: 1, expiresAtMs: 0, revokedAtMs: 0 };
    const base = {
      role: 'ACTIVE' as Role,
      epoch: 1,
      roles: { activeSinceMs: 0 },
      lease: {} as FlockLease,
      cfg: { slot: '' },
      handingOver: false,
      manager: undefined,
      sandboxCount: () => 0,
    } as unknown as AdminPort;
    const svc = adminService({
      ...base,
      tokens: () => ({
        create: (r) => (made.push(r), { token: t, secret: 'sn_x' }),
        list: () => [t],
        revoke: () => ({ ...t, revokedAtMs: 5 }),
      }),
    } as AdminPort);
    const ctx = {} as never;
    const r = await svc.createToken({ name: 'n', role: TokenRole.TOKEN_ROLE_READ, ttlMs: 0 }, ctx);
    expect(made).toEqual([{ name: 'n', role: 'read', ttlMs: 0 }]);
    expect(r).toMatchObject({ secret: 'sn_x', token: { role: TokenRole.TOKEN_ROLE_READ } });
    await expect(svc.createToken({ name: 'n', role: TokenRole.TOKEN_ROLE_UNSPECIFIED, ttlMs: 0 }, ctx)).rejects.toBeInstanceOf(InvalidArgumentError);
    expect(made).toHaveLength(1);
    expect(((await svc.listTokens({}, ctx)).tokens ?? []).map((x) => x?.name)).toEqual(['n']);
    expect((await svc.revokeToken({ nameOrId: 'n' }, ctx)).token?.revokedAtMs).toBe(5);
    await expect(adminService(base).listTokens({}, ctx)).rejects.toMatchObject({ code: Status.FAILED_PRECONDITION });
  });
});
