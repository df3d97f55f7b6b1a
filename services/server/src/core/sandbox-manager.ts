/**
 * SandboxManager: the sandbox lifecycle of the active server: create, get, list, pause,
 * resume, delete, set timeout, and the boot and teardown every other operation builds on.
 * The other operations live beside it and are reached through its methods: fork.ts (+
 * parent-hold.ts), reset-rootfs.ts, reaper.ts (liveness, retried teardowns, expiry),
 * guest-io.ts (Exec and files through podd); request_id idempotency is request-tracker.ts;
 * which state may follow which is transitions.ts (its header has the diagram).
 *
 * Every transition is persisted in the record store (durable on return) before it is
 * acknowledged. Operations on one sandbox are serialized; different sandboxes run
 * concurrently. A crash at any step leaves a record that adoption (adoption.ts) finishes:
 * CREATING and DELETING records are torn down, RUNNING/PAUSED ones are verified and kept.
 */
import { randomBytes } from 'node:crypto';
import { FailedPreconditionError, InvalidArgumentError, KeyedMutex, NotFoundError, requireSandboxId, run, SANDBOX_ID_RE, UnavailableError, type Logger } from '@sandnode/shared';
import type { CoreContext, RecordOrigin } from './context';
import { drainOne, type DrainProgress } from './drain';
import { fork as forkSandbox, type ForkResult, type ForkSandboxArgs } from './fork';
import { LifecycleGate } from './gate';
import { DEFAULT_AUTO_RESUME_TIMEOUT_MS, DEFAULT_IDLE_ACTIVITY_FLUSH_MS, IdleController, keepAlive, newIdleRef, validateIdle, type IdleSettingsRequest } from './idle';
import { execStream, listProcesses, signalProcess, type ExecInput, type ExecStreamEvent, type ExecStreamFirst, type ProcessInfo } from './exec-stream';
import { DEFAULT_MAX_EXEC_STREAMS, exec as guestExec, ExecStreams, readFile as guestReadFile, writeFile as guestWriteFile } from './guest-io';
import { AccessTokens, ACCESS_TOKEN_BYTES, planNetwork, syncDirectory, validateNetworkRequest, type NetworkChoice, type NetworkRequest } from './network';
import { reapplyPolicies, updateNetwork, type UpdateNetworkArgs } from './network-update';
import { MapNetworkDirectory } from './network-directory';
import { checkLiveness, expired, recoverLiveness, retryTeardowns, type LivenessRecovery } from './reaper';
import { WarmPool } from './pool';
import { claimFromPool } from './pool-claim';
import { DEFAULT_POOL_FILL_CONCURRENCY, DEFAULT_POOL_HEALTH_INTERVAL_MS, isPoolMember, type PoolConfig, type PoolConfigStore } from './pool-config';
import { bootVm, coldStart, DEFAULT_PODD_READY_TIMEOUT_MS, DEFAULT_UPPER_BYTES, newRecord, newSandboxId, PODD_HEALTH_CALL_MS, requireDeviceManager, teardown } from './provision';
import { RequestTracker } from './request-tracker';
import { resetRootfs, switchUpper } from './reset-rootfs';
import { requireState, transition, type Operation } from './transitions';
import type { DeviceInfo, DevicePort, ExecArgs, ExecEvent, PoddConnector, PoolMark, RecordStore, Resources, SandboxRecord, SandboxState, TemplateCatalog, VmPort } from './types';
import { validateMetadata, validateRequestId, validateResources, validateSandboxEnv, validateTemplateName, validateTimeoutSeconds, type ResourceDefaults } from './validate';

export type { ForkMethod, ForkResult, ForkSandboxArgs } from './fork';
export { DEFAULT_PODD_READY_TIMEOUT_MS, DEFAULT_UPPER_BYTES, FORKED_FROM_ENV, ownedDeviceIds } from './provision';

/** Longest a host sync before a paused parent's clone may take, ms. */
export const DEFAULT_HOST_SYNC_TIMEOUT_MS = 120_000;
/** ListSandboxes page size when the request says 0. */
export const DEFAULT_PAGE_SIZE = 100;
/** Largest ListSandboxes page size. */
export const MAX_PAGE_SIZE = 1000;
/**
 * Most bytes of sandboxes a ListSandboxes page carries (2 MiB, half gRPC's 4 MiB message limit;
 * a record is at most MAX_RECORD_BYTES, 1 MiB, so a page with one sandbox always fits).
 */
export const MAX_PAGE_BYTES = 2 * 1024 * 1024;

export interface SandboxManagerOptions {
  store: RecordStore;
  vms: VmPort;
  devices: DevicePort;
  podd: PoddConnector;
  templates: TemplateCatalog;
  log: Logger;
  runDir: string;
  resourceDefaults: ResourceDefaults;
  /** size of each rootfs upper, bytes (default DEFAULT_UPPER_BYTES) */
  upperBytes?: number;
  /** time podd gets to answer after a VM starts, ms (default DEFAULT_PODD_READY_TIMEOUT_MS) */
  poddReadyTimeoutMs?: number;
  /** most Exec streams running at once per sandbox (default DEFAULT_MAX_EXEC_STREAMS); one more is RESOURCE_EXHAUSTED */
  maxExecStreamsPerSandbox?: number;
  /** longest host sync before a clone, ms (default DEFAULT_HOST_SYNC_TIMEOUT_MS) */
  hostSyncTimeoutMs?: number;
  /**
   * syncHost flushes dirty data of every filesystem of the host to its device (default: the
   * `sync` command, sync(2), which covers every superblock whatever mount namespace it is
   * mounted in). A fork runs it before cloning a paused parent.
   */
  syncHost?: () => Promise<void>;
  now?: () => number;
  /**
   * the proxies' view of the networked sandboxes, kept in step with the records (default a new
   * one); one per process in main.ts, so that the proxies keep it across activations
   */
  directory?: MapNetworkDirectory;
  /** the node key of the access tokens (network.ts, loadAccessTokenKey); default a random one (tests) */
  accessTokenKey?: Buffer;
  /** how long a call waits for an auto-resume, ms (default DEFAULT_AUTO_RESUME_TIMEOUT_MS; idle.ts) */
  autoResumeTimeoutMs?: number;
  /** activity is written to the records at most this often, ms (default DEFAULT_IDLE_ACTIVITY_FLUSH_MS; idle.ts) */
  idleActivityFlushMs?: number;
  /**
   * warm pools (pool.ts): where their configs are kept, member creates at once (default
   * DEFAULT_POOL_FILL_CONCURRENCY), health interval of a waiting member, ms (default
   * DEFAULT_POOL_HEALTH_INTERVAL_MS); absent (or a store without claimPoolMember): no pools
   */
  pool?: { configs: PoolConfigStore; fillConcurrency?: number; healthIntervalMs?: number };
}

/** What CreateSandbox answers besides the record. */
export interface CreateResult {
  rec: SandboxRecord;
  /** why a template with a pool was created cold ("" from the pool or without a pool) */
  poolMiss: string;
  /** true when the request_id named a create made earlier or still in flight: this call created nothing */
  repeat?: boolean;
}

export interface CreateSandboxArgs {
  template: string;
  timeoutSeconds: number;
  metadata: Record<string, string>;
  resources: Partial<Resources> | undefined;
  requestId: string;
  /** CreateSandboxRequest.network; undefined: not set (the node's default) */
  network?: NetworkRequest;
  /** CreateSandboxRequest.idle; undefined: no idle actions (idle.ts) */
  idle?: IdleSettingsRequest;
  /** CreateSandboxRequest.env: the environment of every command in the sandbox; undefined: none */
  env?: Record<string, string>;
}

export type { UpdateNetworkArgs } from './network-update';

export interface ListSandboxesArgs {
  states: SandboxState[];
  metadata: Record<string, string>;
  pageSize: number;
  pageToken: string;
  /** the encoded size of a record in the answer, bytes (the rpc layer's); none: pages are cut by count only */
  sizeOf?: (r: SandboxRecord) => number;
  /** most bytes of records (by sizeOf) a page holds (default MAX_PAGE_BYTES) */
  maxPageBytes?: number;
}

export class SandboxManager {
  private readonly locks = new KeyedMutex();
  /** Closed during a handover: lifecycle operations are held, then UNAVAILABLE. */
  readonly gate = new LifecycleGate();
  private readonly now: () => number;
  /** Creates in flight per template (a template rebuild is refused while one runs). */
  private readonly creatingFrom = new Map<string, number>();
  /** Creates and forks in flight by request id, so that a retry joins the first call. */
  private readonly requests = new RequestTracker();
  private readonly vms: VmPort;
  private readonly devices: DevicePort;
  /** What fork.ts, reset-rootfs.ts, reaper.ts and guest-io.ts work with. */
  private readonly ctx: CoreContext;
  /** The proxies' view of the networked sandboxes (set after every persist, removed at delete). */
  readonly directory: MapNetworkDirectory;
  /** Ingress access tokens of the sandboxes. */
  readonly tokens: AccessTokens;
  /** Activity, auto-resume and idle actions (idle.ts). */
  readonly idle: IdleController;
  /** The warm pools (undefined without pool configs). */
  readonly pool: WarmPool | undefined;
  /** User creates that boot (not from the pool) in flight: the pool refills only while none runs. */
  private coldCreates = 0;

  constructor(private readonly o: SandboxManagerOptions) {
    this.now = o.now ?? Date.now;
    // peers map host errors before they get here (peers/peer-errors.ts)
    this.vms = o.vms;
    this.devices = o.devices;
    const syncTimeoutMs = o.hostSyncTimeoutMs ?? DEFAULT_HOST_SYNC_TIMEOUT_MS;
    const syncHost = o.syncHost ?? (async () => void (await run('sync', [], { timeoutMs: syncTimeoutMs })));
    this.directory = o.directory ?? new MapNetworkDirectory();
    this.tokens = new AccessTokens(o.accessTokenKey ?? randomBytes(ACCESS_TOKEN_BYTES));
    this.ctx = {
      store: o.store,
      vms: this.vms,
      devices: this.devices,
      podd: o.podd,
      log: o.log,
      runDir: o.runDir,
      upperBytes: o.upperBytes ?? DEFAULT_UPPER_BYTES,
      poddReadyTimeoutMs: o.poddReadyTimeoutMs ?? DEFAULT_PODD_READY_TIMEOUT_MS,
      execStreams: new ExecStreams(o.maxExecStreamsPerSandbox ?? DEFAULT_MAX_EXEC_STREAMS),
      locks: this.locks,
      gate: this.gate,
      requests: this.requests,
      directory: this.directory,
      tokens: this.tokens,
      unsurePolicies: new Set<string>(),
      now: () => this.now(),
      syncHost,
      get: (id) => this.get(id),
      requireState: (id, op) => this.requireState(id, op),
      touch: (rec) => this.touch(rec),
      gated: (id, fn, signal) => this.gated(id, fn, signal),
    };
    this.idle = new IdleController(this.ctx, {
      autoResumeTimeoutMs: o.autoResumeTimeoutMs ?? DEFAULT_AUTO_RESUME_TIMEOUT_MS,
      flushMs: o.idleActivityFlushMs ?? DEFAULT_IDLE_ACTIVITY_FLUSH_MS,
      resume: (id) => this.resume(id),
    });
    const pool = o.pool;
    this.pool =
      pool && o.store.claimPoolMember
        ? new WarmPool({
            store: o.store,
            configs: pool.configs,
            log: o.log.child({ component_part: 'warm-pool' }),
            now: () => this.now(),
            resourceDefaults: o.resourceDefaults,
            fillConcurrency: pool.fillConcurrency ?? DEFAULT_POOL_FILL_CONCURRENCY,
            healthIntervalMs: pool.healthIntervalMs ?? DEFAULT_POOL_HEALTH_INTERVAL_MS,
            createMember: (c, resources) => this.createPoolMember(c, resources),
            deleteMember: (id) => this.delete(id),
            healthy: (rec) => o.podd.connect(rec.poddAddress).health(PODD_HEALTH_CALL_MS),
            templateRootfs: async (name) => (await o.templates.get(name))?.rootfsPath,
            coldCreatesInFlight: () => this.coldCreates,
            active: () => this.gate.isOpen,
          })
        : undefined;
  }

  /** get returns the record of id. Errors: INVALID_ARGUMENT (malformed id), NOT_FOUND. */
  get(id: string): SandboxRecord {
    requireSandboxId('sandbox_id', id);
    const rec = this.o.store.get(id);
    if (!rec) throw new NotFoundError(`sandbox ${id} not found`);
    return rec;
  }

  /**
   * list filters and pages the records (ordered by id). A states filter never matches a record
   * whose state is UNKNOWN (unknown to this version). A page holds at most page_size records
   * and, when args.sizeOf is given, stops before their sizes (bytes) would pass args.maxPageBytes
   * (default MAX_PAGE_BYTES; the first record always fits); nextPageToken (the last id,
   * base64url) is set when matches remain. Errors: INVALID_ARGUMENT (page_size above
   * MAX_PAGE_SIZE, a foreign token).
   */
  list(args: ListSandboxesArgs): { sandboxes: SandboxRecord[]; nextPageToken: string } {
    if (args.pageSize > MAX_PAGE_SIZE) throw new InvalidArgumentError(`page_size: ${args.pageSize} is above ${MAX_PAGE_SIZE}`);
    const size = args.pageSize || DEFAULT_PAGE_SIZE;
    let after = '';
    if (args.pageToken) {
      after = Buffer.from(args.pageToken, 'base64url').toString('utf8');
      if (!SANDBOX_ID_RE.test(after)) throw new InvalidArgumentError('page_token: not a token from ListSandboxes');
    }
    const mdFilter = Object.entries(args.metadata);
    const matches = this.o.store
      .list()
      .filter((r) => r.sandboxId > after)
      // warm-pool members are no user's sandboxes (pool.ts)
      .filter((r) => !isPoolMember(r))
      // a state this version cannot name (UNKNOWN: a newer server's, say 7 or 9) matches no filter,
      // not even one naming a value this version does not know; an unfiltered list shows it
      .filter((r) => args.states.length === 0 || (r.state !== 'UNKNOWN' && args.states.includes(r.state)))
      .filter((r) => mdFilter.every(([k, v]) => r.metadata[k] === v));
    const maxBytes = args.maxPageBytes ?? MAX_PAGE_BYTES;
    const page: SandboxRecord[] = [];
    let bytes = 0;
    for (const r of matches) {
      if (page.length >= size) break;
      const n = args.sizeOf ? args.sizeOf(r) : 0;
      if (page.length > 0 && bytes + n > maxBytes) break;
      page.push(r);
      bytes += n;
    }
    const last = page[page.length - 1];
    const nextPageToken = matches.length > page.length && last ? Buffer.from(last.sandboxId).toString('base64url') : '';
    return { sandboxes: page, nextPageToken };
  }

  /**
   * create makes devices and a VM from a template and waits for podd. Returns the RUNNING
   * record. signal (the caller went away) stops the wait to enter the handover gate and, for a
   * create without request_id (no retry can join it), undoes the create at whatever step it is
   * (devices, VM, the wait for podd, the commit to RUNNING: nobody could learn its id); with a
   * request_id the create goes on and a retry joins it. Errors:
   * INVALID_ARGUMENT, NOT_FOUND (template), DEADLINE_EXCEEDED (podd did not answer within
   * poddReadyTimeoutMs), FAILED_PRECONDITION (request_id of a sandbox that is gone), and those
   * of the peers; on failure everything made is torn down and the record removed.
   */
  async create(args: CreateSandboxArgs, signal?: AbortSignal): Promise<SandboxRecord> {
    return (await this.createDetailed(args, signal)).rec;
  }

  /**
   * createDetailed is create that also says why a template with a warm pool was created cold.
   * A create of a template with a pool first claims a member (pool-claim.ts: one
   * compare-and-swap of its record, then the request's metadata, timeout and policy) and boots
   * only when there is none or it cannot give what is asked. Errors: those of create.
   */
  async createDetailed(args: CreateSandboxArgs, signal?: AbortSignal): Promise<CreateResult> {
    const template = validateTemplateName('template', args.template);
    const timeoutSeconds = validateTimeoutSeconds('timeout_seconds', args.timeoutSeconds);
    const metadata = validateMetadata('metadata', args.metadata);
    const resources = validateResources('resources', args.resources, this.o.resourceDefaults);
    const requestId = validateRequestId('request_id', args.requestId);
    const network = validateNetworkRequest('network', args.network);
    const idle = validateIdle('idle', args.idle);
    const env = validateSandboxEnv('env', args.env);
    const what = `a create from template ${template}`;
    if (requestId) {
      const inflight = this.requests.join<CreateResult>(requestId, what);
      if (inflight) return { ...(await inflight), repeat: true };
      const existing = this.o.store.findByRequestId(requestId);
      if (existing) return { rec: this.existingCreate(existing, template, { metadata, network }), poolMiss: '', repeat: true };
    }
    const bootSignal = requestId ? undefined : signal;
    // Registered before the first await, so a parallel create with the same request_id joins it.
    const p = this.gate.run(async () => {
      this.creatingFrom.set(template, (this.creatingFrom.get(template) ?? 0) + 1);
      try {
        // a claim first: the template's members are retired before a rebuild or removal of it (pool.ts), so a member needs no template lookup
        let poolMiss = '';
        if (this.pool) {
          const got = await claimFromPool(this.ctx, this.pool, { template, resources, metadata, timeoutSeconds, requestId, network, idle: idle && newIdleRef(idle, this.now()), env });
          if (got.rec) {
            this.o.log.info({ sandbox_id: got.rec.sandboxId, template, pool: got.rec.pool?.key }, 'sandbox claimed from the warm pool');
            return { rec: got.rec, poolMiss: '' };
          }
          poolMiss = got.miss;
        }
        const tpl = await this.o.templates.get(template);
        if (!tpl) throw await templateNotFound(this.o.templates, template);
        const origin: RecordOrigin = {
          template,
          templatePoddVersion: tpl.poddVersion,
          templateRootfs: tpl.rootfsPath,
          resources,
          rootfsGeneration: 1,
          forkedFrom: '',
          idle: idle && newIdleRef(idle, this.now()),
          env,
        };
        this.coldCreates++;
        try {
          return { rec: await this.createFromTemplate(origin, timeoutSeconds, metadata, requestId, network, bootSignal), poolMiss };
        } finally {
          this.coldCreates--;
          if (this.coldCreates === 0) this.pool?.fill();
        }
      } finally {
        const n = (this.creatingFrom.get(template) ?? 1) - 1;
        if (n > 0) this.creatingFrom.set(template, n);
        else this.creatingFrom.delete(template);
      }
    }, signal);
    return this.requests.track(requestId, what, p);
  }

  /**
   * createPoolMember boots a READY member of pool c by the normal create path (through the
   * handover gate; no metadata, timeout or request_id; the node's default network).
   */
  private createPoolMember(c: PoolConfig, resources: Resources): Promise<SandboxRecord> {
    return this.gate.run(async () => {
      this.creatingFrom.set(c.template, (this.creatingFrom.get(c.template) ?? 0) + 1);
      try {
        const tpl = await this.o.templates.get(c.template);
        if (!tpl) throw await templateNotFound(this.o.templates, c.template);
        const origin: RecordOrigin = { template: c.template, templatePoddVersion: tpl.poddVersion, templateRootfs: tpl.rootfsPath, resources, rootfsGeneration: 1, forkedFrom: '' };
        return await this.createFromTemplate(origin, 0, {}, '', undefined, undefined, { key: c.key, state: 'READY', claimedAtMs: 0 });
      } finally {
        const n = (this.creatingFrom.get(c.template) ?? 1) - 1;
        if (n > 0) this.creatingFrom.set(c.template, n);
        else this.creatingFrom.delete(c.template);
      }
    });
  }

  /** existingCreate answers a repeated request_id: the same sandbox, if it still lives. */
  /**
   * existingCreate is the sandbox an earlier create with this request_id made, when this repeat
   * asks for the same (template, metadata, no network): a repeat that asks otherwise is refused
   * with INVALID_ARGUMENT naming what differs (newcomer: `--no-network --metadata a=b` silently
   * got the first create's networked, unlabelled sandbox), as Kubernetes refuses a second create
   * of a name with another spec.
   */
  private existingCreate(rec: SandboxRecord, template: string, asked: { metadata: Record<string, string>; network: NetworkChoice }): SandboxRecord {
    if (rec.pool?.state === 'CLAIMING') throw new UnavailableError(`request_id: ${rec.requestId}: the claim of sandbox ${rec.sandboxId} was cut and it is being torn down; retry to create anew`);
    if (rec.forkedFrom) throw new InvalidArgumentError(`request_id: ${rec.requestId} was used for sandbox ${rec.sandboxId}, a fork of ${rec.forkedFrom}`);
    if (rec.template !== template) {
      throw new InvalidArgumentError(`request_id: ${rec.requestId} was used for sandbox ${rec.sandboxId} from template ${rec.template}`);
    }
    if (rec.state !== 'RUNNING' && rec.state !== 'PAUSED') {
      throw new FailedPreconditionError(`request_id: ${rec.requestId} made sandbox ${rec.sandboxId}, which is ${rec.state}`);
    }
    const sorted = (m: Record<string, string>) => JSON.stringify(Object.entries(m).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
    if (sorted(rec.metadata) !== sorted(asked.metadata))
      throw new InvalidArgumentError(`request_id: ${rec.requestId} was used for sandbox ${rec.sandboxId} with other metadata; a repeat must ask for the same (use a new request_id for a new sandbox)`);
    if (asked.network === 'disabled' && rec.network && rec.network.slot >= 0)
      throw new InvalidArgumentError(`request_id: ${rec.requestId} was used for sandbox ${rec.sandboxId}, which has a network; this repeat asks for none (use a new request_id for a new sandbox)`);
    return rec;
  }

  private async createFromTemplate(
    origin: RecordOrigin,
    timeoutSeconds: number,
    metadata: Record<string, string>,
    requestId: string,
    network: ReturnType<typeof validateNetworkRequest>,
    signal: AbortSignal | undefined,
    pool?: PoolMark,
  ): Promise<SandboxRecord> {
    const id = newSandboxId();
    const log = this.o.log.child({ sandbox_id: id });
    const rec = newRecord(this.ctx, id, origin, metadata, timeoutSeconds, requestId);
    if (pool) rec.pool = pool;
    // the step timings of the create (ms each, in the 'sandbox created' log line; the bench's pool section sums them up)
    const steps: Record<string, number> = {};
    let last = performance.now();
    const mark = (step: string) => {
      const t = performance.now();
      steps[step] = Math.round((t - last) * 10) / 10;
      last = t;
    };
    return this.locks.run(id, async () => {
      mark('lockWait');
      signal?.throwIfAborted(); // nothing made yet
      await requireDeviceManager(this.ctx, 'CreateSandbox');
      mark('ublkVersion');
      await this.vms.reachable?.(signal); // a supervisor that is down: UNAVAILABLE naming it, nothing made
      mark('vmmReachable');
      // what the node can give, decided before anything is made (FAILED_PRECONDITION leaves nothing)
      rec.network = await planNetwork(this.vms, network, 'CreateSandbox', this.tokens, id);
      mark('planNetwork');
      signal?.throwIfAborted();
      this.o.store.put(rec);
      mark('recordCreating');
      const t0 = this.now();
      try {
        const upper = await this.devices.createEmpty(`${id}-upper`, this.ctx.upperBytes);
        rec.devices.push({ deviceId: upper.deviceId, role: 'rootfs-upper', path: upper.path, backingFile: upper.backingFile, sizeBytes: upper.sizeBytes });
        mark('upperDevice');
        signal?.throwIfAborted();
        const ws = await this.devices.createEmpty(`${id}-ws`, origin.resources.diskBytes);
        rec.devices.push({ deviceId: ws.deviceId, role: 'workspace', path: ws.path, backingFile: ws.backingFile, sizeBytes: ws.sizeBytes });
        mark('workspaceDevice');
        this.touch(rec);
        mark('recordDevices');
        // bootVm looks at signal after every step and commits RUNNING only if the caller is
        // still there; from its return to the answer there is no await, so the caller cannot
        // go away unseen in between
        await bootVm(this.ctx, rec, signal, mark);
        log.info({ vm_pid: rec.vm?.pid, template: origin.template, ms: this.now() - t0, steps, pool: pool?.key }, 'sandbox created');
        return rec;
      } catch (err) {
        log.warn({ err }, 'create failed; tearing down');
        // the request_id no longer names this attempt: a retry of the create makes a new one
        rec.requestId = '';
        await teardown(this.ctx, rec).catch((e: unknown) => log.error({ err: e }, 'teardown after failed create failed; adoption will retry'));
        throw err;
      }
    });
  }

  /**
   * pause freezes a RUNNING sandbox. signal stops the wait to enter the handover gate.
   * Errors: NOT_FOUND, FAILED_PRECONDITION (not RUNNING).
   */
  pause(id: string, signal?: AbortSignal): Promise<SandboxRecord> {
    this.get(id);
    return this.gated(
      id,
      async () => {
        const rec = this.requireState(id, 'PauseSandbox');
        await this.vms.pause(rec.vm?.vmId ?? id);
        transition(rec, 'PAUSED');
        this.touch(rec);
        return rec;
      },
      signal,
    );
  }

  /**
   * resume thaws a PAUSED sandbox, or boots a DRAINED one again on its own disks (same id,
   * metadata and /workspace; a new pid). signal stops the wait to enter the handover gate.
   * Errors: NOT_FOUND, FAILED_PRECONDITION (not PAUSED or DRAINED, or a device of a drained
   * sandbox is not attached).
   */
  resume(id: string, signal?: AbortSignal): Promise<SandboxRecord> {
    this.get(id);
    return this.gated(
      id,
      async () => {
        const rec = this.requireState(id, 'ResumeSandbox');
        if (rec.state === 'DRAINED') return coldStart(this.ctx, rec);
        await this.vms.resume(rec.vm?.vmId ?? id);
        transition(rec, 'RUNNING');
        this.touch(rec);
        return rec;
      },
      signal,
    );
  }

  /** drainOne persists a live sandbox for a node drain: see drain.ts. */
  drainOne(id: string, progress?: DrainProgress): Promise<void> {
    return drainOne(this.ctx, id, progress);
  }

  /** fork: see fork.ts. */
  fork(args: ForkSandboxArgs, signal?: AbortSignal): Promise<ForkResult> {
    return forkSandbox(this.ctx, args, signal);
  }

  /** resetRootfs: see reset-rootfs.ts. */
  resetRootfs(id: string, signal?: AbortSignal): Promise<SandboxRecord> {
    return resetRootfs(this.ctx, id, signal);
  }

  /** switchUpper: see reset-rootfs.ts (adoption finishes an interrupted reset with it). */
  switchUpper(rec: SandboxRecord, fresh: DeviceInfo, generation: number): void {
    switchUpper(this.ctx, rec, fresh, generation);
  }

  /**
   * delete tears the sandbox down and removes its record (any state, also one of a newer
   * server). signal stops the wait to enter the handover gate. Errors: NOT_FOUND, the peers'.
   */
  delete(id: string, signal?: AbortSignal): Promise<void> {
    this.get(id);
    return this.gated(
      id,
      async () => {
        const rec = this.o.store.get(id);
        if (!rec) throw new NotFoundError(`sandbox ${id} not found`);
        await teardown(this.ctx, rec);
        this.o.log.info({ sandbox_id: id }, 'sandbox deleted');
      },
      signal,
    );
  }

  /**
   * teardown removes VM, devices, runtime dir and finally the record, DELETING first (see
   * provision.ts); adoption uses it for interrupted creates and deletes.
   */
  teardown(rec: SandboxRecord): Promise<void> {
    return teardown(this.ctx, rec);
  }

  /** setTimeout sets the lifetime from now (0: none). Errors: INVALID_ARGUMENT, NOT_FOUND. */
  setTimeout(id: string, seconds: number, signal?: AbortSignal): Promise<SandboxRecord> {
    validateTimeoutSeconds('timeout_seconds', seconds);
    this.get(id);
    return this.gated(
      id,
      async () => {
        const rec = this.get(id);
        rec.expiresAtMs = seconds ? this.now() + seconds * 1000 : 0;
        this.touch(rec);
        return rec;
      },
      signal,
    );
  }

  /** keepAlive: see idle.ts. */
  keepAlive(id: string, forS: number, signal?: AbortSignal): Promise<SandboxRecord> {
    return keepAlive(this.ctx, id, forS, signal);
  }

  /** runIdle: the idle actions that are due (idle.ts IdleController.tick); the reaper runs it. */
  runIdle(): Promise<{ sandboxId: string; action: string }[]> {
    return this.idle.tick();
  }

  /** templateInUse says whether a record or a create in flight uses the template. */
  templateInUse(name: string): string | undefined {
    if (this.creatingFrom.has(name)) return 'a create from it is in progress';
    // warm-pool members are retired by the rebuild (retireTemplate), they do not hold it off
    const users = this.o.store.list().filter((r) => r.template === name && !isPoolMember(r));
    return users.length ? `it is used by ${users.length} sandbox(es), e.g. ${users[0]?.sandboxId}` : undefined;
  }

  /** retireTemplate: see pool.ts (nothing to do without pools). */
  retireTemplate(name: string): Promise<() => void> {
    return this.pool ? this.pool.retireTemplate(name) : Promise.resolve(() => undefined);
  }

  /** checkLiveness: see reaper.ts. */
  checkLiveness(): Promise<string[]> {
    return checkLiveness(this.ctx);
  }

  /** recoverLiveness: see reaper.ts. */
  recoverLiveness(): Promise<LivenessRecovery> {
    return recoverLiveness(this.ctx);
  }

  /** reapplyPolicies: see network-update.ts. */
  reapplyPolicies(): Promise<string[]> {
    return reapplyPolicies(this.ctx);
  }

  /** retryTeardowns: see reaper.ts. */
  retryTeardowns(minAgeMs?: number): Promise<string[]> {
    return retryTeardowns(this.ctx, minAgeMs);
  }

  /** expired: see reaper.ts. */
  expired(): string[] {
    return expired(this.ctx);
  }

  /** exec: see guest-io.ts. */
  exec(id: string, args: ExecArgs, signal: AbortSignal): AsyncIterable<ExecEvent> {
    return guestExec(this.ctx, id, args, signal);
  }

  /** execStream: see exec-stream.ts. */
  execStream(id: string, first: ExecStreamFirst, input: AsyncIterable<ExecInput>, signal: AbortSignal): Promise<AsyncIterable<ExecStreamEvent>> {
    return execStream(this.ctx, id, first, input, signal);
  }

  /** listProcesses: see exec-stream.ts. */
  listProcesses(id: string): Promise<ProcessInfo[]> {
    return listProcesses(this.ctx, id);
  }

  /** signalProcess: see exec-stream.ts. */
  signalProcess(id: string, execId: string, pid: number, sig: string): Promise<void> {
    return signalProcess(this.ctx, id, execId, pid, sig);
  }

  /** readFile: see guest-io.ts. */
  readFile(id: string, p: string, offset: number, length: number): Promise<{ data: Uint8Array; sizeBytes: number; eof: boolean }> {
    return guestReadFile(this.ctx, id, p, offset, length);
  }

  /** writeFile: see guest-io.ts. */
  writeFile(id: string, p: string, data: Uint8Array, mode: number, append: boolean): Promise<{ sizeBytes: number }> {
    return guestWriteFile(this.ctx, id, p, data, mode, append);
  }

  private requireState(id: string, op: Operation): SandboxRecord {
    return requireState(this.get(id), op);
  }

  /** touch stamps updatedAtMs and persists (durable on return), then puts the record's network view in the directory (or removes it). */
  touch(rec: SandboxRecord): void {
    rec.updatedAtMs = this.now();
    this.idle.onTouch(rec);
    this.o.store.put(rec);
    syncDirectory(this.directory, rec);
  }

  /** accessToken is rec's ingress access token ("" without network), for CreateSandbox/ForkSandbox answers and their repeats by request_id. */
  accessToken(rec: SandboxRecord): string {
    return this.tokens.tokenFor(rec);
  }

  /** updateNetwork: see network-update.ts. */
  updateNetwork(args: UpdateNetworkArgs, signal?: AbortSignal): Promise<SandboxRecord> {
    return updateNetwork(this.ctx, args, signal);
  }

  /** gated runs a lifecycle operation through the handover gate and the sandbox's lock. */
  private gated<T>(id: string, fn: () => Promise<T>, signal?: AbortSignal): Promise<T> {
    return this.gate.run(() => this.locks.run(id, fn), signal);
  }

  /** withLock runs fn under the sandbox's lock (adoption uses it). */
  withLock<T>(id: string, fn: () => Promise<T>): Promise<T> {
    return this.locks.run(id, fn);
  }
}

/**
 * templateNotFound is the NOT_FOUND of a create naming a template this node lacks: it names the
 * templates there are (at most 20), so a typo is seen as one, and says what a build would make (a
 * template of the base image under that name; newcomer: the old hint built a typo's copy).
 */
export async function templateNotFound(templates: Pick<TemplateCatalog, 'list'>, name: string): Promise<NotFoundError> {
  const have = (await templates.list().catch(() => [])).map((t) => t.name).sort();
  const names = have.length === 0 ? 'none yet' : `${have.slice(0, 20).join(', ')}${have.length > 20 ? `, … (${have.length} in all: sandnode template list)` : ''}`;
  return new NotFoundError(`template ${JSON.stringify(name)} not found; this node has: ${names} (sandnode template build NAME makes one from the base image)`);
}
