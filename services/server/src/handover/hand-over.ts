/**
 * The old (active) server's side of AdminService.Handover:
 *
 *   ACTIVE -> HANDING_OVER: hold new lifecycle calls (gate), wait for running ones, flush the
 *   records, send the listening sockets to the standby's fd socket, free the /metrics port,
 *   release the lease, answer with a token; this server goes on accepting and serving (reads;
 *   lifecycle calls are held) while the standby adopts. Then a watchdog waits for
 *   FinishHandover, which the standby sends once it serves (it accepts on the same sockets
 *   already, so for a moment both processes accept and each serves what it accepted):
 *     FinishHandover(token)                      -> stop accepting at once (new connections go
 *                                                   to the standby alone), RETIRING (GOAWAY:
 *                                                   clients reconnect into the standby; streams
 *                                                   finish, exit)
 *     standby dead or no finish, lease free      -> lease retaken, epoch+1, fences raised, ACTIVE
 *                                                   (ACTIVE also when a peer does not answer;
 *                                                   exit when a peer knows a higher epoch)
 *     no finish but the standby holds the lease  -> RETIRING
 *   A failure before the lease was released leaves this server ACTIVE (FAILED_PRECONDITION).
 */
import { randomBytes } from 'node:crypto';
import { FailedPreconditionError, isCode, processStartTicks, Status, SUITE_VERSION, type Logger } from '@sandnode/shared';
import type { HandoverResponse } from '@sandnode/shared/proto/server/v1/admin';
import type { LifecycleGate } from '../core/gate';
import type { FlockLease } from '../store/flock-lease';
import { failpoint } from './failpoints';
import { sendFds } from './fd-pass';
import type { OwnedListener } from './listeners';
import { namedToSend, type HandoverFdMeta, type OwnedNamedListener } from './named-listeners';
import type { Roles } from './roles';
import { DEFAULT_FINISH_TIMEOUT_MS, DEFAULT_HOLD_MS } from './takeover';

/** How often the watchdog looks at the standby, ms. */
const WATCHDOG_MS = 50;

/** What the handover needs of the ServerNode it runs in. */
export interface OldServer {
  readonly roles: Roles;
  readonly lease: FlockLease;
  readonly log: Logger;
  readonly epoch: number;
  /** running Exec streams */
  readonly streams: number;
  /** the active server's gate, records and listeners; undefined unless it was activated */
  handoverParts(): { gate: LifecycleGate; checkpoint: () => void; listeners: OwnedListener[]; named: OwnedNamedListener[] } | undefined;
  /** stopServing: stop the reaper (lifecycle calls are about to be held) */
  pauseActive(): void;
  /** releaseMetrics frees the /metrics port (it goes to the next server with the lease) */
  releaseMetrics(): void;
  /** stopAccepting: accept no more connections (they wait in the backlog for the next server) */
  stopAccepting(): void;
  /** resumeActive: ACTIVE again (gate open, reaper, metrics); newEpoch after a retaken lease */
  resumeActive(o?: { newEpoch?: boolean }): void;
  /** retakeEpoch (holding the lease again): epoch+1, lease described, fences raised */
  retakeEpoch(): Promise<void>;
  /** beginRetire: RETIRING, then GOAWAY and exit */
  beginRetire(): void;
  exit(code: number): void;
}

interface Running {
  token: string;
  standbyPid: number;
  standbyTicks: number | undefined;
  watchdog: NodeJS.Timeout;
  deadline: number;
}

export class OldSideHandover {
  private running: Running | undefined;

  constructor(private readonly node: OldServer) {}

  /** Whether a handover waits for its FinishHandover. */
  get inProgress(): boolean {
    return this.running !== undefined;
  }

  /**
   * handOver runs the steps of the file header up to the answer. holdTimeoutMs /
   * finishTimeoutMs 0 mean DEFAULT_HOLD_MS / DEFAULT_FINISH_TIMEOUT_MS. Errors:
   * FAILED_PRECONDITION (not ACTIVE, a handover runs, or it failed before the lease was
   * released: this server stays ACTIVE).
   */
  async handOver(req: { standbyPid: number; fdSocket: string; holdTimeoutMs: number; finishTimeoutMs: number; standbyFeatures?: readonly string[] }): Promise<HandoverResponse> {
    const { node } = this;
    const parts = node.handoverParts();
    if (!node.roles.is('ACTIVE') || !parts) throw new FailedPreconditionError(`handover: this server is ${node.roles.role}, not ACTIVE`);
    if (this.running) throw new FailedPreconditionError('handover: another handover is in progress');
    const log = node.log.child({ handover_to: req.standbyPid });
    node.roles.to('HANDING_OVER');
    node.pauseActive();
    const holdStartedAtMs = Date.now();
    parts.gate.holdMs = req.holdTimeoutMs || DEFAULT_HOLD_MS;
    const inFlight = parts.gate.inFlight;
    try {
      await parts.gate.close();
      failpoint('handover.after-hold');
      parts.checkpoint();
      // named listeners (ingress, egress proxy, DNS) only to a standby that knows them (named-listeners.ts)
      const named = namedToSend(parts.named, req.standbyFeatures ?? []);
      const meta: HandoverFdMeta = { listeners: parts.listeners.map((l) => l.address), named: named.map((l) => ({ name: l.name, kind: l.kind, address: l.address })) };
      await sendFds(req.fdSocket, meta, [...parts.listeners.map((l) => l.fd), ...named.map((l) => l.fd)]);
      if (named.length < parts.named.length) log.warn({ kept_here: parts.named.length - named.length }, 'the standby does not know some named listeners: they close with this server');
      failpoint('handover.after-send');
    } catch (err) {
      log.error({ err }, 'handover failed before the lease was released: staying active');
      node.resumeActive();
      throw new FailedPreconditionError(`handover aborted, the old server stays active: ${(err as Error).message}`);
    }
    const epoch = node.epoch;
    node.releaseMetrics();
    node.lease.release();
    failpoint('handover.after-release');
    const token = randomBytes(12).toString('hex');
    const watchdog = setInterval(() => this.watch(log), WATCHDOG_MS);
    const finishMs = req.finishTimeoutMs || DEFAULT_FINISH_TIMEOUT_MS;
    this.running = { token, standbyPid: req.standbyPid, standbyTicks: processStartTicks(req.standbyPid), watchdog, deadline: Date.now() + finishMs };
    log.info({ in_flight: inFlight, epoch }, 'lease released to the standby');
    return {
      token,
      epoch,
      listeners: parts.listeners.map((l) => ({ address: l.address })),
      inFlightFinished: inFlight,
      holdStartedAtMs,
      oldPid: process.pid,
      oldVersion: SUITE_VERSION,
    };
  }

  /**
   * finish (AdminService.FinishHandover): the new server serves; retire. Returns how many Exec
   * streams still run here. Errors: FAILED_PRECONDITION (no handover with that token).
   */
  finish(token: string): { streamsRunning: number } {
    if (!this.running || token !== this.running.token) throw new FailedPreconditionError('finish_handover: no handover with that token is in progress');
    this.stop();
    // before the answer: the standby accepts already (it asks only once it does); from here on only it does
    this.node.stopAccepting();
    const streams = this.node.streams;
    this.node.beginRetire();
    return { streamsRunning: streams };
  }

  /** stop ends the watchdog (server stop). */
  stop(): void {
    if (this.running) clearInterval(this.running.watchdog);
    this.running = undefined;
  }

  /** watch: the standby died or did not finish in time -> take the lease back, or retire if it holds it. */
  private watch(log: Logger): void {
    const h = this.running;
    if (!h) return;
    const standbyAlive = h.standbyTicks !== undefined && processStartTicks(h.standbyPid) === h.standbyTicks;
    if (standbyAlive && Date.now() < h.deadline) return;
    this.stop();
    const { node } = this;
    if (!node.lease.tryAcquire()) {
      log.warn('the standby holds the lease but did not finish: retiring');
      node.beginRetire();
      return;
    }
    log.error({ standby_alive: standbyAlive }, 'the standby did not finish the handover: taking the lease back');
    // raise the fences to the new epoch before lifecycle calls run again
    const before = node.epoch;
    node.retakeEpoch().then(
      () => node.resumeActive({ newEpoch: true }),
      (err: unknown) => {
        if (node.epoch === before || higherEpochExists(err)) {
          log.fatal({ err }, 'could not take the epoch back (or a peer knows a higher one: another server is active): exiting');
          node.exit(1);
          return;
        }
        // A peer that does not answer (the vmm-supervisor killed during the upgrade): stay
        // active all the same, or the node has no server at all. No server of a higher epoch
        // runs (the lease is ours; the standby is gone), and every mutating call carries the
        // epoch, so the peer's fence rises with the first one once it is back.
        log.error({ err }, 'could not raise the epoch fences after taking the lease back (a peer does not answer): active again; its calls fail until it is back');
        node.resumeActive({ newEpoch: true });
      },
    );
  }
}

/** higherEpochExists: err (or one of its causes) is ABORTED, a peer's fence saying a server with a higher epoch exists. */
export function higherEpochExists(err: unknown): boolean {
  for (let e: unknown = err; e instanceof Error; e = e.cause) if (isCode(e, Status.ABORTED)) return true;
  return false;
}
