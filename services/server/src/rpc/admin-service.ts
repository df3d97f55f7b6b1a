/**
 * AdminService handlers (admin socket, every role): validate -> call the node's handover
 * logic (handover/server-node.ts, takeover.ts) -> convert. Errors are domain errors mapped to
 * gRPC codes by the shared middleware: INVALID_ARGUMENT (bad field, nothing changed),
 * FAILED_PRECONDITION (wrong role, no such handover).
 */
import path from 'node:path';
import { FailedPreconditionError, InvalidArgumentError, SUITE_VERSION, type SandnodeCallContext, type TakeoverResult } from '@sandnode/shared';
import { ServerRole, TokenRole, type AdminServiceImplementation, type ApiToken, type DrainStreamResponse, type HandoverResponse } from '@sandnode/shared/proto/server/v1/admin';
import type { ApiTokenInfo, SqliteTokenStore } from '../store/sqlite-token-store';
import { DEFAULT_DRAIN_CONCURRENCY, DEFAULT_DRAIN_DEADLINE_MS } from '../config';
import type { DrainDeps, DrainReport } from '../core/drain';
import { drainedToPb, drainReportToPb } from './convert';
import { handoverLosses } from './handover-losses';
import type { Role } from '../handover/roles';
import { FlockLease } from '../store/flock-lease';
import { failpoint } from '../handover/failpoints';
import { getPoolStatus, setPool, type PoolAdminPort } from './pool-service';

/** Most sandboxes a Drain may stop at once. */
export const MAX_DRAIN_CONCURRENCY = 256;

/** checkDrainConcurrency refuses a Drain/DrainStream concurrency above MAX_DRAIN_CONCURRENCY (INVALID_ARGUMENT, nothing done). */
function checkDrainConcurrency(n: number): void {
  if (n > MAX_DRAIN_CONCURRENCY) throw new InvalidArgumentError(`concurrency: at most ${MAX_DRAIN_CONCURRENCY}, got ${n}`);
}

/** What the handlers need of the node (ServerNode). */
export interface AdminPort {
  readonly role: Role;
  readonly epoch: number;
  readonly roles: { readonly activeSinceMs: number };
  readonly lease: FlockLease;
  readonly cfg: { slot: string };
  readonly handingOver: boolean;
  readonly manager: { gate: { inFlight: number }; directory?: { sandboxIds(): string[] } } | undefined;
  sandboxCount(): number;
  /** The last adoption's report (ServerNode.lastAdoption); its network mismatches go in GetLeaseStatus. */
  readonly lastAdoption?: { networkMismatch?: { sandboxId: string; reason: string }[] } | undefined;
  /** The records.db rows this server cannot serve (ACTIVE), oldest first; none when absent. */
  quarantinedRecords?(): { key: string; reason: string; quarantinedAtMs: number }[];
  handOver(req: { standbyPid: number; fdSocket: string; holdTimeoutMs: number; finishTimeoutMs: number; standbyFeatures?: readonly string[] }): Promise<HandoverResponse>;
  finishHandover(token: string): { streamsRunning: number };
  takeover(opts: { holdMs?: number; finishTimeoutMs?: number; signal?: AbortSignal }): Promise<TakeoverResult>;
  drain(o: { deadlineMs: number; concurrency: number; signal?: AbortSignal } & Pick<DrainDeps, 'onStart' | 'onSandbox'>): Promise<DrainReport>;
  /** The warm pools of the active server (undefined unless ACTIVE with pools). */
  poolAdmin?(): PoolAdminPort | undefined;
  /** The API tokens (ACTIVE only; FailedPreconditionError otherwise). */
  tokens?(): Pick<SqliteTokenStore, 'create' | 'list' | 'revoke'>;
}

/** tokenToPb converts a token (no secret). */
function tokenToPb(t: ApiTokenInfo): ApiToken {
  return {
    id: t.id,
    name: t.name,
    role: t.role === 'admin' ? TokenRole.TOKEN_ROLE_ADMIN : TokenRole.TOKEN_ROLE_READ,
    createdAtMs: t.createdAtMs,
    expiresAtMs: t.expiresAtMs,
    revokedAtMs: t.revokedAtMs,
  };
}

function tokensOf(node: AdminPort): Pick<SqliteTokenStore, 'create' | 'list' | 'revoke'> {
  if (!node.tokens) throw new FailedPreconditionError('this server keeps no tokens');
  return node.tokens();
}

/** roleToPb maps a role to its proto enum. */
export function roleToPb(r: Role): ServerRole {
  switch (r) {
    case 'ACTIVE':
      return ServerRole.SERVER_ROLE_ACTIVE;
    case 'STANDBY':
      return ServerRole.SERVER_ROLE_STANDBY;
    case 'HANDING_OVER':
      return ServerRole.SERVER_ROLE_HANDING_OVER;
    case 'RETIRING':
      return ServerRole.SERVER_ROLE_RETIRING;
  }
}

/** adminService serves AdminService for node. */
export function adminService(node: AdminPort): AdminServiceImplementation<SandnodeCallContext> {
  return {
    async getLeaseStatus() {
      const h = FlockLease.readHolder(node.lease.file);
      return {
        role: roleToPb(node.role),
        epoch: node.epoch || h?.epoch || 0,
        holderPid: FlockLease.isHeld(node.lease.file) || node.lease.held ? (h?.pid ?? 0) : 0,
        slot: node.cfg.slot,
        version: SUITE_VERSION,
        sinceMs: node.roles.activeSinceMs,
        quarantinedRecords: node.quarantinedRecords?.() ?? [],
        networkMismatches: (node.lastAdoption?.networkMismatch ?? []).map((m) => `${m.sandboxId}: ${m.reason}`),
      };
    },
    async prepareHandover(req) {
      failpoint('handover.at-prepare');
      const reasons: string[] = [];
      if (node.role !== 'ACTIVE') reasons.push(`this server is ${node.role}, not ACTIVE`);
      if (node.handingOver) reasons.push('a handover is already in progress');
      // what the standby would not keep up (a rollback): said, not refused
      const losses = handoverLosses(req.standbyVersion, req.standbyFeatures, node.manager?.directory?.sandboxIds() ?? []);
      return { ok: reasons.length === 0, reasons, sandboxes: node.sandboxCount(), inFlight: node.manager?.gate.inFlight ?? 0, losses };
    },
    async handover(req) {
      if (!Number.isInteger(req.standbyPid) || req.standbyPid <= 0) throw new InvalidArgumentError(`standby_pid: must be a pid above 0, got ${req.standbyPid}`);
      if (!path.isAbsolute(req.fdSocket)) throw new InvalidArgumentError(`fd_socket: must be an absolute path, got ${JSON.stringify(req.fdSocket)}`);
      return node.handOver({ standbyPid: req.standbyPid, fdSocket: req.fdSocket, holdTimeoutMs: req.holdTimeoutMs, finishTimeoutMs: req.finishTimeoutMs, standbyFeatures: req.standbyFeatures });
    },
    async finishHandover(req) {
      return node.finishHandover(req.token);
    },
    async takeover(req, ctx) {
      const r = await node.takeover({ holdMs: req.holdTimeoutMs || undefined, finishTimeoutMs: req.finishTimeoutMs || undefined, signal: ctx.signal });
      return {
        oldPid: r.oldPid,
        oldVersion: r.oldVersion,
        newPid: r.newPid,
        newVersion: r.newVersion,
        epoch: r.epoch,
        holdWindowMs: r.holdWindowMs,
        adopted: r.adopted,
        adoptionMs: r.adoptionMs,
        listeners: r.listeners,
        poolMembersAdopted: r.poolMembersAdopted ?? 0,
      };
    },
    async drain(req, ctx) {
      checkDrainConcurrency(req.concurrency);
      // 0 means the shared defaults (DEFAULT_DRAIN_DEADLINE_MS / DEFAULT_DRAIN_CONCURRENCY)
      return drainReportToPb(await node.drain({ deadlineMs: req.deadlineMs || DEFAULT_DRAIN_DEADLINE_MS, concurrency: req.concurrency || DEFAULT_DRAIN_CONCURRENCY, signal: ctx.signal }));
    },
    async *drainStream(req, ctx) {
      checkDrainConcurrency(req.concurrency);
      // the drain's callbacks fill a queue the stream empties; the last event is the report
      const queue: DrainStreamResponse[] = [];
      let wake: (() => void) | undefined;
      const push = (e: DrainStreamResponse) => {
        queue.push(e);
        wake?.();
      };
      let ended: { err: unknown } | undefined;
      void node
        .drain({
          deadlineMs: req.deadlineMs || DEFAULT_DRAIN_DEADLINE_MS,
          concurrency: req.concurrency || DEFAULT_DRAIN_CONCURRENCY,
          signal: ctx.signal,
          onStart: (st) => push({ event: { $case: 'started', value: st } }),
          onSandbox: (sb) => push({ event: { $case: 'sandbox', value: drainedToPb(sb) } }),
        })
        .then(
          (r) => push({ event: { $case: 'result', value: drainReportToPb(r) } }),
          (err: unknown) => (ended = { err }),
        )
        .finally(() => {
          ended ??= { err: undefined };
          wake?.();
        });
      for (;;) {
        const next = queue.shift();
        if (next) {
          yield next;
          continue;
        }
        if (ended) {
          if (ended.err !== undefined) throw ended.err;
          return;
        }
        await new Promise<void>((r) => (wake = r));
        wake = undefined;
      }
    },
    async createToken(req) {
      const role = req.role === TokenRole.TOKEN_ROLE_ADMIN ? 'admin' : req.role === TokenRole.TOKEN_ROLE_READ ? 'read' : undefined;
      if (!role) throw new InvalidArgumentError('role: must be TOKEN_ROLE_ADMIN or TOKEN_ROLE_READ; nothing was made');
      const r = tokensOf(node).create({ name: req.name, role, ttlMs: req.ttlMs });
      return { token: tokenToPb(r.token), secret: r.secret };
    },
    async listTokens() {
      return { tokens: tokensOf(node).list().map(tokenToPb) };
    },
    async revokeToken(req) {
      return { token: tokenToPb(tokensOf(node).revoke(req.nameOrId)) };
    },
    async setPool(req) {
      return setPool(node.poolAdmin?.(), req);
    },
    async getPoolStatus() {
      return getPoolStatus(node.poolAdmin?.());
    },
  };
}
