/**
 * ServerNode: one server process and its role on the node (ARCHITECTURE.md section 4).
 *
 *   start ──lease free──> ACTIVE (epoch+1, adopt, sweep, serve)
 *     └──lease held──> STANDBY ──lease freed (active died)──> ACTIVE (fresh listeners)
 *   takeover (sandnode upgrade server): STANDBY -> Handover on the active -> receive listeners
 *     -> take lease (epoch+1) -> adopt -> serve on the same sockets -> FinishHandover
 *   ACTIVE --Handover--> HANDING_OVER --FinishHandover--> RETIRING (streams finish) -> exit
 *                             └── standby died / no finish ──> ACTIVE again (lease retaken)
 */
import { randomBytes } from 'node:crypto';
import { mkdirSync, rmSync, statSync } from 'node:fs';
import path from 'node:path';
import {
  createSandnodeChannel,
  createServiceClient,
  createServiceServer,
  FailedPreconditionError,
  processStartTicks,
  processState,
  serveMetrics,
  SUITE_VERSION,
  buildCommit,
  unixAddress,
  type Logger,
  type ServiceServer,
} from '@sandnode/shared';
import { AdminServiceDefinition, ServerRole, type AdminServiceImplementation, type HandoverResponse } from '@sandnode/shared/proto/server/v1/admin';
import { SandboxServiceDefinition } from '@sandnode/shared/proto/server/v1/sandbox';
import { TemplateServiceDefinition } from '@sandnode/shared/proto/server/v1/template';
import type { ServerConfig } from '../config';
import { adoptAll, type AdoptionReport } from '../core/adoption';
import { SandboxManager } from '../core/sandbox-manager';
import { LocalTemplateCatalog } from '../core/template-catalog';
import { sweepOrphans } from '../core/orphan-sweep';
import { drainNode } from '../core/drain';
import { DevicePeer } from '../peers/device-peer';
import { PoddPeers } from '../peers/podd-peer';
import { VmPeer } from '../peers/vm-peer';
import { sandboxService } from '../rpc/sandbox-service';
import { templateService } from '../rpc/template-service';
import { FlockLease } from '../store/flock-lease';
import { SqliteRecordStore } from '../store/sqlite-record-store';
import { receiveFds, sendFds } from './fd-pass';
import { failpoint } from './failpoints';
import { adoptListener, bindListener, type OwnedListener } from './listeners';

/** Features this server offers (GetVersion). */
export const SERVER_FEATURES = ['server.sandbox.v1', 'server.template.v1', 'server.adoption.v1', 'server.handover.v1', 'server.drain.v1', 'server.epoch.v1', 'server.takeover.v1', 'server.fork.v1', 'server.reset-rootfs.v1'];

/** The VM and device id a new active server deletes (a no-op) to raise the epoch fences. */
export const EPOCH_PROBE_ID = 'epoch-fence-probe';
/** Default hold time of lifecycle calls during a handover, ms. */
export const DEFAULT_HOLD_MS = 2000;
/** Default time the old server waits for FinishHandover, ms. */
export const DEFAULT_FINISH_TIMEOUT_MS = 15_000;

/** What a takeover reports (printed by the new server, read by `sandnode upgrade server`). */
export interface TakeoverResult {
  takeover: true;
  oldPid: number;
  oldVersion: string;
  newPid: number;
  newVersion: string;
  epoch: number;
  holdWindowMs: number;
  adopted: number;
  adoptionMs: number;
  listeners: string[];
}

export class ServerNode {
  role: ServerRole = ServerRole.SERVER_ROLE_STANDBY;
  epoch = 0;
  sinceMs = 0;
  readonly lease: FlockLease;
  readonly adminAddress: string;
  private store: SqliteRecordStore | undefined;
  private manager: SandboxManager | undefined;
  private readonly podd = new PoddPeers();
  private vms: VmPeer | undefined;
  private devices: DevicePeer | undefined;
  private publicServer: ServiceServer | undefined;
  private adminServer: ServiceServer | undefined;
  /** the admin socket we bound, and its inode (to remove the path only while it is ours) */
  private adminListener: { listener: OwnedListener; ino: number } | undefined;
  private listeners: OwnedListener[] = [];
  private reaper: NodeJS.Timeout | undefined;
  private standbyPoll: NodeJS.Timeout | undefined;
  private handover: { token: string; standbyPid: number; standbyTicks: number | undefined; watchdog: NodeJS.Timeout; deadline: number } | undefined;
  /** Prometheus /metrics (when metricsListen is set); the port moves to the next server at handover. */
  private metrics: import('node:http').Server | undefined;
  /** When this server started serving after a takeover, epoch ms. */
  private servingAtMs = 0;
  /** A Takeover call is running on this standby. */
  private takingOver = false;
  /** Running Exec streams (a retiring server relays them to completion). */
  streams = 0;
  lastAdoption: AdoptionReport | undefined;

  constructor(
    readonly cfg: ServerConfig,
    readonly log: Logger,
    private readonly exit: (code: number) => void = (c) => process.exit(c),
  ) {
    mkdirSync(cfg.stateDir, { recursive: true });
    mkdirSync(path.join(cfg.runDir, 'sandboxes'), { recursive: true });
    this.lease = new FlockLease(path.join(cfg.stateDir, 'server.lease'));
    this.adminAddress = unixAddress(path.join(cfg.runDir, `server-${cfg.slot || String(process.pid)}-admin.sock`));
  }

  private info() {
    return { component: 'server', version: SUITE_VERSION, commit: buildCommit(), features: SERVER_FEATURES };
  }

  /**
   * startAdmin serves AdminService on the admin socket (every role). The socket is bound like
   * the public ones (listeners.ts: temporary name + hard link), not by grpc-js: a retiring
   * server of the same slot may still run (relaying an Exec stream) when the next server of
   * that slot starts, and closing a socket grpc-js bound unlinks its path, which would remove
   * the new server's admin socket (the one the lease file names).
   */
  async startAdmin(): Promise<void> {
    this.adminServer = createServiceServer({ info: this.info(), log: this.log.child({ api: 'admin' }) });
    this.adminServer.add(AdminServiceDefinition, this.adminService());
    const listener = await bindListener(this.adminAddress);
    this.adminListener = { listener, ino: statSync(this.adminPath).ino };
    this.adminServer.serveListener(listener.server);
  }

  private get adminPath(): string {
    return this.adminAddress.slice('unix://'.length);
  }

  /** start: active if the lease is free, else standby that takes over if the active dies. */
  async start(): Promise<void> {
    await this.startAdmin();
    if (this.lease.tryAcquire()) {
      const listeners = await this.bindFresh();
      await this.becomeActive(listeners, 0);
      return;
    }
    this.role = ServerRole.SERVER_ROLE_STANDBY;
    this.log.info({ holder: FlockLease.readHolder(this.lease.file) }, 'lease held by another server: standby');
    this.watchLease();
  }

  /** watchLease: a standby takes over (failover) when the lease becomes free. */
  private watchLease(): void {
    clearInterval(this.standbyPoll);
    this.standbyPoll = setInterval(() => {
      if (this.role !== ServerRole.SERVER_ROLE_STANDBY || this.takingOver || !this.lease.tryAcquire()) return;
      clearInterval(this.standbyPoll);
      this.log.warn('the active server is gone: taking over');
      this.bindFresh()
        .then((l) => this.becomeActive(l, 0))
        .catch((err: unknown) => {
          this.log.fatal({ err }, 'failover failed');
          this.exit(1);
        });
    }, 500);
  }

  private async bindFresh(): Promise<OwnedListener[]> {
    const addrs = [unixAddress(this.cfg.socket)];
    if (this.cfg.listen) addrs.push(this.cfg.listen);
    const out: OwnedListener[] = [];
    for (const a of addrs) out.push(await bindListener(a));
    return out;
  }

  /** becomeActive: holding the lease: epoch+1, adopt, sweep orphans, serve on listeners. */
  private async becomeActive(listeners: OwnedListener[], atLeastEpoch: number): Promise<AdoptionReport> {
    this.store?.close();
    const store = new SqliteRecordStore(path.join(this.cfg.stateDir, 'records.db'), this.log);
    this.store = store;
    this.epoch = store.bumpEpoch(atLeastEpoch);
    failpoint('takeover.after-lease');
    this.lease.describe({ pid: process.pid, admin: this.adminAddress, slot: this.cfg.slot, version: SUITE_VERSION, epoch: this.epoch, sinceMs: Date.now() });
    const log = this.log.child({ epoch: this.epoch });
    this.vms = new VmPeer(this.cfg.vmmAddress, () => this.epoch);
    this.devices = new DevicePeer(this.cfg.ublkAddress, () => this.epoch);
    const templates = new LocalTemplateCatalog({ templatesDir: this.cfg.templatesDir, poddBundlePath: this.cfg.poddBundle, poddVersion: this.cfg.poddVersion, nodePath: this.cfg.templateNode, store });
    const manager = new SandboxManager({
      store,
      vms: this.vms,
      devices: this.devices,
      podd: this.podd,
      templates,
      log,
      runDir: this.cfg.runDir,
      resourceDefaults: { vcpus: this.cfg.defaultVcpus, memoryMib: this.cfg.defaultMemoryMib, diskBytes: this.cfg.defaultDiskBytes },
      upperBytes: this.cfg.upperBytes,
      poddReadyTimeoutMs: this.cfg.poddReadyTimeoutMs,
    });
    manager.gate.holdMs = DEFAULT_HOLD_MS;
    templates.inUse = (name) => manager.templateInUse(name);
    this.manager = manager;
    await waitFor('vmm-supervisor', () => this.vms!.features.get(), 30_000);
    await waitFor('ublk-manager', () => this.devices!.features.get(), 30_000);
    await this.announceEpoch();
    const report = await adoptAll({ store, vms: this.vms, devices: this.devices, podd: this.podd, manager, log, concurrency: this.cfg.adoptConcurrency });
    this.lastAdoption = report;
    const swept = await sweepOrphans({ store, vms: this.vms, devices: this.devices, runDir: this.cfg.runDir, log });
    if (!this.publicServer) {
      this.publicServer = createServiceServer({ info: this.info(), log });
      this.publicServer.add(SandboxServiceDefinition, sandboxService(manager, this));
      this.publicServer.add(TemplateServiceDefinition, templateService(templates));
      for (const l of listeners) this.publicServer.serveListener(l.server);
    }
    this.listeners = listeners;
    await this.startMetrics();
    this.role = ServerRole.SERVER_ROLE_ACTIVE;
    this.sinceMs = Date.now();
    this.startReaper();
    log.info({ listeners: listeners.map((l) => l.address), adopted: report.adopted.length, adoption_ms: report.durationMs, swept }, 'active');
    const tcp = listeners.find((l) => l.port > 0);
    process.stdout.write(
      `${JSON.stringify({ ready: true, epoch: this.epoch, port: tcp?.port ?? 0, socket: this.cfg.socket, adopted: report.adopted.length, adoptionMs: report.durationMs })}\n`,
    );
    return report;
  }

  /**
   * announceEpoch raises the epoch fences of vmm-supervisor and ublk-manager to this server's
   * epoch before it adopts or serves. A fence learns an epoch only from a mutating call, so
   * without this the server that lost the lease (a stale or stopped-and-resumed process) could
   * still delete or create VMs and devices until this server's first lifecycle call. The calls
   * are no-ops: DeleteVm / DeleteDevice of an id no sandbox can have (sandbox ids are sb-...).
   * ABORTED means a server with a higher epoch exists: this one must not go on.
   */
  private async announceEpoch(): Promise<void> {
    try {
      await this.vms!.client.deleteVm({ vmId: EPOCH_PROBE_ID });
      await this.devices!.client.deleteDevice({ deviceId: EPOCH_PROBE_ID });
    } catch (err) {
      throw new Error(`could not raise the epoch fences to epoch ${this.epoch}: ${(err as Error).message}`);
    }
  }

  /**
   * startMetrics serves /metrics on metricsListen. The old server frees the port when it
   * releases the lease, so a new server retries for a moment; failing to serve metrics is
   * logged, never fatal.
   */
  private async startMetrics(): Promise<void> {
    if (!this.cfg.metricsListen || this.metrics) return;
    for (let i = 0; ; i++) {
      try {
        this.metrics = await serveMetrics(this.cfg.metricsListen);
        return;
      } catch (err) {
        if (i >= 40) {
          this.log.error({ err: (err as Error).message, listen: this.cfg.metricsListen }, 'cannot serve /metrics');
          return;
        }
        await new Promise((r) => setTimeout(r, 50));
      }
    }
  }

  private startReaper(): void {
    clearInterval(this.reaper);
    let reaping = false;
    this.reaper = setInterval(() => {
      const m = this.manager;
      if (reaping || !m || this.role !== ServerRole.SERVER_ROLE_ACTIVE) return;
      reaping = true;
      (async () => {
        await m.checkLiveness();
        await m.retryTeardowns();
        for (const id of m.expired()) {
          this.log.info({ sandbox_id: id }, 'timeout reached: deleting sandbox');
          await m.delete(id).catch((err: unknown) => this.log.error({ sandbox_id: id, err: (err as Error).message }, 'reaper delete failed'));
        }
      })().finally(() => (reaping = false));
    }, this.cfg.reaperIntervalMs);
  }

  /**
   * takeover: this (standby) process takes the node over from the active server without
   * refusing a connection: receive its listening sockets, take the lease, adopt, serve, finish.
   */
  async takeover(opts: { holdMs?: number; finishTimeoutMs?: number } = {}): Promise<TakeoverResult> {
    if (!this.adminServer) await this.startAdmin();
    const holder = FlockLease.readHolder(this.lease.file);
    if (!holder || !FlockLease.isHeld(this.lease.file)) throw new FailedPreconditionError('no active server holds the lease: start normally instead');
    const ch = createSandnodeChannel(holder.admin);
    const admin = createServiceClient(AdminServiceDefinition, ch, { timeoutMs: 60_000, retryAttempts: 1 });
    try {
      const pre = await admin.prepareHandover({ standbyVersion: SUITE_VERSION, standbyFeatures: SERVER_FEATURES });
      if (!pre.ok) throw new FailedPreconditionError(`the active server refuses a handover: ${pre.reasons.join('; ')}`);
      const fdPath = path.join(this.cfg.runDir, `server-${this.cfg.slot || String(process.pid)}-fds.sock`);
      const rx = receiveFds<{ listeners: string[] }>(fdPath, 30_000);
      await rx.ready;
      const holdStarted = Date.now();
      let res: HandoverResponse;
      try {
        res = await admin.handover({
          standbyPid: process.pid,
          standbyVersion: SUITE_VERSION,
          fdSocket: fdPath,
          holdTimeoutMs: opts.holdMs ?? DEFAULT_HOLD_MS,
          finishTimeoutMs: opts.finishTimeoutMs ?? DEFAULT_FINISH_TIMEOUT_MS,
        });
      } catch (err) {
        // The old server died during the handover: if the lease is free, take the node over as
        // a failover would (with its sockets if they arrived, else fresh ones).
        // (its connection drops while it is still exiting: give the kernel a moment to end it
        // and release its lease)
        let free = false;
        for (let i = 0; i < 40 && !free; i++) {
          free = !holderAlive(holder.pid) && this.lease.tryAcquire();
          if (!free) await new Promise((r) => setTimeout(r, 50));
        }
        if (!free) throw err;
        this.log.warn({ err: (err as Error).message, old_pid: holder.pid }, 'the old server died during the handover: taking over as failover');
        const got = await Promise.race([rx.message, new Promise<undefined>((r) => setTimeout(() => r(undefined), 500))]).catch(() => undefined);
        const listeners = got ? await adoptAll2(got) : await this.bindFresh();
        const report = await this.becomeActive(listeners, holder.epoch);
        return this.reportTakeover({ token: '', epoch: holder.epoch, listeners: [], inFlightFinished: 0, holdStartedAtMs: holdStarted, oldPid: holder.pid, oldVersion: holder.version }, report, listeners);
      }
      const msg = await rx.message;
      failpoint('takeover.after-fds');
      if (!(await this.lease.acquire(10_000))) throw new Error('the old server did not release the lease within 10 s');
      const listeners = await adoptAll2(msg);
      const report = await this.becomeActive(listeners, Number(res.epoch));
      this.servingAtMs = Date.now();
      failpoint('takeover.after-serve');
      try {
        await admin.finishHandover({ token: res.token, newEpoch: this.epoch });
      } catch (err) {
        // We hold the lease and serve: the old server retires on its own (its watchdog sees the
        // lease taken) or is gone. Nothing to undo.
        this.log.warn({ err: (err as Error).message }, 'FinishHandover failed; the old server retires by itself');
      }
      return this.reportTakeover(res, report, listeners);
    } finally {
      ch.close();
    }
  }

  private reportTakeover(res: HandoverResponse, report: AdoptionReport, listeners: OwnedListener[]): TakeoverResult {
    const result: TakeoverResult = {
      takeover: true,
      oldPid: res.oldPid,
      oldVersion: res.oldVersion,
      newPid: process.pid,
      newVersion: SUITE_VERSION,
      epoch: this.epoch,
      // from the moment lifecycle calls were held to the moment this server served them
      holdWindowMs: (this.servingAtMs || Date.now()) - Number(res.holdStartedAtMs),
      adopted: report.adopted.length,
      adoptionMs: report.durationMs,
      listeners: listeners.map((l) => l.address),
    };
    process.stdout.write(`${JSON.stringify(result)}\n`);
    this.log.info(result, 'takeover finished');
    return result;
  }

  /** The AdminService of this process. */
  private adminService(): AdminServiceImplementation {
    return {
      getLeaseStatus: async () => {
        const h = FlockLease.readHolder(this.lease.file);
        return {
          role: this.role,
          epoch: this.epoch || h?.epoch || 0,
          holderPid: FlockLease.isHeld(this.lease.file) || this.lease.held ? (h?.pid ?? 0) : 0,
          slot: this.cfg.slot,
          version: SUITE_VERSION,
          sinceMs: this.sinceMs,
        };
      },
      prepareHandover: async () => {
        const reasons: string[] = [];
        if (this.role !== ServerRole.SERVER_ROLE_ACTIVE) reasons.push(`this server is ${ServerRole[this.role]}, not ACTIVE`);
        if (this.handover) reasons.push('a handover is already in progress');
        return { ok: reasons.length === 0, reasons, sandboxes: this.store?.list().length ?? 0, inFlight: this.manager?.gate.inFlight ?? 0 };
      },
      handover: async (req) => this.handOver(req),
      finishHandover: async (req) => {
        if (!this.handover || req.token !== this.handover.token) throw new FailedPreconditionError('finish_handover: no handover with that token is in progress');
        clearInterval(this.handover.watchdog);
        this.handover = undefined;
        this.role = ServerRole.SERVER_ROLE_RETIRING;
        this.manager?.gate.retire();
        const streams = this.streams;
        setImmediate(() => void this.retire());
        return { streamsRunning: streams };
      },
      takeover: async (req) => {
        if (this.role !== ServerRole.SERVER_ROLE_STANDBY || this.takingOver) throw new FailedPreconditionError(`takeover: this server is ${ServerRole[this.role]}, not an idle STANDBY`);
        this.takingOver = true;
        clearInterval(this.standbyPoll);
        try {
          const r = await this.takeover({ holdMs: req.holdTimeoutMs || undefined, finishTimeoutMs: req.finishTimeoutMs || undefined });
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
          };
        } catch (err) {
          // still a standby: watch the lease again
          this.takingOver = false;
          if (this.role === ServerRole.SERVER_ROLE_STANDBY) this.watchLease();
          throw err;
        }
      },
      drain: async (req) => {
        if (this.role !== ServerRole.SERVER_ROLE_ACTIVE || !this.manager || !this.store || !this.vms || !this.devices) {
          throw new FailedPreconditionError(`drain: this server is ${ServerRole[this.role]}, not ACTIVE`);
        }
        return drainNode({
          manager: this.manager,
          store: this.store,
          devices: this.devices,
          log: this.log,
          deadlineMs: req.deadlineMs || 20_000,
          concurrency: req.concurrency || 8,
        });
      },
    };
  }

  /** handOver runs the old server's side of Handover (see AdminService.Handover). */
  private async handOver(req: { standbyPid: number; standbyVersion: string; fdSocket: string; holdTimeoutMs: number; finishTimeoutMs: number }): Promise<HandoverResponse> {
    if (this.role !== ServerRole.SERVER_ROLE_ACTIVE || !this.manager || !this.store) throw new FailedPreconditionError(`handover: this server is ${ServerRole[this.role]}, not ACTIVE`);
    if (this.handover) throw new FailedPreconditionError('handover: another handover is in progress');
    if (!path.isAbsolute(req.fdSocket)) throw new FailedPreconditionError('fd_socket: must be an absolute path');
    const log = this.log.child({ handover_to: req.standbyPid });
    this.role = ServerRole.SERVER_ROLE_HANDING_OVER;
    clearInterval(this.reaper);
    const holdStartedAtMs = Date.now();
    this.manager.gate.holdMs = req.holdTimeoutMs || DEFAULT_HOLD_MS;
    const inFlight = this.manager.gate.inFlight;
    try {
      await this.manager.gate.close();
      failpoint('handover.after-hold');
      this.store.checkpoint();
      await sendFds(req.fdSocket, { listeners: this.listeners.map((l) => l.address) }, this.listeners.map((l) => l.fd));
      failpoint('handover.after-send');
    } catch (err) {
      log.error({ err: (err as Error).message }, 'handover failed before the lease was released: staying active');
      this.resumeActive();
      throw new FailedPreconditionError(`handover aborted, the old server stays active: ${(err as Error).message}`);
    }
    const epoch = this.epoch;
    this.metrics?.close(); // the port goes to the next server with the lease
    this.metrics = undefined;
    this.lease.release();
    failpoint('handover.after-release');
    const token = randomBytes(12).toString('hex');
    const finishMs = req.finishTimeoutMs || DEFAULT_FINISH_TIMEOUT_MS;
    const standbyTicks = processStartTicks(req.standbyPid);
    const watchdog = setInterval(() => {
      const h = this.handover;
      if (!h) return;
      const standbyAlive = h.standbyTicks !== undefined && processStartTicks(h.standbyPid) === h.standbyTicks;
      if (standbyAlive && Date.now() < h.deadline) return;
      clearInterval(h.watchdog);
      this.handover = undefined;
      if (this.lease.tryAcquire()) {
        log.error({ standby_alive: standbyAlive }, 'the standby did not finish the handover: taking the lease back');
        this.epoch = this.store!.bumpEpoch(this.epoch);
        this.lease.describe({ pid: process.pid, admin: this.adminAddress, slot: this.cfg.slot, version: SUITE_VERSION, epoch: this.epoch, sinceMs: Date.now() });
        // raise the fences to the new epoch before lifecycle calls run again
        this.announceEpoch().then(
          () => {
            this.sinceMs = Date.now();
            this.resumeActive();
          },
          (err: unknown) => {
            log.fatal({ err: (err as Error).message }, 'could not raise the epoch fences after taking the lease back');
            this.exit(1);
          },
        );
      } else {
        log.warn('the standby holds the lease but did not finish: retiring');
        this.role = ServerRole.SERVER_ROLE_RETIRING;
        this.manager?.gate.retire();
        void this.retire();
      }
    }, 50);
    this.handover = { token, standbyPid: req.standbyPid, standbyTicks, watchdog, deadline: Date.now() + finishMs };
    log.info({ in_flight: inFlight, epoch }, 'lease released to the standby');
    return {
      token,
      epoch,
      listeners: this.listeners.map((l) => ({ address: l.address })),
      inFlightFinished: inFlight,
      holdStartedAtMs,
      oldPid: process.pid,
      oldVersion: SUITE_VERSION,
    };
  }

  private resumeActive(): void {
    void this.startMetrics();
    this.role = ServerRole.SERVER_ROLE_ACTIVE;
    this.manager?.gate.open();
    this.startReaper();
  }

  /** retire: stop accepting (the sockets live on in the new server), GOAWAY, let streams end, exit. */
  private async retire(): Promise<void> {
    this.log.info({ streams: this.streams }, 'retiring: GOAWAY; running streams continue');
    // Stop accepting on our copies of the listeners (the unix path is kept, see listeners.ts;
    // the sockets live on in the new server) and send GOAWAY at once on every connection:
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

  /** stop (SIGTERM): drain the node first when configured, then stop serving; sandboxes live on. */
  async stop(): Promise<void> {
    if (this.cfg.drainOnSigterm && this.role === ServerRole.SERVER_ROLE_ACTIVE && this.manager && this.store && this.devices) {
      const r = await drainNode({ manager: this.manager, store: this.store, devices: this.devices, log: this.log, deadlineMs: this.cfg.drainDeadlineMs, concurrency: 8 });
      this.log.info({ preserved: r.sandboxes.filter((s) => s.outcome === 1).length, failed: r.sandboxes.filter((s) => s.outcome !== 1).length }, 'drained on SIGTERM');
    }
    clearInterval(this.standbyPoll);
    if (this.handover) clearInterval(this.handover.watchdog);
    // stop accepting, GOAWAY now, force after drainMs
    await this.publicServer?.shutdown(this.cfg.drainMs);
    await this.adminServer?.shutdown(1000);
    this.closeAll();
  }

  private closeAll(): void {
    clearInterval(this.reaper);
    this.metrics?.close();
    this.podd.closeAll();
    this.vms?.close();
    this.devices?.close();
    this.store?.close();
    this.lease.release();
    // the admin path, unless a newer server of this slot has bound it since
    try {
      if (this.adminListener && statSync(this.adminPath).ino === this.adminListener.ino) rmSync(this.adminPath, { force: true });
    } catch {
      /* already gone */
    }
  }
}

/** holderAlive says whether a process with that pid exists (not a zombie). */
function holderAlive(pid: number): boolean {
  const st = processState(pid);
  return st !== undefined && st !== 'Z';
}

/** adoptAll2 serves on every listening socket received from the old server. */
async function adoptAll2(msg: { meta: { listeners: string[] }; fds: number[] }): Promise<OwnedListener[]> {
  const out: OwnedListener[] = [];
  for (const [i, fd] of msg.fds.entries()) out.push(await adoptListener(msg.meta.listeners[i] ?? `fd:${fd}`, fd));
  return out;
}

async function waitFor<T>(what: string, fn: () => Promise<T>, ms: number): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    try {
      return await fn();
    } catch (err) {
      if (Date.now() > deadline) throw new Error(`${what} did not answer within ${ms} ms: ${(err as Error).message}`);
      await new Promise((r) => setTimeout(r, 200));
    }
  }
}
