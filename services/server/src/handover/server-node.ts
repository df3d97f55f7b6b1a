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
import { mkdirSync, rmSync } from 'node:fs';
import path from 'node:path';
import {
  createSandnodeChannel,
  createServiceClient,
  createServiceServer,
  FailedPreconditionError,
  processStartTicks,
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
export const SERVER_FEATURES = ['server.sandbox.v1', 'server.template.v1', 'server.adoption.v1', 'server.handover.v1', 'server.drain.v1', 'server.epoch.v1'];

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
  private listeners: OwnedListener[] = [];
  private reaper: NodeJS.Timeout | undefined;
  private standbyPoll: NodeJS.Timeout | undefined;
  private handover: { token: string; standbyPid: number; standbyTicks: number | undefined; watchdog: NodeJS.Timeout; deadline: number } | undefined;
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

  /** startAdmin serves AdminService on the admin socket (every role). */
  async startAdmin(): Promise<void> {
    this.adminServer = createServiceServer({ info: this.info(), log: this.log.child({ api: 'admin' }) });
    this.adminServer.add(AdminServiceDefinition, this.adminService());
    await this.adminServer.listen([this.adminAddress]);
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
    this.standbyPoll = setInterval(() => {
      if (this.role !== ServerRole.SERVER_ROLE_STANDBY || !this.lease.tryAcquire()) return;
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
    const templates = new LocalTemplateCatalog({ templatesDir: this.cfg.templatesDir, poddBundlePath: this.cfg.poddBundle, poddVersion: this.cfg.poddVersion, store });
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
    this.manager = manager;
    await waitFor('vmm-supervisor', () => this.vms!.features.get(), 30_000);
    await waitFor('ublk-manager', () => this.devices!.features.get(), 30_000);
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

  private startReaper(): void {
    clearInterval(this.reaper);
    let reaping = false;
    this.reaper = setInterval(() => {
      const m = this.manager;
      if (reaping || !m || this.role !== ServerRole.SERVER_ROLE_ACTIVE) return;
      reaping = true;
      (async () => {
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
    await this.startAdmin();
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
      const res: HandoverResponse = await admin.handover({
        standbyPid: process.pid,
        standbyVersion: SUITE_VERSION,
        fdSocket: fdPath,
        holdTimeoutMs: opts.holdMs ?? DEFAULT_HOLD_MS,
        finishTimeoutMs: opts.finishTimeoutMs ?? DEFAULT_FINISH_TIMEOUT_MS,
      });
      const msg = await rx.message;
      failpoint('takeover.after-fds');
      if (!(await this.lease.acquire(10_000))) throw new Error('the old server did not release the lease within 10 s');
      const listeners: OwnedListener[] = [];
      for (const [i, fd] of msg.fds.entries()) listeners.push(await adoptListener(msg.meta.listeners[i] ?? `fd:${fd}`, fd));
      const report = await this.becomeActive(listeners, Number(res.epoch));
      failpoint('takeover.after-serve');
      await admin.finishHandover({ token: res.token, newEpoch: this.epoch });
      const result: TakeoverResult = {
        takeover: true,
        oldPid: res.oldPid,
        oldVersion: res.oldVersion,
        newPid: process.pid,
        newVersion: SUITE_VERSION,
        epoch: this.epoch,
        holdWindowMs: Date.now() - Number(res.holdStartedAtMs),
        adopted: report.adopted.length,
        adoptionMs: report.durationMs,
        listeners: listeners.map((l) => l.address),
      };
      process.stdout.write(`${JSON.stringify(result)}\n`);
      this.log.info(result, 'takeover finished');
      return result;
    } finally {
      ch.close();
    }
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
        this.resumeActive();
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
    this.role = ServerRole.SERVER_ROLE_ACTIVE;
    this.manager?.gate.open();
    this.startReaper();
  }

  /** retire: stop accepting (the sockets live on in the new server), GOAWAY, let streams end, exit. */
  private async retire(): Promise<void> {
    this.log.info({ streams: this.streams }, 'retiring: GOAWAY; running streams continue');
    for (const l of this.listeners) l.server.close(); // our copies only; unix path kept (see listeners.ts)
    // GOAWAY and wait for running calls; idle connections must not keep a retired server
    // alive, so once no Exec stream runs (after a short grace for unary calls) close at once.
    const done = this.publicServer?.shutdown(this.cfg.retireDrainMs);
    let finished = false;
    void done?.then(() => (finished = true));
    const t0 = Date.now();
    while (!finished && Date.now() - t0 < this.cfg.retireDrainMs) {
      if (this.streams === 0 && Date.now() - t0 > 200) {
        this.publicServer?.host.server.forceShutdown();
        break;
      }
      await new Promise((r) => setTimeout(r, 50));
    }
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
    this.publicServer?.setServing(false);
    for (const l of this.listeners) l.server.close();
    await this.publicServer?.shutdown(this.cfg.drainMs);
    await this.adminServer?.shutdown(1000);
    this.closeAll();
  }

  private closeAll(): void {
    clearInterval(this.reaper);
    this.podd.closeAll();
    this.vms?.close();
    this.devices?.close();
    this.store?.close();
    this.lease.release();
    rmSync(this.adminAddress.slice('unix://'.length), { force: true });
  }
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
