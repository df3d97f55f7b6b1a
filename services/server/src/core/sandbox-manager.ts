/**
 * SandboxManager: the sandbox lifecycle state machine of the active server.
 *
 *   CREATING -> RUNNING <-> PAUSED
 *       |          |          |
 *       +------> DELETING <---+        (ERROR -> DELETING too)
 *
 * Every transition is persisted in the record store (durable on return) before it is
 * acknowledged. Operations on one sandbox are serialized; different sandboxes run
 * concurrently. A crash at any step leaves a record that adoption (adoption.ts) finishes:
 * CREATING and DELETING records are torn down, RUNNING/PAUSED ones are verified and kept.
 */
import { randomBytes } from 'node:crypto';
import { mkdir, rm } from 'node:fs/promises';
import { AbortedError, DeadlineExceededError, FailedPreconditionError, InvalidArgumentError, isCode, MAX_FREEZE_MS, run, Status, isSameProcess, NotFoundError, processState, requireSandboxId, sandboxDir, unixAddress, type Logger } from '@sandnode/shared';
import { KeyedMutex } from '@sandnode/shared';
import { failpoint } from '../handover/failpoints';
import { LifecycleGate } from './gate';
import type { DeviceInfo, DevicePort, PoddFreeze, ExecArgs, ExecEvent, PoddConnector, RecordStore, Resources, SandboxRecord, SandboxState, TemplateCatalog, VmPort } from './types';
import { RECORD_SCHEMA } from './types';
import {
  validateArgv,
  validateChunk,
  validateMetadata,
  validateRequestId,
  validateResources,
  validateTemplateName,
  validateMaxFreezeMs,
  validateTimeoutSeconds,
  workspacePath,
  MAX_FILE_CHUNK_BYTES,
  type ResourceDefaults,
} from './validate';

/** vmAlive: the process is the VM's (same start ticks) and not a zombie. */
function vmAlive(pid: number, ticks: number): boolean {
  return isSameProcess(pid, ticks) && processState(pid) !== 'Z';
}

/**
 * ownedDeviceIds are the devices a record owns: those it lists, the ids a create or fork makes
 * before it records them (`<id>-upper`, `<id>-ws`), and the fresh upper of a reset in progress.
 */
export function ownedDeviceIds(rec: SandboxRecord): string[] {
  const ids = new Set([...rec.devices.map((d) => d.deviceId), `${rec.sandboxId}-upper`, `${rec.sandboxId}-ws`]);
  if (rec.resetUpperDeviceId) ids.add(rec.resetUpperDeviceId);
  return [...ids];
}

/** A create or fork in flight: what it is ("a fork of sb-...") and its result. */
interface Inflight {
  what: string;
  p: Promise<unknown>;
}

/**
 * track registers p as `what` under requestId until it settles (a retry with the same
 * request_id joins it) and returns p; an empty requestId is not tracked.
 */
function track<T>(inflight: Map<string, Inflight>, requestId: string, what: string, p: Promise<T>): Promise<T> {
  if (!requestId) return p;
  inflight.set(requestId, { what, p });
  p.finally(() => inflight.delete(requestId)).catch(() => undefined);
  return p;
}

/**
 * joinInflight returns the call in flight under requestId when it is the same call (`what`),
 * undefined when none runs. InvalidArgumentError when the id is in use by another call.
 */
function joinInflight(inflight: Map<string, Inflight>, requestId: string, what: string): Promise<unknown> | undefined {
  const f = inflight.get(requestId);
  if (f && f.what !== what) throw new InvalidArgumentError(`request_id: ${requestId} is in use by ${f.what}, in progress`);
  return f?.p;
}

/** Longest a host sync before a paused parent's clone may take, ms. */
export const SYNC_TIMEOUT_MS = 120_000;

/** The env var that tells a fork child's init and podd its parent's sandbox id. */
export const FORKED_FROM_ENV = 'SANDNODE_FORKED_FROM';

/** Default size of a sandbox's rootfs upper device, bytes (sparse). */
export const DEFAULT_UPPER_BYTES = 1024 * 1024 * 1024;
/** Default time podd gets to answer Health after the VM starts, ms. */
export const DEFAULT_PODD_READY_TIMEOUT_MS = 20_000;

export interface SandboxManagerOptions {
  store: RecordStore;
  vms: VmPort;
  devices: DevicePort;
  podd: PoddConnector;
  templates: TemplateCatalog;
  log: Logger;
  runDir: string;
  resourceDefaults: ResourceDefaults;
  upperBytes?: number;
  poddReadyTimeoutMs?: number;
  /**
   * syncHost flushes dirty data of every filesystem of the host to its device (default: the
   * `sync` command, sync(2), which covers every superblock whatever mount namespace it is
   * mounted in). A fork runs it before cloning a paused parent.
   */
  syncHost?: () => Promise<void>;
  now?: () => number;
}

export interface CreateSandboxArgs {
  template: string;
  timeoutSeconds: number;
  metadata: Record<string, string>;
  resources: Partial<Resources> | undefined;
  requestId: string;
}

export interface ForkSandboxArgs {
  parentId: string;
  metadata: Record<string, string>;
  timeoutSeconds: number;
  /** 0 = 1500 ms */
  maxFreezeMs: number;
  requestId: string;
}

/**
 * How a fork held its parent: podd quiesce, pause (podd lacks podd.quiesce), nothing (parent
 * PAUSED), or "existing" (a repeated request_id: the first fork's child).
 */
export type ForkMethod = 'quiesce' | 'pause' | 'paused-parent' | 'existing';

export interface ForkResult {
  child: SandboxRecord;
  method: ForkMethod;
  /** how long the parent was held (freeze window or pause), ms */
  parentHeldMs: number;
  /** the device clones, ms */
  cloneMs: number;
  /** the whole fork until the child's podd answered, ms */
  forkMs: number;
}

/** The ublk-manager feature ForkSandbox needs. */
export const CLONE_FEATURE = 'ublk.clone';
/** The podd feature that lets a fork freeze a RUNNING parent instead of pausing it. */
export const QUIESCE_FEATURE = 'podd.quiesce';

export interface ListSandboxesArgs {
  states: SandboxState[];
  metadata: Record<string, string>;
  pageSize: number;
  pageToken: string;
}

const DEFAULT_PAGE_SIZE = 100;
const MAX_PAGE_SIZE = 1000;

export class SandboxManager {
  private readonly locks = new KeyedMutex();
  /** Closed during a handover: lifecycle operations are held, then UNAVAILABLE. */
  readonly gate = new LifecycleGate();
  private readonly now: () => number;
  private readonly syncHost: () => Promise<void>;
  /** Creates in flight per template (a template rebuild is refused while one runs). */
  private readonly creatingFrom = new Map<string, number>();
  /** Creates and forks in flight by request id, so that a retry joins the first call. */
  private readonly inflight = new Map<string, Inflight>();

  constructor(private readonly o: SandboxManagerOptions) {
    this.now = o.now ?? Date.now;
    this.syncHost = o.syncHost ?? (async () => void (await run('sync', [], { timeoutMs: SYNC_TIMEOUT_MS })));
  }

  /** get returns the record of id. Errors: INVALID_ARGUMENT (malformed id), NOT_FOUND. */
  get(id: string): SandboxRecord {
    requireSandboxId('sandbox_id', id);
    const rec = this.o.store.get(id);
    if (!rec) throw new NotFoundError(`sandbox ${id} not found`);
    return rec;
  }

  /** list filters and pages the records (ordered by id). The page token is the last id, base64url. */
  list(args: ListSandboxesArgs): { sandboxes: SandboxRecord[]; nextPageToken: string } {
    if (args.pageSize > MAX_PAGE_SIZE) throw new InvalidArgumentError(`page_size: ${args.pageSize} is above ${MAX_PAGE_SIZE}`);
    const size = args.pageSize || DEFAULT_PAGE_SIZE;
    let after = '';
    if (args.pageToken) {
      after = Buffer.from(args.pageToken, 'base64url').toString('utf8');
      if (!/^sb-[0-9a-f]{16}$/.test(after)) throw new InvalidArgumentError('page_token: not a token from ListSandboxes');
    }
    const mdFilter = Object.entries(args.metadata);
    const matches = this.o.store
      .list()
      .filter((r) => r.sandboxId > after)
      .filter((r) => args.states.length === 0 || args.states.includes(r.state))
      .filter((r) => mdFilter.every(([k, v]) => r.metadata[k] === v));
    const page = matches.slice(0, size);
    const last = page[page.length - 1];
    const nextPageToken = matches.length > size && last ? Buffer.from(last.sandboxId).toString('base64url') : '';
    return { sandboxes: page, nextPageToken };
  }

  /**
   * create makes devices and a VM from a template and waits for podd. Returns the RUNNING
   * record. Errors: INVALID_ARGUMENT, NOT_FOUND (template), and those of the peers; on failure
   * everything made is torn down and the record removed.
   */
  async create(args: CreateSandboxArgs): Promise<SandboxRecord> {
    const template = validateTemplateName('template', args.template);
    const timeoutSeconds = validateTimeoutSeconds('timeout_seconds', args.timeoutSeconds);
    const metadata = validateMetadata('metadata', args.metadata);
    const resources = validateResources('resources', args.resources, this.o.resourceDefaults);
    const requestId = validateRequestId('request_id', args.requestId);
    if (requestId) {
      const inflight = joinInflight(this.inflight, requestId, `a create from template ${template}`);
      if (inflight) return inflight as Promise<SandboxRecord>;
      const existing = this.o.store.findByRequestId(requestId);
      if (existing) return this.existingCreate(existing, template);
    }
    // Registered before the first await, so a parallel create with the same request_id joins it.
    const p = this.gate.run(async () => {
      this.creatingFrom.set(template, (this.creatingFrom.get(template) ?? 0) + 1);
      try {
        const tpl = await this.o.templates.get(template);
        if (!tpl) throw new NotFoundError(`template ${JSON.stringify(template)} not found (build it: sandnode template build ${template})`);
        return await this.createFromTemplate(template, tpl.rootfsPath, tpl.poddVersion, timeoutSeconds, metadata, resources, requestId);
      } finally {
        const n = (this.creatingFrom.get(template) ?? 1) - 1;
        if (n > 0) this.creatingFrom.set(template, n);
        else this.creatingFrom.delete(template);
      }
    });
    return track(this.inflight, requestId, `a create from template ${template}`, p);
  }

  /**
   * newRecord is the CREATING record of a new sandbox id made from `from` (a template, or a
   * fork's parent): no VM or device yet, its own podd address and a fresh machine id.
   */
  private newRecord(
    id: string,
    from: Pick<SandboxRecord, 'template' | 'templatePoddVersion' | 'templateRootfs' | 'resources' | 'rootfsGeneration' | 'forkedFrom'>,
    metadata: Record<string, string>,
    timeoutSeconds: number,
    requestId: string,
  ): SandboxRecord {
    const now = this.now();
    return {
      ...from,
      schema: RECORD_SCHEMA,
      sandboxId: id,
      state: 'CREATING',
      vm: undefined,
      devices: [],
      poddAddress: unixAddress(`${sandboxDir(this.o.runDir, id)}/podd.sock`),
      createdAtMs: now,
      updatedAtMs: now,
      expiresAtMs: timeoutSeconds ? now + timeoutSeconds * 1000 : 0,
      metadata,
      requestId,
      errorMessage: '',
      resumeMethod: '',
      forkPausedAtMs: 0,
      machineId: randomBytes(16).toString('hex'),
      resetUpperDeviceId: '',
    };
  }

  /** existingCreate answers a repeated request_id: the same sandbox, if it still lives. */
  private existingCreate(rec: SandboxRecord, template: string): SandboxRecord {
    if (rec.forkedFrom) throw new InvalidArgumentError(`request_id: ${rec.requestId} was used for sandbox ${rec.sandboxId}, a fork of ${rec.forkedFrom}`);
    if (rec.template !== template) {
      throw new InvalidArgumentError(`request_id: ${rec.requestId} was used for sandbox ${rec.sandboxId} from template ${rec.template}`);
    }
    if (rec.state !== 'RUNNING' && rec.state !== 'PAUSED') {
      throw new FailedPreconditionError(`request_id: ${rec.requestId} made sandbox ${rec.sandboxId}, which is ${rec.state}`);
    }
    return rec;
  }

  private async createFromTemplate(
    template: string,
    rootfs: string,
    poddVersion: string,
    timeoutSeconds: number,
    metadata: Record<string, string>,
    resources: Resources,
    requestId: string,
  ): Promise<SandboxRecord> {
    const id = `sb-${randomBytes(8).toString('hex')}`;
    const log = this.o.log.child({ sandbox_id: id });
    const rec = this.newRecord(id, { template, templatePoddVersion: poddVersion, templateRootfs: rootfs, resources, rootfsGeneration: 1, forkedFrom: '' }, metadata, timeoutSeconds, requestId);
    return this.locks.run(id, async () => {
      this.o.store.put(rec);
      const t0 = this.now();
      try {
        const upper = await this.o.devices.createEmpty(`${id}-upper`, this.o.upperBytes ?? DEFAULT_UPPER_BYTES);
        rec.devices.push({ deviceId: upper.deviceId, role: 'rootfs-upper', path: upper.path, backingFile: upper.backingFile, sizeBytes: upper.sizeBytes });
        const ws = await this.o.devices.createEmpty(`${id}-ws`, resources.diskBytes);
        rec.devices.push({ deviceId: ws.deviceId, role: 'workspace', path: ws.path, backingFile: ws.backingFile, sizeBytes: ws.sizeBytes });
        this.touch(rec);
        await this.bootVm(rec);
        log.info({ pid: rec.vm?.pid, template, ms: this.now() - t0 }, 'sandbox created');
        return rec;
      } catch (err) {
        log.warn({ err: (err as Error).message }, 'create failed; tearing down');
        // the request_id no longer names this attempt: a retry of the create makes a new one
        rec.requestId = '';
        await this.teardown(rec).catch((e: unknown) => log.error({ err: (e as Error).message }, 'teardown after failed create failed; adoption will retry'));
        throw err;
      }
    });
  }

  private async waitForPodd(rec: SandboxRecord): Promise<void> {
    const client = this.o.podd.connect(rec.poddAddress);
    const deadline = this.now() + (this.o.poddReadyTimeoutMs ?? DEFAULT_PODD_READY_TIMEOUT_MS);
    for (;;) {
      if (await client.health(1000).catch(() => false)) return;
      if (this.now() > deadline) {
        throw new DeadlineExceededError(`sandbox ${rec.sandboxId}: podd did not answer at ${rec.poddAddress} within ${this.o.poddReadyTimeoutMs ?? DEFAULT_PODD_READY_TIMEOUT_MS} ms`);
      }
      await new Promise((r) => setTimeout(r, 25));
    }
  }

  /** pause freezes a RUNNING sandbox. Errors: NOT_FOUND, FAILED_PRECONDITION (not RUNNING). */
  pause(id: string): Promise<SandboxRecord> {
    this.get(id);
    return this.gated(id, async () => {
      const rec = this.requireState(id, 'PauseSandbox', ['RUNNING']);
      await this.o.vms.pause(rec.vm?.vmId ?? id);
      rec.state = 'PAUSED';
      this.touch(rec);
      return rec;
    });
  }

  /**
   * resume thaws a PAUSED sandbox, or boots a DRAINED one again on its own disks (same id,
   * metadata and /workspace; a new pid). Errors: NOT_FOUND, FAILED_PRECONDITION (not PAUSED or
   * DRAINED, or a device of a drained sandbox is not attached).
   */
  resume(id: string): Promise<SandboxRecord> {
    this.get(id);
    return this.gated(id, async () => {
      const rec = this.requireState(id, 'ResumeSandbox', ['PAUSED', 'DRAINED']);
      if (rec.state === 'DRAINED') return this.coldStart(rec);
      await this.o.vms.resume(rec.vm?.vmId ?? id);
      rec.state = 'RUNNING';
      this.touch(rec);
      return rec;
    });
  }

  private async coldStart(rec: SandboxRecord): Promise<SandboxRecord> {
    const paths: Partial<Record<'rootfs-upper' | 'workspace', string>> = {};
    for (const d of rec.devices) {
      const live = await this.o.devices.get(d.deviceId);
      if (!live?.attached) throw new FailedPreconditionError(`sandbox ${rec.sandboxId}: device ${d.deviceId} is not attached (is ublk-manager running?)`);
      d.path = live.path;
      paths[d.role] = live.path;
    }
    if (!paths['rootfs-upper'] || !paths.workspace) throw new FailedPreconditionError(`sandbox ${rec.sandboxId}: its record lacks a device`);
    await this.bootVm(rec);
    this.o.log.info({ sandbox_id: rec.sandboxId, pid: rec.vm?.pid }, 'drained sandbox started again on its disks');
    return rec;
  }

  /**
   * bootVm starts rec's VM on the devices in its record (their paths must be current), records
   * the VM, waits for podd and persists RUNNING. The VM id is the recorded one (or the sandbox
   * id), its hostname the sandbox id, its /etc/machine-id the record's; a fork child also
   * gets env SANDNODE_FORKED_FROM=<parent id>.
   */
  private async bootVm(rec: SandboxRecord): Promise<void> {
    const upper = rec.devices.find((d) => d.role === 'rootfs-upper');
    const ws = rec.devices.find((d) => d.role === 'workspace');
    if (!upper || !ws) throw new FailedPreconditionError(`sandbox ${rec.sandboxId}: its record lacks a device`);
    const dir = sandboxDir(this.o.runDir, rec.sandboxId);
    await mkdir(dir, { recursive: true, mode: 0o700 });
    const vm = await this.o.vms.create({
      vmId: rec.vm?.vmId ?? rec.sandboxId,
      templateRootfs: rec.templateRootfs,
      upperPath: upper.path,
      workspacePath: ws.path,
      resources: rec.resources,
      poddSocketDir: dir,
      hostname: rec.sandboxId,
      env: rec.forkedFrom ? { [FORKED_FROM_ENV]: rec.forkedFrom } : {},
      machineId: rec.machineId,
    });
    rec.vm = { vmId: vm.vmId, driver: vm.driver, pid: vm.pid, startTimeTicks: vm.startTimeTicks, driverVersion: vm.driverVersion, apiSocket: vm.apiSocket };
    this.touch(rec);
    await this.waitForPodd(rec);
    rec.state = 'RUNNING';
    rec.resumeMethod = '';
    this.touch(rec);
  }

  /**
   * drainOne persists a live sandbox for a node drain: freeze, stop its VM (its filesystems are
   * unmounted, so flushed; its devices stay), record DRAINED with resume method "cold-start".
   */
  drainOne(id: string): Promise<void> {
    return this.locks.run(id, async () => {
      const rec = this.requireState(id, 'Drain', ['RUNNING', 'PAUSED']);
      const vmId = rec.vm?.vmId ?? id;
      if (rec.state === 'RUNNING') await this.o.vms.pause(vmId);
      await this.o.vms.delete(vmId);
      this.o.podd.forget(rec.poddAddress);
      rec.state = 'DRAINED';
      rec.resumeMethod = 'cold-start';
      this.touch(rec);
    });
  }

  /**
   * fork makes a RUNNING child whose rootfs upper (the parent's current generation) and
   * workspace are CoW clones of the parent's, taken at one point in time (see
   * SandboxService.ForkSandbox for the contract). Order: check the ublk-manager's features
   * (nothing made yet) -> persist the child CREATING -> hold the parent (podd Quiesce; or pause
   * when its podd lacks "podd.quiesce"; nothing for a PAUSED parent) -> CloneDevice upper and
   * workspace -> release the parent -> boot the child. A failure after the child record exists
   * tears the child down; a crash is finished by adoption (CREATING -> torn down, a parent
   * paused for the fork -> resumed, a parent frozen -> thawed by podd's watchdog).
   */
  async fork(args: ForkSandboxArgs): Promise<ForkResult> {
    requireSandboxId('parent_id', args.parentId);
    const metadata = validateMetadata('metadata', args.metadata);
    const timeoutSeconds = validateTimeoutSeconds('timeout_seconds', args.timeoutSeconds);
    const maxFreezeMs = validateMaxFreezeMs('max_freeze_ms', args.maxFreezeMs);
    const requestId = validateRequestId('request_id', args.requestId);
    if (requestId) {
      const inflight = joinInflight(this.inflight, requestId, `a fork of ${args.parentId}`);
      if (inflight) return inflight as Promise<ForkResult>;
      const existing = this.o.store.findByRequestId(requestId);
      if (existing) return this.existingFork(existing, args.parentId);
    }
    this.get(args.parentId);
    const p = this.gate.run(() => this.forkNow(args.parentId, metadata, timeoutSeconds, maxFreezeMs, requestId));
    return track(this.inflight, requestId, `a fork of ${args.parentId}`, p);
  }

  private existingFork(rec: SandboxRecord, parentId: string): ForkResult {
    if (rec.forkedFrom !== parentId) {
      throw new InvalidArgumentError(`request_id: ${rec.requestId} was used for sandbox ${rec.sandboxId}, which is not a fork of ${parentId}`);
    }
    if (rec.state !== 'RUNNING' && rec.state !== 'PAUSED') {
      throw new FailedPreconditionError(`request_id: ${rec.requestId} made sandbox ${rec.sandboxId}, which is ${rec.state}`);
    }
    return { child: rec, method: 'existing', parentHeldMs: 0, cloneMs: 0, forkMs: 0 };
  }

  private async forkNow(parentId: string, metadata: Record<string, string>, timeoutSeconds: number, maxFreezeMs: number, requestId: string): Promise<ForkResult> {
    const t0 = this.now();
    // Negotiation before anything is made: the device manager must clone (asked now, not from
    // a cache: a handover may have rolled it back).
    const ublk = await this.o.devices.version();
    if (!ublk.features.includes(CLONE_FEATURE)) {
      throw new FailedPreconditionError(`ForkSandbox needs feature "${CLONE_FEATURE}": ublk-manager ${ublk.version} lacks it (upgrade the ublk-manager)`);
    }
    const id = `sb-${randomBytes(8).toString('hex')}`;
    const log = this.o.log.child({ sandbox_id: id, parent_id: parentId });
    return this.locks.run(id, async () => {
      let child: SandboxRecord | undefined;
      try {
        const held = await this.locks.run(parentId, async () => {
          const parent = this.requireState(parentId, 'ForkSandbox', ['RUNNING', 'PAUSED']);
          const { template, templatePoddVersion, templateRootfs, resources, rootfsGeneration } = parent;
          child = this.newRecord(id, { template, templatePoddVersion, templateRootfs, resources: { ...resources }, rootfsGeneration, forkedFrom: parentId }, metadata, timeoutSeconds, requestId);
          this.touch(child);
          return this.cloneParent(parent, child, maxFreezeMs, log);
        });
        const c = child!;
        this.touch(c);
        await this.bootVm(c);
        const forkMs = this.now() - t0;
        log.info({ method: held.method, parent_held_ms: held.parentHeldMs, clone_ms: held.cloneMs, fork_ms: forkMs }, 'sandbox forked');
        return { child: c, ...held, forkMs };
      } catch (err) {
        if (child) {
          log.warn({ err: (err as Error).message }, 'fork failed; tearing the child down');
          child.requestId = '';
          await this.teardown(child).catch((e: unknown) => log.error({ err: (e as Error).message }, 'teardown after failed fork failed; adoption will retry'));
        }
        throw err;
      }
    });
  }

  /**
   * cloneParent holds the parent still, clones its upper and workspace into the child's record
   * (not yet persisted) and releases the parent. Throws AbortedError when the freeze ran out
   * before the clones finished (they may be torn).
   */
  private async cloneParent(parent: SandboxRecord, child: SandboxRecord, maxFreezeMs: number, log: Logger): Promise<Omit<ForkResult, 'child' | 'forkMs'>> {
    const sources = (['rootfs-upper', 'workspace'] as const).map((role) => {
      const d = parent.devices.find((x) => x.role === role);
      if (!d) throw new FailedPreconditionError(`sandbox ${parent.sandboxId}: its record lacks a ${role} device`);
      return d;
    });
    /** deadlineMs: a frozen parent's remaining window (a clone past it is useless; fail fast and thaw) */
    const cloneAll = async (deadlineMs?: number): Promise<number> => {
      failpoint('fork.after-hold');
      const t = this.now();
      // both at once: the parent is held for the longer clone, not for the sum
      const settled = await Promise.allSettled(sources.map((src) => this.o.devices.clone(`${child.sandboxId}-${src.role === 'rootfs-upper' ? 'upper' : 'ws'}`, src.deviceId, true, deadlineMs)));
      settled.forEach((r, i) => {
        if (r.status === 'fulfilled') child.devices.push({ deviceId: r.value.deviceId, role: sources[i]!.role, path: r.value.path, backingFile: r.value.backingFile, sizeBytes: r.value.sizeBytes });
      });
      const failed = settled.find((r): r is PromiseRejectedResult => r.status === 'rejected');
      if (failed) throw failed.reason;
      failpoint('fork.after-clone');
      return this.now() - t;
    };
    const vmId = parent.vm?.vmId ?? parent.sandboxId;
    if (parent.state === 'PAUSED') {
      // a paused sandbox's last writes may still be dirty in the host's page cache, above its
      // devices: flush them, or the clones miss them
      await this.syncHost();
      return { method: 'paused-parent', parentHeldMs: 0, cloneMs: await cloneAll() };
    }

    const podd = this.o.podd.connect(parent.poddAddress);
    // podd of an older template: hold the parent by pausing it; the mark lets adoption resume
    // it if this server dies before the resume.
    const pauseAndClone = async (why: string): Promise<Omit<ForkResult, 'child' | 'forkMs'>> => {
      log.info({ why }, 'fork holds the parent by pausing it');
      parent.forkPausedAtMs = this.now();
      this.touch(parent);
      const t = this.now();
      await this.o.vms.pause(vmId);
      let cloneMs: number;
      try {
        await this.syncHost(); // as for a PAUSED parent: its dirty pages reach the devices first
        cloneMs = await cloneAll();
      } finally {
        await this.o.vms.resume(vmId);
        parent.forkPausedAtMs = 0;
        this.touch(parent);
      }
      return { method: 'pause', parentHeldMs: this.now() - t, cloneMs };
    };
    const poddVersion = await podd.version();
    if (!poddVersion.features.includes(QUIESCE_FEATURE)) return pauseAndClone(`podd ${poddVersion.version} lacks "${QUIESCE_FEATURE}"`);

    const tCall = this.now();
    let freeze: PoddFreeze;
    try {
      freeze = await podd.quiesce(maxFreezeMs);
    } catch (err) {
      // podd could not reach its host's freeze port (e.g. a supervisor rolled back to a release
      // without one): nothing is frozen, so the pause path is safe
      if (isCode(err, Status.UNAVAILABLE) || isCode(err, Status.UNIMPLEMENTED)) return pauseAndClone(`podd Quiesce failed: ${(err as Error).message}`);
      throw err;
    }
    let cloneMs = 0;
    let cloneErr: unknown;
    try {
      cloneMs = await cloneAll(Math.max(1, freeze.maxFreezeMs - (this.now() - tCall)));
    } catch (err) {
      cloneErr = err;
    }
    const cloneEnd = this.now();
    let frozenMs = 0;
    let endedBy: string;
    try {
      const t = await podd.thaw(freeze.token);
      endedBy = t.endedBy;
      frozenMs = t.frozenMs;
    } catch (err) {
      // podd is gone or stuck: its watchdog thaws at the deadline by itself. The clones are
      // consistent if they ended before the earliest possible deadline.
      endedBy = cloneEnd - tCall < freeze.maxFreezeMs ? 'caller' : 'watchdog';
      log.warn({ err: (err as Error).message }, 'Thaw failed; the freeze ends by its watchdog');
    }
    if (cloneErr) throw cloneErr;
    // podd runs inside the sandbox, and so can anything that reaches the freeze port: ask the
    // supervisor whether this freeze really held until the clones were done
    const host = await this.o.vms.freezeStatus(vmId);
    if (host) {
      const early = host.token !== freeze.token ? 'was replaced by another freeze' : !host.frozen && host.endedBy === 'caller' && host.endedAtMs < cloneEnd ? `ended ${cloneEnd - host.endedAtMs} ms before the clone finished` : '';
      if (early) throw new AbortedError(`fork of ${parent.sandboxId}: the parent's freeze ${early} (thawed from inside the sandbox?); the clones may be torn, retry`);
      if (host.endedBy === 'watchdog') endedBy = 'watchdog';
    }
    if (endedBy === 'watchdog') {
      const advice = freeze.maxFreezeMs < MAX_FREEZE_MS ? `retry with a larger max_freeze_ms (at most ${MAX_FREEZE_MS})` : 'the clone takes longer than the longest freeze: pause the sandbox and fork it paused';
      throw new AbortedError(`fork of ${parent.sandboxId}: the parent's ${freeze.maxFreezeMs} ms freeze ran out before the clone finished (${cloneMs} ms); ${advice}`);
    }
    return { method: 'quiesce', parentHeldMs: frozenMs, cloneMs };
  }

  /**
   * resetRootfs gives the sandbox a fresh empty upper over its template and generation + 1,
   * keeping /workspace; processes restart (new pid) and it comes back RUNNING. Order: make the
   * new upper -> record it as reset_upper_device_id -> stop the VM -> record it as the upper
   * (generation + 1) -> delete the old upper -> boot. Adoption finishes or undoes a reset a
   * crash interrupted (see RuntimeRecord.reset_upper_device_id). Errors: INVALID_ARGUMENT,
   * NOT_FOUND, FAILED_PRECONDITION (not RUNNING or PAUSED).
   */
  resetRootfs(id: string): Promise<SandboxRecord> {
    this.get(id);
    return this.gated(id, async () => {
      const rec = this.requireState(id, 'ResetRootfs', ['RUNNING', 'PAUSED']);
      const old = rec.devices.find((d) => d.role === 'rootfs-upper');
      if (!old) throw new FailedPreconditionError(`sandbox ${id}: its record lacks a rootfs-upper device`);
      const generation = (rec.rootfsGeneration || 1) + 1;
      const fresh = await this.o.devices.createEmpty(`${id}-upper-g${generation}`, this.o.upperBytes ?? DEFAULT_UPPER_BYTES);
      rec.resetUpperDeviceId = fresh.deviceId;
      this.touch(rec);
      await this.o.vms.delete(rec.vm?.vmId ?? id);
      this.o.podd.forget(rec.poddAddress);
      failpoint('reset.after-stop');
      this.switchUpper(rec, fresh, generation);
      await this.o.devices.delete(old.deviceId);
      await this.bootVm(rec);
      this.o.log.info({ sandbox_id: id, generation, pid: rec.vm?.pid }, 'rootfs reset');
      return rec;
    });
  }

  /**
   * switchUpper makes fresh the record's upper at generation and persists it DRAINED (VM
   * stopped, disks kept, resume method "cold-start"), so a crash before the boot leaves a
   * sandbox that ResumeSandbox starts on the new rootfs.
   */
  switchUpper(rec: SandboxRecord, fresh: DeviceInfo, generation: number): void {
    rec.devices = rec.devices.filter((d) => d.role !== 'rootfs-upper');
    rec.devices.unshift({ deviceId: fresh.deviceId, role: 'rootfs-upper', path: fresh.path, backingFile: fresh.backingFile, sizeBytes: fresh.sizeBytes });
    rec.rootfsGeneration = generation;
    rec.resetUpperDeviceId = '';
    rec.state = 'DRAINED';
    rec.resumeMethod = 'cold-start';
    this.touch(rec);
  }

  /** delete tears the sandbox down and removes its record. Errors: NOT_FOUND. */
  delete(id: string): Promise<void> {
    this.get(id);
    return this.gated(id, async () => {
      const rec = this.o.store.get(id);
      if (!rec) throw new NotFoundError(`sandbox ${id} not found`);
      await this.teardown(rec);
      this.o.log.info({ sandbox_id: id }, 'sandbox deleted');
    });
  }

  /**
   * teardown removes VM, devices, runtime dir and finally the record (marked DELETING first,
   * so a crash in between is finished by adoption).
   */
  async teardown(rec: SandboxRecord): Promise<void> {
    rec.state = 'DELETING';
    this.touch(rec);
    await this.o.vms.delete(rec.vm?.vmId ?? rec.sandboxId);
    this.o.podd.forget(rec.poddAddress);
    for (const d of ownedDeviceIds(rec)) await this.o.devices.delete(d);
    await rm(sandboxDir(this.o.runDir, rec.sandboxId), { recursive: true, force: true });
    this.o.store.delete(rec.sandboxId);
  }

  /** setTimeout sets the lifetime from now (0: none). Errors: INVALID_ARGUMENT, NOT_FOUND. */
  setTimeout(id: string, seconds: number): Promise<SandboxRecord> {
    validateTimeoutSeconds('timeout_seconds', seconds);
    this.get(id);
    return this.gated(id, async () => {
      const rec = this.get(id);
      rec.expiresAtMs = seconds ? this.now() + seconds * 1000 : 0;
      this.touch(rec);
      return rec;
    });
  }

  /** templateInUse says whether a record or a create in flight uses the template. */
  templateInUse(name: string): string | undefined {
    if (this.creatingFrom.has(name)) return 'a create from it is in progress';
    const users = this.o.store.list().filter((r) => r.template === name);
    return users.length ? `it is used by ${users.length} sandbox(es), e.g. ${users[0]?.sandboxId}` : undefined;
  }

  /**
   * checkLiveness marks ERROR every RUNNING or PAUSED sandbox whose VM process is gone (pid +
   * start ticks no longer match, or a zombie), so that the API does not report a dead sandbox
   * as running. Cheap: reads /proc only. Returns the ids marked.
   */
  async checkLiveness(): Promise<string[]> {
    const marked: string[] = [];
    for (const r of this.o.store.list()) {
      if ((r.state !== 'RUNNING' && r.state !== 'PAUSED') || !r.vm || this.locks.busy(r.sandboxId)) continue;
      if (vmAlive(r.vm.pid, r.vm.startTimeTicks)) continue;
      await this.locks.run(r.sandboxId, async () => {
        const rec = this.o.store.get(r.sandboxId);
        if (!rec?.vm || (rec.state !== 'RUNNING' && rec.state !== 'PAUSED') || vmAlive(rec.vm.pid, rec.vm.startTimeTicks)) return;
        rec.state = 'ERROR';
        rec.errorMessage = `its VM process (pid ${rec.vm.pid}) is gone`;
        this.touch(rec);
        this.o.podd.forget(rec.poddAddress);
        marked.push(rec.sandboxId);
        this.o.log.error({ sandbox_id: rec.sandboxId, pid: rec.vm.pid }, 'sandbox VM process is gone: marked ERROR');
      });
    }
    return marked;
  }

  /**
   * retryTeardowns finishes sandboxes left DELETING (or CREATING) by a create or delete whose
   * teardown failed because a peer was unavailable: the teardown is tried again (it is
   * idempotent) for records untouched for at least minAgeMs. Returns the ids finished.
   */
  async retryTeardowns(minAgeMs = 2000): Promise<string[]> {
    const done: string[] = [];
    const now = this.now();
    for (const r of this.o.store.list()) {
      if ((r.state !== 'DELETING' && r.state !== 'CREATING') || now - r.updatedAtMs < minAgeMs || this.locks.busy(r.sandboxId)) continue;
      if (r.state === 'CREATING' && this.inflight.has(r.requestId)) continue;
      await this.locks
        .run(r.sandboxId, async () => {
          const rec = this.o.store.get(r.sandboxId);
          if (!rec || (rec.state !== 'DELETING' && rec.state !== 'CREATING') || this.now() - rec.updatedAtMs < minAgeMs) return;
          await this.teardown(rec);
          done.push(rec.sandboxId);
          this.o.log.info({ sandbox_id: rec.sandboxId }, 'finished an interrupted teardown');
        })
        .catch((err: unknown) => this.o.log.warn({ sandbox_id: r.sandboxId, err: (err as Error).message }, 'teardown retry failed; will try again'));
    }
    return done;
  }

  /** expired returns the ids whose lifetime has passed (for the reaper). */
  expired(): string[] {
    const now = this.now();
    return this.o.store
      .list()
      .filter((r) => r.expiresAtMs > 0 && r.expiresAtMs <= now && (r.state === 'RUNNING' || r.state === 'PAUSED' || r.state === 'ERROR' || r.state === 'DRAINED'))
      .map((r) => r.sandboxId);
  }

  /** exec runs a command through the sandbox's podd. Errors: see SandboxService.Exec. */
  exec(id: string, args: ExecArgs, signal: AbortSignal): AsyncIterable<ExecEvent> {
    validateArgv('argv', args.argv);
    validateChunk('stdin', args.stdin.length);
    const rec = this.requireState(id, 'Exec', ['RUNNING']);
    return this.o.podd.connect(rec.poddAddress).exec({ ...args, cwd: args.cwd || '/workspace' }, signal);
  }

  /** readFile reads below /workspace. Errors: INVALID_ARGUMENT (path), NOT_FOUND, FAILED_PRECONDITION. */
  async readFile(id: string, p: string, offset: number, length: number): Promise<{ data: Uint8Array; sizeBytes: number; eof: boolean }> {
    const abs = workspacePath('path', p);
    validateChunk('length', length);
    const rec = this.requireState(id, 'ReadFile', ['RUNNING']);
    return this.o.podd.connect(rec.poddAddress).readFile(abs, offset, length || MAX_FILE_CHUNK_BYTES);
  }

  /** writeFile writes below /workspace (fsync'd by podd). Errors as readFile. */
  async writeFile(id: string, p: string, data: Uint8Array, mode: number, append: boolean): Promise<{ sizeBytes: number }> {
    const abs = workspacePath('path', p);
    validateChunk('data', data.length);
    if (mode > 0o777) throw new InvalidArgumentError(`mode: ${mode.toString(8)} is not a permission mode (0..0777)`);
    const rec = this.requireState(id, 'WriteFile', ['RUNNING']);
    return this.o.podd.connect(rec.poddAddress).writeFile(abs, data, mode, append);
  }

  private requireState(id: string, op: string, states: SandboxState[]): SandboxRecord {
    const rec = this.get(id);
    if (!states.includes(rec.state)) {
      throw new FailedPreconditionError(`sandbox ${id} is ${rec.state}; ${op} needs ${states.join(' or ')}`);
    }
    return rec;
  }

  /** touch stamps updatedAtMs and persists (durable on return). */
  touch(rec: SandboxRecord): void {
    rec.updatedAtMs = this.now();
    this.o.store.put(rec);
  }

  /** gated runs a lifecycle operation through the handover gate and the sandbox's lock. */
  private gated<T>(id: string, fn: () => Promise<T>): Promise<T> {
    return this.gate.run(() => this.locks.run(id, fn));
  }

  /** withLock runs fn under the sandbox's lock (adoption uses it). */
  withLock<T>(id: string, fn: () => Promise<T>): Promise<T> {
    return this.locks.run(id, fn);
  }
}
