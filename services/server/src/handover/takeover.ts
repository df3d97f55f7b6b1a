/**
 * The standby's side of a handover (`sandnode upgrade server`, or AdminService.Takeover on a
 * running standby): take the node over from the active server without refusing a connection.
 *
 *   peers answer? -> PrepareHandover (preflight) -> listen on the fd socket -> Handover on the
 *   active (it holds calls, sends its listening sockets, releases the lease, goes on accepting)
 *   -> receive the sockets -> take the lease (epoch+1) -> adopt, handlers ready and warmed
 *   up -> accept on those sockets (beside the old server for a moment) -> FinishHandover (the
 *   old server stops accepting and retires: GOAWAY)
 *
 * If the active server dies before or during PrepareHandover or Handover and its lease is free,
 * this server takes the node over as a failover would (with the sockets if they arrived, else
 * fresh ones): an upgrade never leaves the node without a server because the old one died.
 */
import path from 'node:path';
import {
  askVersion,
  createSandnodeChannel,
  createServiceClient,
  FailedPreconditionError,
  processState,
  restoreNormalPriority,
  SUITE_VERSION,
  UnavailableError,
  type Logger,
  type TakeoverResult,
} from '@sandnode/shared';
import { AdminServiceDefinition, type HandoverResponse } from '@sandnode/shared/proto/server/v1/admin';
import type { ServerConfig } from '../config';
import type { AdoptionReport } from '../core/adoption';
import { FlockLease } from '../store/flock-lease';
import { failpoint, failpointAsync } from './failpoints';
import { receiveFds } from './fd-pass';
import { sourceAddresses, type ListenerSource } from './listeners';
import { splitReceived, type HandoverFdMeta } from './named-listeners';
import { handoverHoldWindow } from '../metrics';

/** Default hold time of lifecycle calls during a handover, ms (HandoverRequest.hold_timeout_ms 0). */
export const DEFAULT_HOLD_MS = 2000;
/** Default time the old server waits for FinishHandover, ms (HandoverRequest.finish_timeout_ms 0). */
export const DEFAULT_FINISH_TIMEOUT_MS = 15_000;
/** How long the standby looks for the lease after the old server died mid-handover, ms. */
const DEAD_HOLDER_LEASE_WAIT_MS = 2000;
/** How long the standby waits for sockets that may still be on their way from a dead old server, ms. */
const DEAD_HOLDER_FD_WAIT_MS = 500;
/** How long each peer (vmm-supervisor, ublk-manager) gets to answer the preflight, ms. */
export const PEER_PREFLIGHT_TIMEOUT_MS = 2000;

/** What the takeover needs of the ServerNode it runs in. */
export interface StandbyNode {
  readonly cfg: ServerConfig;
  readonly log: Logger;
  readonly lease: FlockLease;
  /** the epoch after becomeActive */
  readonly epoch: number;
  /** freshListeners: the public listeners bound anew (failover without the old sockets). */
  freshListeners(): ListenerSource;
  /** becomeActive takes the role ACTIVE on the listeners of source with an epoch above atLeastEpoch. */
  becomeActive(source: ListenerSource, atLeastEpoch: number, o?: { peerWaitMs?: number; beforeServing?: () => Promise<void> }): Promise<AdoptionReport>;
  /** servedListeners: what this server serves once active, gRPC addresses then named listeners as "name kind host:port" (ingress, egress proxy, DNS); absent: the gRPC addresses of the source are reported */
  servedListeners?(): string[];
}

export interface TakeoverOptions {
  /** HandoverRequest.hold_timeout_ms (default DEFAULT_HOLD_MS) */
  holdMs?: number;
  /** HandoverRequest.finish_timeout_ms (default DEFAULT_FINISH_TIMEOUT_MS) */
  finishTimeoutMs?: number;
  /**
   * Aborts the takeover while it changes nothing (lease lookup, PrepareHandover); once
   * Handover was sent the takeover runs to its end, since the active server has let go.
   */
  signal?: AbortSignal;
  /** features this server offers (sent in PrepareHandover) */
  features: readonly string[];
}

/**
 * takeOver runs the standby's side (file header) and returns what it did (also printed as one
 * JSON line on stdout for `sandnode upgrade server`). Before it asks for anything it checks
 * that vmm-supervisor and ublk-manager answer (a server cannot become active without them). The
 * wait for them once the lease is taken is bounded by a third of the finish timeout: a standby
 * that cannot become active exits (freeing the lease) while the old server still waits for
 * FinishHandover, so that one takes the lease back and stays active. Errors: FAILED_PRECONDITION
 * (a peer does not answer, no active server holds the lease, or it refuses the handover),
 * UNAVAILABLE (the active server does not answer), and the errors of becoming active.
 */
export async function takeOver(node: StandbyNode, o: TakeoverOptions): Promise<TakeoverResult> {
  const { cfg, log, lease } = node;
  const holder = FlockLease.readHolder(lease.file);
  if (!holder) throw new FailedPreconditionError('no active server holds the lease: start normally instead');
  await checkPeers(cfg);
  o.signal?.throwIfAborted();
  // the server named in the lease died before the handover began (after `upgrade server` saw it
  // active): take the node over as a failover would, or the node is left with no server until an
  // operator runs `up` (attacker: 3 of 3 kills at that moment)
  if (!FlockLease.isHeld(lease.file)) {
    const r = await failoverIfGone(node, holder, 'the active server was gone before the handover began');
    if (r) return r;
    throw new FailedPreconditionError('no active server holds the lease: start normally instead');
  }
  const peerWaitMs = Math.min(cfg.peerStartTimeoutMs, Math.floor((o.finishTimeoutMs || DEFAULT_FINISH_TIMEOUT_MS) / 3));
  const ch = createSandnodeChannel(holder.admin);
  const admin = createServiceClient(AdminServiceDefinition, ch, { timeoutMs: cfg.handoverCallTimeoutMs, retryAttempts: 1 });
  let servingAtMs: number;
  try {
    let pre;
    try {
      pre = await admin.prepareHandover({ standbyVersion: SUITE_VERSION, standbyFeatures: [...o.features] }, { signal: o.signal });
    } catch (err) {
      // the active server died while it was asked (handover.at-prepare): nothing was held or sent yet
      if (o.signal?.aborted) throw err;
      const r = await failoverIfGone(node, holder, 'the active server died during PrepareHandover', err);
      if (r) return r;
      throw err;
    }
    if (!pre.ok) throw new FailedPreconditionError(`the active server refuses a handover: ${pre.reasons.join('; ')}`);
    const fdPath = path.join(cfg.runDir, `server-${cfg.slot || String(process.pid)}-fds.sock`);
    const rx = receiveFds<HandoverFdMeta>(fdPath, cfg.handoverFdTimeoutMs);
    await rx.ready;
    o.signal?.throwIfAborted();
    // booted niced beside the active server (upgradeServer): from here on this process is the one that must be fast
    if (restoreNormalPriority() === undefined) log.warn('could not raise this standby back to niceness 0: the handover runs niced');
    const holdStarted = Date.now();
    let res: HandoverResponse;
    try {
      res = await admin.handover({
        standbyPid: process.pid,
        standbyVersion: SUITE_VERSION,
        fdSocket: fdPath,
        holdTimeoutMs: o.holdMs ?? DEFAULT_HOLD_MS,
        finishTimeoutMs: o.finishTimeoutMs ?? DEFAULT_FINISH_TIMEOUT_MS,
        standbyFeatures: [...o.features],
      });
    } catch (err) {
      // The old server died during the handover: if the lease is free, take the node over as
      // a failover would, with its sockets when they arrived.
      const got = rx.message.catch(() => undefined);
      const r = await failoverIfGone(node, holder, 'the old server died during the handover', err, holdStarted, () => Promise.race([got, sleep(DEAD_HOLDER_FD_WAIT_MS).then(() => undefined)]));
      if (r) return r;
      throw err;
    }
    const msg = await rx.message;
    failpoint('takeover.after-fds');
    if (!(await lease.acquire(cfg.leaseAcquireTimeoutMs))) throw new UnavailableError(`the old server did not release the lease within ${cfg.leaseAcquireTimeoutMs} ms`);
    const listeners = received(msg);
    // Serving: this one accepts on the sockets, then FinishHandover makes the old server stop
    // accepting (it answers after that) and send GOAWAY, so its clients reconnect to this one.
    const report = await node.becomeActive(listeners, Number(res.epoch), {
      peerWaitMs,
      beforeServing: async () => {
        await failpointAsync('takeover.after-serve');
        try {
          await admin.finishHandover({ token: res.token, newEpoch: node.epoch });
        } catch (err) {
          // We hold the lease and can serve: the old server retires on its own (its watchdog
          // sees the lease taken) or is gone. Nothing to undo.
          log.warn({ err }, 'FinishHandover failed; the old server retires by itself');
        }
      },
    });
    servingAtMs = Date.now();
    return reportTakeover(node, res, report, listeners, servingAtMs);
  } finally {
    ch.close();
  }
}

/**
 * failoverIfGone takes the node over when the server named in the lease (holder) is dead and its
 * lease free (its process may still be exiting: looked for up to DEAD_HOLDER_LEASE_WAIT_MS), on
 * the sockets `sockets` gives (the old server's, when they arrived) or fresh ones, with an epoch
 * above the holder's. Returns the takeover's result, or undefined (nothing done) when the holder
 * lives or another process took the lease.
 */
async function failoverIfGone(
  node: StandbyNode,
  holder: { pid: number; epoch: number; version: string },
  why: string,
  err?: unknown,
  holdStartedAtMs = Date.now(),
  sockets?: () => Promise<{ fds: number[]; meta: HandoverFdMeta } | undefined>,
): Promise<TakeoverResult | undefined> {
  let free = false;
  for (const t0 = Date.now(); !free && Date.now() - t0 < DEAD_HOLDER_LEASE_WAIT_MS;) {
    free = !holderAlive(holder.pid) && node.lease.tryAcquire();
    if (!free) await sleep(50);
  }
  if (!free) return undefined;
  node.log.warn({ err, old_pid: holder.pid }, `${why}: taking over as failover`);
  const got = await sockets?.();
  const listeners = got ? received(got) : node.freshListeners();
  const report = await node.becomeActive(listeners, holder.epoch);
  const failover = { token: '', epoch: holder.epoch, listeners: [], inFlightFinished: 0, holdStartedAtMs, oldPid: holder.pid, oldVersion: holder.version };
  return reportTakeover(node, failover, report, listeners, 0);
}

function reportTakeover(node: StandbyNode, res: HandoverResponse, report: AdoptionReport, listeners: ListenerSource, servingAtMs: number): TakeoverResult {
  const result: TakeoverResult = {
    takeover: true,
    oldPid: res.oldPid,
    oldVersion: res.oldVersion,
    newPid: process.pid,
    newVersion: SUITE_VERSION,
    epoch: node.epoch,
    // from the moment lifecycle calls were held to the moment this server served them
    holdWindowMs: (servingAtMs || Date.now()) - Number(res.holdStartedAtMs),
    adopted: report.adopted.length,
    adoptionMs: report.durationMs,
    listeners: node.servedListeners?.() ?? sourceAddresses(listeners),
    poolMembersAdopted: report.poolMembers.length,
  };
  handoverHoldWindow.observe(result.holdWindowMs / 1000);
  process.stdout.write(`${JSON.stringify(result)}\n`);
  node.log.info(result, 'takeover finished');
  return result;
}

/** checkPeers: FAILED_PRECONDITION naming each peer that does not answer GetVersion within PEER_PREFLIGHT_TIMEOUT_MS. */
async function checkPeers(cfg: ServerConfig): Promise<void> {
  const peers = [
    { name: 'vmm-supervisor', address: cfg.vmmAddress },
    { name: 'ublk-manager', address: cfg.ublkAddress },
  ];
  const down: string[] = [];
  await Promise.all(
    peers.map((p) =>
      askVersion(p.address, { timeoutMs: PEER_PREFLIGHT_TIMEOUT_MS, retryAttempts: 1 }).catch((err: unknown) => {
        down.push(`${p.name} does not answer at ${p.address} (${(err as Error).message.slice(0, 120)})`);
      }),
    ),
  );
  if (down.length) throw new FailedPreconditionError(`no handover: ${down.join('; ')}. Start it (sandnode up) and upgrade again; the old server stays active`);
}

/** holderAlive says whether a process with that pid exists (not a zombie). */
function holderAlive(pid: number): boolean {
  const st = processState(pid);
  return st !== undefined && st !== 'Z';
}

/** received: the listening sockets that came from the old server, gRPC and named (becomeActive accepts on them once it serves). */
function received(msg: { meta: HandoverFdMeta; fds: number[] }): ListenerSource {
  const { grpc, named } = splitReceived(msg.meta, msg.fds);
  return { received: grpc, named };
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
