/**
 * ServerNode: one server process and its role on the node (ARCHITECTURE.md section 4). The
 * role table and its diagram are in roles.ts; the standby's side of a handover is takeover.ts,
 * the old server's side hand-over.ts. This file owns the lease, the sockets and the order of
 * the steps: start (lease free -> ACTIVE: epoch+1, fences, adopt, sweep, serve; held ->
 * STANDBY until the lease is freed), retire, stop. What an active server runs (peers,
 * SandboxManager, public services) is built by the wiring main.ts passes in; the AdminService
 * handlers (rpc/admin-service.ts) call the public methods here.
 */
import { mkdirSync, rmSync, statSync } from 'node:fs';
import type net from 'node:net';
import path from 'node:path';
import {
  adminSocketName,
  buildCommit,
  createServiceServer,
  MetricsEndpoint,
  FailedPreconditionError,
  SERVER_FEATURES,
  SUITE_VERSION,
  unixAddress,
  type Logger,
  type RawProtocol,
  type ServiceServer,
  type TakeoverResult,
  type TokenIdentity,
  UnauthenticatedError,
  resolveNodeId,
} from '@sandnode/shared';
import { AdminServiceDefinition, type AdminServiceImplementation, type HandoverResponse } from '@sandnode/shared/proto/server/v1/admin';
import type { ServerConfig } from '../config';
import { adoptAll, checkPodds, type AdoptionReport } from '../core/adoption';
import { drainNode, type DrainDeps, type DrainReport } from '../core/drain';
import { sweepOrphans } from '../core/orphan-sweep';
import type { SandboxManager } from '../core/sandbox-manager';
import { ALL_TEMPLATES } from '../core/pool';
import { isPoolMember } from '../core/pool-config';
import { isLive } from '../core/transitions';
import type { PoolAdminPort } from '../rpc/pool-service';
import type { DevicePeer } from '../peers/device-peer';
import type { PoddPeers } from '../peers/podd-peer';
import type { VmPeer } from '../peers/vm-peer';
import { FlockLease } from '../store/flock-lease';
import { SqliteRecordStore } from '../store/sqlite-record-store';
import { failpoint } from './failpoints';
import { OldSideHandover, type OldServer } from './hand-over';
import { adoption, observeDrain, setSandboxSource } from '../metrics';
import { ADMIN_SOCKET_CHECK_MS, bindAdminSocket, checkAdminSocket, type AdminSocketBinding } from './admin-socket';
import { openListeners, type ListenerSource, type OwnedListener } from './listeners';
import { warmUp } from './warm-up';
import { namedListenerLosses, namedText, openNamedListeners, type NamedListenerSpec, type NamedServe, type OwnedNamedListener } from './named-listeners';
import { ADMIN_POLICY, publicPolicy, shareSocket, tcpCredentials } from './api-access';
import { Roles, type Role } from './roles';
import { removeStaleAdminSockets, SlotLock, slotLockFile } from './slot-lock';
import { takeOver, type StandbyNode } from './takeover';

export { DEFAULT_FINISH_TIMEOUT_MS, DEFAULT_HOLD_MS } from './takeover';

/** The features this server lists in GetVersion: every string of the shared registry. */
export const SERVER_FEATURE_LIST: readonly string[] = Object.values(SERVER_FEATURES);

/** How often a standby looks at the lease, ms. */
const STANDBY_POLL_MS = 500;
/** How long after becoming active the server asks the adopted sandboxes' podds for Health (core/adoption.ts checkPodds), ms: after the switch's reconnects. */
const POST_SWITCH_PODD_CHECK_DELAY_MS = 500;

/** What an active server runs, built by main.ts for each activation. */
export interface ActiveParts {
  manager: SandboxManager;
  vms: VmPeer;
  devices: DevicePeer;
  /** register adds the public services (SandboxService, TemplateService) to server. */
  register(server: ServiceServer): void;
  /** the warm pools' admin side (AdminService.SetPool/GetPoolStatus); absent: no pools */
  poolAdmin?: PoolAdminPort;
}

/** The construction main.ts owns. */
export interface NodeWiring {
  /** the podd clients (one per sandbox socket), kept across activations */
  podd: PoddPeers;
  /** the bulk channel (rpc/bulk-transfer.ts) served on the public unix sockets beside gRPC; none: gRPC only */
  bulk?: { raw: RawProtocol };
  /** activate builds the active parts on store; epoch() is the node's current epoch. */
  activate(a: { store: SqliteRecordStore; epoch: () => number; log: Logger; streams: { streams: number } }): ActiveParts;
  /** onActive runs each time this server has become ACTIVE (main.ts: the settings file). */
  onActive?(): void;
  /**
   * named: the listeners beside the gRPC ones (ingress, egress proxy, DNS: named-listeners.ts)
   * this server wants (from its config), and what serves each (called after activate, before
   * the socket accepts). Handed over like the gRPC listeners.
   */
  named?: {
    wanted(): NamedListenerSpec[] | Promise<NamedListenerSpec[]>;
    serve: NamedServe;
    /**
     * late: listeners that could not be had at activation and can be now (the egress proxy and
     * resolver once the supervisor has a network), asked by the reaper while ACTIVE; [] when none
     */
    late?(): Promise<NamedListenerSpec[]>;
  };
}

export class ServerNode implements StandbyNode, OldServer {
  readonly roles = new Roles();
  epoch = 0;
  readonly lease: FlockLease;
  readonly adminAddress: string;
  private store: SqliteRecordStore | undefined;
  private active: ActiveParts | undefined;
  private publicServer: ServiceServer | undefined;
  private adminServer: ServiceServer | undefined;
  /** the admin socket we bound, and its inode (to remove the path only while it is ours) */
  private adminListener: AdminSocketBinding | undefined;
  /** the admin socket path check (admin-socket.ts); undefined once closed */
  private adminWatch: NodeJS.Timeout | undefined;
  /** the slot's lock (slot-lock.ts), held from startAdmin until retiring or stop; undefined without a slot */
  private readonly slotLock: SlotLock | undefined;
  /** the public listeners this server accepts on */
  private listeners: OwnedListener[] = [];
  /** the named listeners (ingress, egress proxy, DNS) this server accepts or receives on */
  private named: OwnedNamedListener[] = [];
  private reaper: NodeJS.Timeout | undefined;
  private standbyPoll: NodeJS.Timeout | undefined;
  private readonly oldSide = new OldSideHandover(this);
  /** Prometheus /metrics (when metricsListen is set); the port moves to the next server at handover. */
  private readonly metrics: MetricsEndpoint;
  /** A takeover runs in this standby. */
  private takingOver = false;
  /** Running Exec streams (a retiring server relays them to completion). */
  streams = 0;
  lastAdoption: AdoptionReport | undefined;
  /** The node's stable id (GetVersion node_id; shared node-id.ts), the same in every component. */
  readonly nodeId: string;

  constructor(
    readonly cfg: ServerConfig,
    readonly log: Logger,
    private readonly wiring: NodeWiring,
    readonly exit: (code: number) => void = (c) => process.exit(c),
  ) {
    mkdirSync(cfg.stateDir, { recursive: true });
    mkdirSync(path.join(cfg.runDir, 'sandboxes'), { recursive: true });
    this.nodeId = resolveNodeId(cfg.stateDir);
    this.lease = new FlockLease(path.join(cfg.stateDir, 'server.lease'));
    this.adminAddress = unixAddress(path.join(cfg.runDir, adminSocketName(cfg.slot || String(process.pid))));
    this.metrics = new MetricsEndpoint({ listen: cfg.metricsListen, component: 'server', runDir: cfg.runDir, log });
    this.slotLock = cfg.slot ? new SlotLock(slotLockFile(cfg.runDir, cfg.slot)) : undefined;
  }

  get role(): Role {
    return this.roles.role;
  }

  /** The GetVersion answer of this server. */
  info() {
    return { component: 'server', version: SUITE_VERSION, commit: buildCommit(), features: [...SERVER_FEATURE_LIST], nodeId: this.nodeId };
  }

  /** The manager of the active server (undefined unless this server was ever active). */
  get manager(): SandboxManager | undefined {
    return this.active?.manager;
  }

  /** How many sandboxes a standby would adopt (PrepareHandover): the live ones (RUNNING or PAUSED) of the records; warm-pool members are no user's and not counted (newcomer: a DRAINED one was counted, and adoption has nothing to adopt of it). */
  sandboxCount(): number {
    return this.store?.list().filter((r) => !isPoolMember(r) && isLive(r)).length ?? 0;
  }

  /** poolAdmin: the warm pools of this server while ACTIVE (AdminService.SetPool/GetPoolStatus). */
  poolAdmin(): PoolAdminPort | undefined {
    return this.roles.is('ACTIVE') ? this.active?.poolAdmin : undefined;
  }

  /** quarantinedRecords: the rows of records.db set aside as unservable, oldest first (none before this server opened the records). */
  quarantinedRecords(): { key: string; reason: string; quarantinedAtMs: number }[] {
    return this.store?.quarantinedRows() ?? [];
  }

  /** tokens: the API tokens in records.db (sqlite-token-store.ts). Errors: FAILED_PRECONDITION unless ACTIVE. */
  tokens() {
    if (!this.roles.is('ACTIVE') || !this.store) throw new FailedPreconditionError(`tokens are kept by the ACTIVE server; this one is ${this.role}`);
    return this.store.tokens();
  }

  /** Whether a handover runs on this server. */
  get handingOver(): boolean {
    return this.oldSide.inProgress;
  }

  /**
   * startAdmin serves admin (AdminService) on the admin socket (every role). The socket is
   * bound like the public ones (listeners.ts: temporary name + hard link), not by grpc-js: a
   * retiring server of the same slot may still run (relaying an Exec stream) when the next
   * server of that slot starts, and closing a socket grpc-js bound unlinks its path, which
   * would remove the new server's admin socket (the one the lease file names).
   *
   * Before it binds, a server of a slot takes the slot's lock (slot-lock.ts): a second server
   * of the same slot gets SlotBusyError and leaves the socket alone. Then the admin sockets of
   * servers that are gone are removed. Afterwards the path is checked every
   * ADMIN_SOCKET_CHECK_MS and bound again if it was removed (admin-socket.ts). Errors:
   * SlotBusyError (main.ts: exit EXIT_SLOT_BUSY).
   */
  async startAdmin(admin: AdminServiceImplementation): Promise<void> {
    if (this.slotLock) await this.slotLock.acquire(this.cfg.slot);
    await removeStaleAdminSockets(this.cfg.runDir, path.basename(this.adminPath), this.log);
    this.adminServer = createServiceServer({ info: this.info(), log: this.log.child({ api: 'admin' }), auth: ADMIN_POLICY, epoch: () => this.epoch });
    this.adminServer.add(AdminServiceDefinition, admin);
    // the handler is attached before the socket accepts anything (listeners.ts)
    const serve = (server: net.Server) => this.adminServer?.serveListener(server);
    this.adminListener = await bindAdminSocket(this.adminAddress, serve);
    this.watchAdminSocket(serve);
  }

  /** watchAdminSocket binds the admin socket anew when its path is removed or replaced by a dead one (admin-socket.ts), every ADMIN_SOCKET_CHECK_MS until closeAll. */
  private watchAdminSocket(serve: (server: net.Server) => void): void {
    let checking = false;
    this.adminWatch = setInterval(() => {
      const bound = this.adminListener;
      if (checking || !bound) return;
      checking = true;
      checkAdminSocket(bound, serve)
        .then((r) => {
          if (this.adminWatch === undefined) {
            // closed meanwhile: a socket bound now is not to stay
            if (r.state === 'rebound') r.bound.listener.server.close();
            return;
          }
          this.adminListener = r.bound;
          if (r.state === 'rebound') this.log.warn({ admin: this.adminAddress }, 'the admin socket path was removed or replaced by a dead socket: bound it again');
          if (r.state === 'foreign') this.log.error({ admin: this.adminAddress }, 'another live socket is at this server admin socket path: left alone; this server cannot be found by the CLI');
        })
        .catch((err: unknown) => this.log.error({ err, admin: this.adminAddress }, 'could not bind the admin socket again'))
        .finally(() => (checking = false));
    }, ADMIN_SOCKET_CHECK_MS);
    this.adminWatch.unref();
  }

  private get adminPath(): string {
    return this.adminAddress.slice('unix://'.length);
  }

  /** start (after startAdmin): ACTIVE if the lease is free, else STANDBY that takes over if the active dies. */
  async start(): Promise<void> {
    if (this.lease.tryAcquire()) {
      await this.becomeActive(this.freshListeners(), 0);
      return;
    }
    this.log.info({ holder: FlockLease.readHolder(this.lease.file) }, 'lease held by another server: standby');
    this.watchLease();
  }

  /** watchLease: a standby takes over (failover) when the lease becomes free. */
  private watchLease(): void {
    clearInterval(this.standbyPoll);
    this.standbyPoll = setInterval(() => {
      if (!this.roles.is('STANDBY') || this.takingOver || !this.lease.tryAcquire()) return;
      clearInterval(this.standbyPoll);
      this.log.warn('the active server is gone: taking over');
      this.becomeActive(this.freshListeners(), 0).catch((err: unknown) => {
        this.log.fatal({ err }, 'failover failed');
        this.exit(1);
      });
    }, STANDBY_POLL_MS);
  }

  /**
   * takeover (STANDBY only, once at a time): take the node over from the active server by
   * handover (takeover.ts). On failure this server stays STANDBY and watches the lease again.
   * Errors: FAILED_PRECONDITION (not an idle STANDBY, no active server, or it refuses).
   */
  async takeover(opts: { holdMs?: number; finishTimeoutMs?: number; signal?: AbortSignal } = {}): Promise<TakeoverResult> {
    if (!this.roles.is('STANDBY') || this.takingOver) throw new FailedPreconditionError(`takeover: this server is ${this.role}, not an idle STANDBY`);
    this.takingOver = true;
    clearInterval(this.standbyPoll);
    try {
      return await takeOver(this, { ...opts, features: SERVER_FEATURE_LIST });
    } catch (err) {
      this.takingOver = false;
      if (this.roles.is('STANDBY')) this.watchLease();
      throw err;
    }
  }

  /** freshListeners: the public listeners bound anew (unix socket, and TCP when `listen` is set). */
  freshListeners(): ListenerSource {
    return { fresh: this.cfg.listen ? [unixAddress(this.cfg.socket), this.cfg.listen] : [unixAddress(this.cfg.socket)] };
  }

  /**
   * becomeActive (holding the lease): epoch+1, raise the fences, adopt, sweep orphans, attach
   * the handlers, warm them up (warm-up.ts), accept on the listeners of source (all at once;
   * the handlers are attached before each listens: listeners.ts), then run o.beforeServing (a
   * takeover: FinishHandover, after which the old server accepts no more and sends GOAWAY).
   * o.peerWaitMs: how long vmm-supervisor and ublk-manager get to answer, ms (an Error naming
   * the one that did not).
   */
  async becomeActive(source: ListenerSource, atLeastEpoch: number, o: { peerWaitMs?: number; beforeServing?: () => Promise<void> } = {}): Promise<AdoptionReport> {
    const peerWaitMs = o.peerWaitMs ?? this.cfg.peerStartTimeoutMs;
    this.store?.close();
    const store = await SqliteRecordStore.open(path.join(this.cfg.stateDir, 'records.db'), this.log);
    this.store = store;
    this.epoch = await store.bumpEpochWhenFree(atLeastEpoch);
    failpoint('takeover.after-lease');
    this.describeLease();
    const log = this.log.child({ epoch: this.epoch });
    const active = this.wiring.activate({ store, epoch: () => this.epoch, log, streams: this });
    this.active = active;
    const { manager, vms, devices } = active;
    if (!this.publicServer) {
      this.publicServer = createServiceServer({ info: this.info(), log, epoch: () => this.epoch, auth: publicPolicy(this.cfg.socketGroup, (secret) => this.verifyToken(secret)) });
      active.register(this.publicServer);
    }
    const pub = this.publicServer;
    await waitFor('vmm-supervisor', () => vms.features.get(), peerWaitMs);
    await waitFor('ublk-manager', () => devices.features.get(), peerWaitMs);
    await this.announceEpoch();
    // podd Health after the switch (checkPodds below): a stopped podd must not lengthen the hold
    const report = await adoptAll({ store, vms, devices, podd: this.wiring.podd, manager, log, concurrency: this.cfg.adoptConcurrency, deferPoddChecks: true });
    this.lastAdoption = report;
    adoption.observe({ how: 'received' in source ? 'takeover' : 'start' }, report.durationMs / 1000);
    const swept = await sweepOrphans({ store, vms, devices, runDir: this.cfg.runDir, log });
    // The first calls of a fresh process are slow (warm-up.ts): made here, not by the first
    // clients after the switch. After the adoption, not beside it: run concurrently with the
    // adoption's peer calls, a warm-up connection aborted the process in 3 of 10 runs of
    // handover-fresh-conn.it (libuv: uv__finish_close assertion); after it, 0 in 18.
    const warm = await warmUp(
      pub,
      this.cfg.runDir,
      store
        .list()
        .slice(0, 4)
        .map((r) => r.sandboxId),
      log,
    );
    const tcpCreds = tcpCredentials(this.cfg);
    // Accept before FinishHandover: for a moment both servers accept on the shared sockets,
    // and both serve what they accept (the old one serves reads and, after FinishHandover,
    // sends GOAWAY). The clients it sends GOAWAY reconnect into a process that already
    // accepts, so the switch costs them a reconnect, not this server's listen steps.
    const [listeners, named] = await Promise.all([
      openListeners(source, (s, address) => (address.startsWith('unix://') ? pub.serveListener(s, undefined, this.wiring.bulk?.raw) : pub.serveListener(s, tcpCreds))),
      this.wiring.named
        ? Promise.resolve(this.wiring.named.wanted()).then((specs) => openNamedListeners(specs, 'received' in source ? (source.named ?? []) : [], this.wiring.named!.serve))
        : undefined,
    ]);
    this.listeners = listeners;
    if ('fresh' in source) shareSocket(this.cfg.socket, this.cfg.socketGroup);
    if (named) {
      this.named = named.opened;
      for (const f of named.failed) log.error({ err: f.err, listener: f.spec.name, address: f.spec.address }, 'could not open a named listener: it is off on this server');
    }
    this.roles.to('ACTIVE', { newEpoch: true });
    // everything else of becoming active before FinishHandover: once the old server sends its
    // GOAWAY, this process's event loop is free for the clients that reconnect to it (done
    // after it, these steps fell in the switch: the gap of the open-channel load began at the
    // old server's GOAWAY and this server logged "active" 13-25 ms later)
    this.wiring.onActive?.();
    setSandboxSource(() => store.list());
    await this.metrics.start();
    this.startReaper();
    await o.beforeServing?.();
    log.info(
      {
        listeners: listeners.map((l) => l.address),
        named: this.named.map(namedText),
        adopted: report.adopted.length,
        pool_members: report.poolMembers.length,
        adoption_ms: report.durationMs,
        swept,
        warm_up: warm,
      },
      'active',
    );
    // the podd checks adoption left: after the switch (FinishHandover ran in beforeServing), off the clients' first moments
    setTimeout(() => void checkPodds({ podd: this.wiring.podd, concurrency: this.cfg.adoptConcurrency, log }, report), POST_SWITCH_PODD_CHECK_DELAY_MS).unref();
    const tcp = listeners.find((l) => l.port > 0);
    process.stdout.write(`${JSON.stringify({ ready: true, epoch: this.epoch, port: tcp?.port ?? 0, socket: this.cfg.socket, adopted: report.adopted.length, adoptionMs: report.durationMs })}\n`);
    return report;
  }

  /** verifyToken checks a bearer secret against records.db on every call (UNAUTHENTICATED when unknown, revoked or expired). */
  private verifyToken(secret: string): TokenIdentity {
    if (!this.store) throw new UnauthenticatedError('this server has no records open; nothing was done');
    return this.store.tokens().verify(secret);
  }

  private describeLease(): void {
    this.lease.describe({ pid: process.pid, admin: this.adminAddress, slot: this.cfg.slot, version: SUITE_VERSION, epoch: this.epoch, sinceMs: Date.now() });
  }

  /**
   * announceEpoch raises the epoch fences of vmm-supervisor and ublk-manager to this server's
   * epoch before it adopts or serves. A fence learns an epoch only from a mutating call, so
   * without this the server that lost the lease (a stale or stopped-and-resumed process) could
   * still delete or create VMs and devices until this server's first lifecycle call. Each peer
   * gets FenceEpoch when it lists the feature, else the 0.2.0 announcement (a no-op delete of
   * an id no sandbox can have; VmPeer/DevicePeer.fenceEpoch). ABORTED means a server with a
   * higher epoch exists: this one must not go on.
   */
  private async announceEpoch(): Promise<void> {
    const a = this.active!;
    try {
      const vmm = await a.vms.fenceEpoch(this.epoch);
      const ublk = await a.devices.fenceEpoch(this.epoch);
      this.log.info({ epoch: this.epoch, vmm, ublk }, 'epoch fences raised');
    } catch (err) {
      throw new Error(`could not raise the epoch fences to epoch ${this.epoch}: ${(err as Error).message}`, { cause: err });
    }
  }

  /** servedListeners: the gRPC listeners' addresses, then each named listener as "name kind host:port" (the takeover report and `sandnode upgrade server` list them). */
  servedListeners(): string[] {
    return [...this.listeners.map((l) => l.address), ...this.named.map(namedText)];
  }

  /**
   * openLateNamed opens the named listeners the wiring can give only now (late): they join the
   * ones a handover passes on. Opened while a handover began are closed again (the next server
   * binds them itself).
   */
  private async openLateNamed(): Promise<void> {
    const named = this.wiring.named;
    if (!named?.late || !this.roles.is('ACTIVE')) return;
    const specs = await named.late();
    if (specs.length === 0) return;
    const got = await openNamedListeners(specs, [], named.serve);
    for (const f of got.failed) this.log.error({ err: f.err, listener: f.spec.name, address: f.spec.address }, 'could not open a named listener: it is off on this server');
    if (!this.roles.is('ACTIVE')) {
      for (const l of got.opened) l.close();
      return;
    }
    this.named.push(...got.opened);
    this.log.info({ named: got.opened.map(namedText) }, 'named listeners opened after activation');
  }

  private startReaper(): void {
    clearInterval(this.reaper);
    let reaping = false;
    this.reaper = setInterval(() => {
      const m = this.active?.manager;
      if (reaping || !m || !this.roles.is('ACTIVE')) return;
      reaping = true;
      (async () => {
        await m.checkLiveness();
        await m.recoverLiveness();
        await m.retryTeardowns();
        await m.reapplyPolicies();
        await m.runIdle();
        // warm pools: retire what must go, health, refill (after the liveness pass marked dead VMs)
        await m.pool?.tick();
        for (const id of m.expired()) {
          this.log.info({ sandbox_id: id }, 'timeout reached: deleting sandbox');
          await m.delete(id).catch((err: unknown) => this.log.error({ sandbox_id: id, err }, 'reaper delete failed'));
        }
        await this.openLateNamed();
      })()
        .catch((err: unknown) => this.log.error({ err }, 'reaper pass failed'))
        .finally(() => (reaping = false));
    }, this.cfg.reaperIntervalMs);
  }

  /**
   * drain (ACTIVE only): every live sandbox frozen, stopped and recorded DRAINED, then the
   * ublk-manager stopped (core/drain.ts). Errors: FAILED_PRECONDITION (not ACTIVE).
   */
  async drain(o: { deadlineMs: number; concurrency: number; signal?: AbortSignal } & Pick<DrainDeps, 'onStart' | 'onSandbox'>): Promise<DrainReport> {
    const a = this.active;
    if (!this.roles.is('ACTIVE') || !a || !this.store) throw new FailedPreconditionError(`drain: this server is ${this.role}, not ACTIVE`);
    a.manager.idle.flush(true);
    // warm-pool members are not preserved: deleted first, no refill while the drain runs (pool.ts)
    const resumePool = await a.manager.retireTemplate(ALL_TEMPLATES).catch((err: unknown) => {
      this.log.warn({ err }, 'drain: could not retire every warm pool member; they are drained like any sandbox');
      return () => undefined;
    });
    try {
      const r = await drainNode({
        manager: a.manager,
        store: this.store,
        devices: a.devices,
        log: this.log,
        deadlineMs: o.deadlineMs,
        concurrency: o.concurrency,
        signal: o.signal,
        onStart: o.onStart,
        onSandbox: o.onSandbox,
      });
      observeDrain(r);
      return r;
    } finally {
      resumePool();
    }
  }

  /** handOver: the old server's side of AdminService.Handover (hand-over.ts). */
  handOver(req: { standbyPid: number; fdSocket: string; holdTimeoutMs: number; finishTimeoutMs: number }): Promise<HandoverResponse> {
    return this.oldSide.handOver(req);
  }

  /** finishHandover (AdminService.FinishHandover): retire. Errors: FAILED_PRECONDITION (no handover with token). */
  finishHandover(token: string): { streamsRunning: number } {
    return this.oldSide.finish(token);
  }

  /** handoverParts: what a handover passes on (OldServer). */
  handoverParts() {
    const store = this.store;
    if (!this.active || !store) return undefined;
    const idle = this.active.manager.idle;
    // the activity kept in memory goes into the records before the next server reads them
    return { gate: this.active.manager.gate, checkpoint: () => (idle.flush(true), store.checkpoint()), listeners: this.listeners, named: this.named };
  }

  /**
   * namedListenerLosses: one line per named listener (ingress, egress proxy, DNS) that a standby
   * with these features would not be handed (it would stop at the handover), for PrepareHandover
   * and `upgrade --dry-run`; empty when the standby gets all of them.
   */
  namedListenerLosses(standbyFeatures: readonly string[]): string[] {
    return namedListenerLosses(this.named, standbyFeatures);
  }

  /** pauseActive: lifecycle calls are about to be held; the reaper stops (OldServer). */
  pauseActive(): void {
    clearInterval(this.reaper);
  }

  /**
   * stopAccepting (FinishHandover: the next server is about to accept): this server accepts no
   * more connections (the listening sockets live on in the next server); connections that
   * arrive wait in the backlog until it accepts them. Those accepted before are served here
   * until the GOAWAY of the retirement (OldServer).
   */
  stopAccepting(): void {
    for (const l of this.listeners) l.server.close();
    this.listeners = [];
    // the named ones too: TCP connections accepted before stay (an open WebSocket lives until this process exits)
    for (const l of this.named) l.close();
    this.named = [];
  }

  /** releaseMetrics frees the /metrics port for the next server (OldServer). */
  releaseMetrics(): void {
    setSandboxSource(undefined);
    void this.metrics.close();
  }

  /** retakeEpoch (the lease taken back after a failed handover): epoch+1, lease described, fences raised (OldServer). */
  async retakeEpoch(): Promise<void> {
    this.epoch = await this.store!.bumpEpochWhenFree(this.epoch);
    this.describeLease();
    await this.announceEpoch();
  }

  /** resumeActive: ACTIVE again after a handover that did not complete (it never stopped accepting) (OldServer). */
  resumeActive(o: { newEpoch?: boolean } = {}): void {
    if (this.store) setSandboxSource(() => this.store?.list() ?? []);
    void this.metrics.start();
    this.roles.to('ACTIVE', o);
    this.active?.manager.gate.open();
    this.startReaper();
  }

  /** beginRetire: RETIRING now (lifecycle calls fail UNAVAILABLE), the retirement runs after this tick. */
  beginRetire(): void {
    this.roles.to('RETIRING');
    // the next server of this slot may start while this one relays its last streams
    this.slotLock?.release();
    this.active?.manager.gate.retire();
    setImmediate(() => {
      this.retire().catch((err: unknown) => {
        this.log.fatal({ err }, 'retiring failed');
        this.exit(1);
      });
    });
  }

  /** retire: GOAWAY (accepting stopped at FinishHandover: the sockets live on in the new server), let streams end, exit. */
  private async retire(): Promise<void> {
    this.log.info({ streams: this.streams }, 'retiring: GOAWAY; running streams continue');
    // Send GOAWAY at once on every connection (accepting stopped at FinishHandover):
    // clients open a new connection (accepted by the new server) for their next call; calls
    // and Exec streams already running here complete.
    const closed = this.publicServer?.shutdown(this.cfg.retireDrainMs);
    let finished = !closed;
    void closed?.then(() => (finished = true));
    const t0 = Date.now();
    let idleSince: number | undefined;
    // The stream count decides, not only grpc-js: on Node 24 its tryShutdown reports done while
    // an Exec stream on an injected connection still runs (forceShutdown would cancel it).
    while (Date.now() - t0 < this.cfg.retireDrainMs) {
      // once no Exec stream runs, unary calls still in flight get drainMs, then are cut
      idleSince = this.streams === 0 ? (idleSince ?? Date.now()) : undefined;
      if (idleSince !== undefined && (finished || Date.now() - idleSince > this.cfg.drainMs)) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    this.publicServer?.host.server.forceShutdown();
    await this.adminServer?.shutdown(1000);
    this.closeAll();
    this.log.info('retired');
    this.exit(0);
  }

  /**
   * stop (SIGTERM), in this order: drain the node when drainOnSigterm is set (ACTIVE only) ->
   * stop the standby poll and a handover watchdog -> public server: stop accepting, GOAWAY,
   * force after drainMs -> admin server -> close peers, records, lease, admin socket path.
   * Sandboxes live on.
   */
  async stop(): Promise<void> {
    if (this.cfg.drainOnSigterm && this.roles.is('ACTIVE') && this.active && this.store) {
      const r = await this.drain({ deadlineMs: this.cfg.drainDeadlineMs, concurrency: this.cfg.drainConcurrency });
      const preserved = r.sandboxes.filter((s) => s.outcome === 'preserved').length;
      this.log.info({ preserved, failed: r.sandboxes.length - preserved }, 'drained on SIGTERM');
    }
    clearInterval(this.standbyPoll);
    this.oldSide.stop();
    await this.publicServer?.shutdown(this.cfg.drainMs);
    await this.adminServer?.shutdown(1000);
    // the activity held in memory goes into the records (core/idle.ts), unless the node was handed over
    if (this.roles.is('ACTIVE')) this.active?.manager.idle.flush(true);
    this.closeAll();
  }

  private closeAll(): void {
    clearInterval(this.reaper);
    for (const l of this.named) l.close();
    this.named = [];
    clearInterval(this.adminWatch);
    this.adminWatch = undefined;
    setSandboxSource(undefined);
    void this.metrics.close();
    this.wiring.podd.closeAll();
    this.active?.vms.close();
    this.active?.devices.close();
    this.store?.close();
    this.lease.release();
    // the admin path, unless a newer server of this slot has bound it since
    try {
      if (this.adminListener && statSync(this.adminPath).ino === this.adminListener.ino) rmSync(this.adminPath, { force: true });
    } catch {
      /* already gone */
    }
    this.slotLock?.release();
  }
}

/** waitFor calls fn until it resolves, for at most ms; then throws naming what did not answer. */
async function waitFor<T>(what: string, fn: () => Promise<T>, ms: number): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    try {
      return await fn();
    } catch (err) {
      if (Date.now() > deadline) throw new Error(`${what} did not answer within ${ms} ms: ${(err as Error).message}`, { cause: err });
      await new Promise((r) => setTimeout(r, 200));
    }
  }
}
