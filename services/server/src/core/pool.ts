/**
 * WarmPool (issue 14 §2): per configured pool (pool-config.ts) sandboxes that wait booted and
 * healthy, with devices and (on a node with network) a network slot, so that CreateSandbox
 * claims one instead of booting (pool-claim.ts). Members are records like any other, marked
 * with a pool part (types.ts PoolMark): made by the normal create path, adopted after a
 * handover or crash, reaped like any sandbox; ListSandboxes and the sandbox counts leave them out.
 *
 * A claim is one compare-and-swap on records.db (RecordStore.claimPoolMember): exactly one
 * caller gets a member, also with a second server on the same records.db. Everything else runs
 * in {@link WarmPool.tick} (each reaper pass while ACTIVE) and {@link WarmPool.fill} (after every
 * claim):
 *   - a member whose pool was removed or shrunk, whose template was rebuilt, that is not
 *     RUNNING (its VM died: ERROR; drained) or whose podd fails health is retired: claimed by
 *     the pool itself (CLAIMING, so no caller gets it) and deleted;
 *   - a CLAIMING member no claim of this process works on (the claim was cut by a crash) is deleted;
 *   - each pool below its size is refilled, at most fillConcurrency creates at once node-wide
 *     and none while a user's cold create runs (user creates go first); a failed refill backs
 *     off (1 s doubling to 30 s) and is shown in status (last_error).
 * A template rebuild retires its members first ({@link WarmPool.retireTemplate}).
 */
import type { Logger } from '@sandnode/shared';
import { effectiveResources, isPoolMember, sameResources, type PoolConfig, type PoolConfigStore } from './pool-config';
import type { RecordStore, Resources, SandboxRecord } from './types';
import type { ResourceDefaults } from './validate';

/** First backoff after a failed refill, ms (doubles up to MAX_FILL_BACKOFF_MS). */
const FILL_BACKOFF_MS = 1000;
const MAX_FILL_BACKOFF_MS = 30_000;
/** How long after a claim the refill pass runs, ms (claims of one burst share one pass). */
const FILL_KICK_MS = 50;

/** What the pool needs of the manager. */
export interface PoolPorts {
  store: RecordStore;
  configs: PoolConfigStore;
  log: Logger;
  now(): number;
  resourceDefaults: ResourceDefaults;
  /** pool members created at once, node-wide */
  fillConcurrency: number;
  /** how often a waiting member's podd is asked, ms */
  healthIntervalMs: number;
  /** createMember makes a READY member of c by the normal create path (through the handover gate). */
  createMember(c: PoolConfig, resources: Resources): Promise<SandboxRecord>;
  /** deleteMember tears a sandbox down (through the handover gate and its lock). */
  deleteMember(id: string): Promise<void>;
  /** healthy asks the member's podd (false: no answer in time). */
  healthy(rec: SandboxRecord): Promise<boolean>;
  /** templateRootfs is the template's rootfs path now; undefined when it does not exist (or is being rebuilt). */
  templateRootfs(name: string): Promise<string | undefined>;
  /** user creates (cold) in flight now */
  coldCreatesInFlight(): number;
  /** the server may change sandboxes now (ACTIVE, the handover gate open) */
  active(): boolean;
}

/** One pool as GetPoolStatus reports it. */
export interface PoolStatusInfo {
  key: string;
  template: string;
  resources: Resources;
  size: number;
  ready: number;
  filling: number;
  claimed: number;
  missed: number;
  lastError: string;
}

interface Stats {
  claimed: number;
  missed: number;
  lastError: string;
  failures: number;
  nextFillAtMs: number;
}

/** How long retireTemplate waits for members another pool path holds (a retire, a claim in flight), ms. */
const RETIRE_HELD_WAIT_MS = 10_000;

/** retireTemplate's name for every template (a drain). */
export const ALL_TEMPLATES = '*';

/** PoolUnfit: a member cannot give what a create asks (thrown by a claim's apply: nothing is written). */
export class PoolUnfit extends Error {}

export class WarmPool {
  /** member creates in flight by pool key */
  private readonly filling = new Map<string, number>();
  /** ids of members a claim of this process holds CLAIMING (tick leaves them alone) */
  readonly claiming = new Set<string>();
  /** templates whose members are being retired (no refill, no claim) */
  private readonly retiring = new Set<string>();
  private readonly stats = new Map<string, Stats>();
  private readonly checkedAtMs = new Map<string, number>();
  private ticking = false;
  /** a fill is scheduled by kick */
  private kicked = false;
  /** claims waiting for this turn's transaction, by pool key */
  private readonly queued = new Map<string, { apply: (m: SandboxRecord) => SandboxRecord; done: (r: SandboxRecord | undefined | Error) => void }[]>();
  private flushing = false;

  constructor(private readonly p: PoolPorts) {}

  private stat(key: string): Stats {
    let s = this.stats.get(key);
    if (!s) this.stats.set(key, (s = { claimed: 0, missed: 0, lastError: '', failures: 0, nextFillAtMs: 0 }));
    return s;
  }

  /** fillsInFlight: member creates running now (all pools). */
  get fillsInFlight(): number {
    let n = 0;
    for (const v of this.filling.values()) n += v;
    return n;
  }

  /**
   * claim takes a READY member of template's pool whose resources are `resources` (filled in),
   * writing apply(member) in the same compare-and-swap; apply may throw PoolUnfit (the member
   * cannot give what is asked: nothing written). Resolves to the claimed record, or the reason
   * there is none (miss; "" when the template has no pool). The claims of one event-loop turn
   * share one transaction (enqueue). Errors: the store's (StoreBusyError: UNAVAILABLE).
   */
  claim(template: string, resources: Resources, apply: (member: SandboxRecord, key: string) => SandboxRecord): Promise<{ rec?: SandboxRecord; miss: string }> {
    if (!this.p.store.claimPoolMember) return Promise.resolve({ miss: '' });
    const pools = this.p.configs.list().filter((c) => c.template === template);
    if (pools.length === 0) return Promise.resolve({ miss: '' });
    const c = pools.find((x) => sameResources(effectiveResources(x, this.p.resourceDefaults), resources));
    const miss = (why: string, key: string) => {
      this.stat(key).missed++;
      return { miss: why };
    };
    if (!c) return Promise.resolve(miss(`the request's resources differ from those of the pool${pools.length > 1 ? 's' : ''} of ${template}`, pools[0]!.key));
    if (this.held(template)) return Promise.resolve(miss(`the pool of ${template} is being retired (template rebuild)`, c.key));
    return new Promise<SandboxRecord | undefined | Error>((resolve) => this.enqueue(c.key, (m) => apply(m, c.key), resolve)).then((r) => {
      if (r instanceof PoolUnfit) return miss(r.message, c.key);
      if (r instanceof Error) throw r;
      if (!r) return miss(`the pool ${c.key} is empty (0 ready, ${this.filling.get(c.key) ?? 0} filling, size ${c.size})`, c.key);
      this.stat(c.key).claimed++;
      this.kick();
      return { rec: r, miss: '' };
    });
  }

  /**
   * enqueue queues a claim; the claims queued in one turn of the event loop are written in one
   * transaction per pool (RecordStore.claimPoolMembers: one fsync for a burst), or one by one
   * with a store without it.
   */
  private enqueue(key: string, apply: (m: SandboxRecord) => SandboxRecord, done: (r: SandboxRecord | undefined | Error) => void): void {
    const q = this.queued.get(key) ?? [];
    q.push({ apply, done });
    this.queued.set(key, q);
    if (this.flushing) return;
    this.flushing = true;
    setImmediate(() => {
      this.flushing = false;
      const all = [...this.queued];
      this.queued.clear();
      const store = this.p.store;
      for (const [k, items] of all) {
        let results: (SandboxRecord | undefined | Error)[];
        try {
          results = store.claimPoolMembers
            ? store.claimPoolMembers(
                k,
                items.map((i) => i.apply),
              )
            : items.map((i) => {
                try {
                  return store.claimPoolMember!(k, i.apply);
                } catch (err) {
                  return err as Error;
                }
              });
        } catch (err) {
          results = items.map(() => err as Error);
        }
        items.forEach((it, i) => it.done(results[i]));
      }
    });
  }

  /** members lists the pool members in the records (READY or CLAIMING, any state). */
  members(): SandboxRecord[] {
    return this.p.store.list().filter(isPoolMember);
  }

  /** status reports every configured pool, and pools with members left but no config (size 0), ordered by key. */
  status(): PoolStatusInfo[] {
    const members = this.members();
    const configs = this.p.configs.list();
    const keys = new Set([...configs.map((c) => c.key), ...members.map((m) => m.pool!.key)]);
    return [...keys].sort().map((key) => {
      const c = configs.find((x) => x.key === key);
      const mine = members.filter((m) => m.pool!.key === key);
      const s = this.stat(key);
      const any = mine[0];
      return {
        key,
        template: c?.template ?? any?.template ?? '',
        resources: c ? effectiveResources(c, this.p.resourceDefaults) : (any?.resources ?? effectiveResources({ resources: undefined }, this.p.resourceDefaults)),
        size: c?.size ?? 0,
        ready: mine.filter((m) => m.state === 'RUNNING' && m.pool!.state === 'READY').length,
        filling: this.filling.get(key) ?? 0,
        claimed: s.claimed,
        missed: s.missed,
        lastError: s.lastError,
      };
    });
  }

  /**
   * tick: one pass of upkeep (retire what must go, health checks, refill); a pass already
   * running makes this one a no-op. Never throws (failures are logged and shown in status).
   */
  async tick(): Promise<void> {
    if (this.ticking || !this.p.active()) return;
    this.ticking = true;
    try {
      await this.upkeep();
      this.fill();
    } catch (err) {
      this.p.log.error({ err }, 'warm pool pass failed');
    } finally {
      this.ticking = false;
    }
  }

  private async upkeep(): Promise<void> {
    const configs = new Map(this.p.configs.list().map((c) => [c.key, c]));
    const rootfs = new Map<string, string | undefined>();
    const readyByKey = new Map<string, SandboxRecord[]>();
    for (const m of this.members()) {
      if (!this.p.active()) return;
      const id = m.sandboxId;
      const mark = m.pool!;
      if (this.claiming.has(id) || m.state === 'CREATING' || m.state === 'DELETING') continue;
      if (mark.state === 'CLAIMING') {
        await this.retire(m, 'its claim was cut (a crash or kill of the server)');
        continue;
      }
      const c = configs.get(mark.key);
      let why = '';
      if (!c) why = 'its pool was removed';
      else if (this.held(m.template)) why = 'its template is being rebuilt (or the node drained)';
      else if (m.state !== 'RUNNING') why = `it is ${m.state}`;
      else {
        if (!rootfs.has(m.template)) rootfs.set(m.template, await this.p.templateRootfs(m.template).catch(() => undefined));
        if (rootfs.get(m.template) !== m.templateRootfs) why = 'its template was rebuilt or removed';
      }
      if (!why && this.p.now() - (this.checkedAtMs.get(id) ?? 0) >= this.p.healthIntervalMs) {
        this.checkedAtMs.set(id, this.p.now());
        if (!(await this.p.healthy(m).catch(() => false))) why = 'its podd failed health';
      }
      if (why) {
        await this.retire(m, why);
        continue;
      }
      readyByKey.set(mark.key, [...(readyByKey.get(mark.key) ?? []), m]);
    }
    // a pool made smaller: the oldest extras go
    for (const [key, ready] of readyByKey) {
      const size = configs.get(key)?.size ?? 0;
      for (const m of ready.slice(0, Math.max(0, ready.length - size))) await this.retire(m, `its pool ${key} is above its size ${size}`);
    }
    for (const id of this.checkedAtMs.keys()) if (!this.p.store.get(id)) this.checkedAtMs.delete(id);
  }

  /**
   * retire takes m out of its pool and deletes it: a RUNNING READY member is claimed by the pool
   * (CLAIMING; a caller that claimed it first keeps it), any other is deleted as it is.
   */
  private async retire(m: SandboxRecord, why: string): Promise<void> {
    if (m.state === 'RUNNING' && m.pool?.state === 'READY' && !this.takeBack(m)) return; // claimed by a create meanwhile: it is the caller's now
    this.p.log.info({ sandbox_id: m.sandboxId, pool: m.pool?.key, reason: why }, 'warm pool member retired');
    this.claiming.add(m.sandboxId);
    try {
      await this.p.deleteMember(m.sandboxId);
    } catch (err) {
      // the record stays a member (CLAIMING or not RUNNING): the next pass, or the reaper's teardown retry, deletes it
      this.p.log.warn({ sandbox_id: m.sandboxId, err }, 'could not delete a retired warm pool member; retried');
    } finally {
      this.claiming.delete(m.sandboxId);
      this.checkedAtMs.delete(m.sandboxId);
    }
  }

  /** takeBack claims READY member m for the pool itself (CLAIMING: no caller gets it); false when a create claimed it first. */
  private takeBack(m: SandboxRecord): boolean {
    const key = m.pool!.key;
    return !!this.p.store.claimPoolMember?.(key, (r) => ({ ...r, updatedAtMs: this.p.now(), pool: { key, state: 'CLAIMING', claimedAtMs: 0 } }), m.sandboxId);
  }

  /**
   * kick runs fill once FILL_KICK_MS from now: a burst of claims schedules one refill pass
   * (each pass reads every record), after the burst's answers went out.
   */
  kick(): void {
    if (this.kicked) return;
    this.kicked = true;
    setTimeout(() => {
      this.kicked = false;
      this.fill();
    }, FILL_KICK_MS).unref();
  }

  /**
   * fill starts member creates for pools below their size: at most fillConcurrency at once
   * node-wide, none while a user's cold create runs or a pool's backoff lasts. Returns at once.
   */
  fill(): void {
    if (!this.p.active() || this.p.coldCreatesInFlight() > 0) return;
    let configs: PoolConfig[];
    let members: SandboxRecord[];
    try {
      configs = this.p.configs.list();
      members = this.members();
    } catch (err) {
      this.p.log.warn({ err }, 'warm pool refill: records not readable now');
      return;
    }
    for (const c of configs) {
      if (this.held(c.template)) continue;
      const s = this.stat(c.key);
      if (this.p.now() < s.nextFillAtMs) continue;
      // CREATING members of this process are the fills in flight; those of a crash are torn down by adoption
      const have = members.filter((m) => m.pool!.key === c.key && m.pool!.state === 'READY' && m.state === 'RUNNING').length;
      let missing = c.size - have - (this.filling.get(c.key) ?? 0);
      while (missing-- > 0 && this.fillsInFlight < this.p.fillConcurrency) this.startFill(c);
    }
  }

  private startFill(c: PoolConfig): void {
    this.filling.set(c.key, (this.filling.get(c.key) ?? 0) + 1);
    const s = this.stat(c.key);
    void this.p
      .createMember(c, effectiveResources(c, this.p.resourceDefaults))
      .then(
        (rec) => {
          s.lastError = '';
          s.failures = 0;
          this.p.log.info({ sandbox_id: rec.sandboxId, pool: c.key }, 'warm pool member ready');
        },
        (err: unknown) => {
          s.lastError = (err as Error).message ?? String(err);
          s.failures++;
          s.nextFillAtMs = this.p.now() + Math.min(MAX_FILL_BACKOFF_MS, FILL_BACKOFF_MS * 2 ** (s.failures - 1));
          this.p.log.warn({ pool: c.key, err }, 'warm pool refill failed');
        },
      )
      .finally(() => {
        const n = (this.filling.get(c.key) ?? 1) - 1;
        if (n > 0) this.filling.set(c.key, n);
        else this.filling.delete(c.key);
        this.fill();
      });
  }

  /** held says whether the template's pools are held (a rebuild of it, or a drain: ALL_TEMPLATES). */
  private held(template: string): boolean {
    return this.retiring.has(template) || this.retiring.has(ALL_TEMPLATES);
  }

  /**
   * retireTemplate (a template rebuild; ALL_TEMPLATES: a drain, whose members are not worth
   * preserving): no claim or refill of the template's pools until the returned function is
   * called; waits for the refills in flight, then deletes every member of the template.
   * Errors: those of a member's teardown (the rebuild is refused: a member still uses the template).
   */
  async retireTemplate(name: string): Promise<() => void> {
    this.retiring.add(name);
    const done = () => void this.retiring.delete(name);
    const mine = (template: string | undefined) => name === ALL_TEMPLATES || template === name;
    try {
      while ([...this.filling.keys()].some((k) => mine(this.p.configs.list().find((c) => c.key === k)?.template))) await new Promise((r) => setTimeout(r, 50));
      const retireFree = async () => {
        for (const m of this.members().filter((r) => mine(r.template) && !this.claiming.has(r.sandboxId))) {
          if (m.state === 'RUNNING' && m.pool?.state === 'READY' && !this.takeBack(m)) continue;
          this.claiming.add(m.sandboxId);
          try {
            await this.p.deleteMember(m.sandboxId);
          } finally {
            this.claiming.delete(m.sandboxId);
          }
        }
      };
      await retireFree();
      // a member another path of the pool held meanwhile (its tick retiring one, a claim being
      // applied) was skipped: wait for that path to end (bounded), then retire what is left of
      // them (clean-clone CI: a drain answered while the tick still deleted a member, and the
      // ublk-manager the drain then stopped left it DELETING)
      const held = () => this.members().some((r) => mine(r.template) && this.claiming.has(r.sandboxId));
      for (const t0 = Date.now(); held() && Date.now() - t0 < RETIRE_HELD_WAIT_MS;) await new Promise((r) => setTimeout(r, 50));
      await retireFree();
      this.p.log.info({ template: name }, 'warm pool members retired (template rebuild or drain)');
      return done;
    } catch (err) {
      done();
      throw err;
    }
  }
}
