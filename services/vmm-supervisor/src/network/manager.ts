/**
 * NetworkManager: the node's network slots (docs/network.md). It owns the slot table
 * (slot-store.ts), the host state of each slot (net-host.ts) and the nftables table
 * (nft-render.ts). Every allocation, release and policy change runs under one mutex, so a slot
 * is handed out exactly once; host work of spares runs outside it (a slot being made is held
 * in `making`, neither free nor spare).
 *
 * Crash safety: a slot is claimed in the table (durable) before its host state is made, and
 * the host state is removed before its row is dropped; adopt() at start repairs what a dead
 * supervisor left (rows without host state are re-made, host state without rows is removed,
 * the table is rendered again from the rows in one transaction, which does not disturb
 * running connections: conntrack and NAT bindings are not part of the ruleset).
 */
import {
  AlreadyExistsError,
  FailedPreconditionError,
  InvalidArgumentError,
  KeyedMutex,
  ResourceExhaustedError,
  parseEgressPolicy,
  formatEgressPolicy,
  type EgressPolicy,
  type EgressPolicyInput,
  type Logger,
  slotAddresses,
  slotCount,
  tableName,
  slotOfIfname,
  writeNetworkTagFile,
  type NetLayout,
  type SlotAddresses,
} from '@sandnode/shared';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { runCommand } from '../drivers/command-runner';
import { isMountPoint } from '../drivers/mounts';
import * as host from './net-host';
import { renderSlotDelta, renderTable, type NftSettings, type NftSlot } from './nft-render';
import { NftSession } from './nft-session';
import { NetWorker, slotSetupFromEnv, type SlotSetupPath } from './net-worker';
import type { SlotRow, SlotStore } from './slot-store';
import { failpoints, FAILPOINTS } from '../core/failpoints';

/** NetworkRequest is a VM's NetworkSpec in domain form. */
export interface NetworkRequest {
  owner: string;
  /** -1: any free slot (a spare when there is one). */
  slot: number;
  egress: EgressPolicyInput;
}

/** VmNetworkInfo is what a VM got (Vm.network). */
export interface VmNetworkInfo extends SlotAddresses {
  owner: string;
  egress: EgressPolicyInput;
  prefixLen: number;
}

/** NetworkStatus is ListNetworkSlots' node part. */
export interface NetworkStatus {
  enabled: boolean;
  disabledReason: string;
  pool: string;
  table: string;
  spareTarget: number;
}

/** NetworkManagerOptions wire a manager. */
export interface NetworkManagerOptions {
  layout: NetLayout;
  nft: NftSettings;
  store: SlotStore;
  spareTarget: number;
  log: Logger;
  /** Why the network is off from the start (config `network` false), or undefined. */
  off?: string;
  /** How VMs meet their netns: "veth" (runc, default) or "tap" (firecracker). */
  mode?: host.GuestMode;
  /** How slots are made and nft changes applied (default: SANDNODE_SLOT_SETUP, else netlink). */
  slotSetup?: SlotSetupPath;
}

const KEY = 'net';

/** NetworkManager implements the slot operations; every method documents its errors. */
export class NetworkManager {
  private readonly layout: NetLayout;
  private readonly nft: NftSettings;
  private readonly store: SlotStore;
  private readonly spareTarget: number;
  private readonly log: Logger;
  private readonly mutex = new KeyedMutex();
  private readonly making = new Set<number>();
  private disabled: string | undefined;
  private readonly mode: host.GuestMode;
  private readonly session: NftSession;
  /** The in-process path (rtnetlink + libnftables on a worker thread); undefined: spawn path. */
  private readonly worker: NetWorker | undefined;
  private filling: Promise<void> | undefined;
  private fillSoon: NodeJS.Immediate | undefined;
  private closed = false;

  constructor(opts: NetworkManagerOptions) {
    this.layout = opts.layout;
    this.nft = opts.nft;
    this.store = opts.store;
    this.spareTarget = opts.spareTarget;
    this.log = opts.log.child({ part: 'network' });
    this.disabled = opts.off;
    this.mode = opts.mode ?? 'veth';
    this.worker = (opts.slotSetup ?? slotSetupFromEnv()) === 'netlink' ? new NetWorker() : undefined;
    this.session = new NftSession(tableName(this.layout), this.log, this.worker);
  }

  /** status is the node's network settings and whether it is on. */
  status(): NetworkStatus {
    return { enabled: this.disabled === undefined, disabledReason: this.disabled ?? '', pool: this.layout.pool.text, table: `inet ${tableName(this.layout)}`, spareTarget: this.spareTarget };
  }

  /** slots lists every slot that is not free, ordered by slot. */
  slots(): SlotRow[] {
    return this.store.list();
  }

  /** addresses of slot s. */
  addresses(s: number): SlotAddresses {
    return slotAddresses(this.layout, s);
  }

  /** infoOf is the VmNetworkInfo of a row. */
  infoOf(row: SlotRow): VmNetworkInfo {
    return { ...slotAddresses(this.layout, row.slot), owner: row.owner, egress: row.egress, prefixLen: 30 };
  }

  /** forSlot is slot s's row, or undefined (free, or s is -1). */
  forSlot(s: number): SlotRow | undefined {
    return s >= 0 ? this.store.get(s) : undefined;
  }

  /** quarantined lists the slot table's quarantined rows, oldest first (SlotStore.quarantined). */
  quarantined(): { slot: number; reason: string; quarantinedAtMs: number }[] {
    return this.store.quarantined();
  }

  /** forVm is the in-use row of vmId, or undefined. */
  forVm(vmId: string): SlotRow | undefined {
    return this.store.list().find((r) => r.state === 'in-use' && r.vmId === vmId);
  }

  /**
   * start checks the host (preflight: off with a reason when it fails), lets sandbox traffic
   * through Docker's FORWARD chain when there is one, and adopts (see adopt). vms are the VM ids
   * of the VM table with the pid of their init or VMM (0: not running). Never throws: a failure
   * turns the network off with its reason.
   */
  async start(vms: Map<string, number>): Promise<void> {
    if (this.disabled !== undefined) {
      this.log.info({ reason: this.disabled }, 'network off');
      return;
    }
    try {
      const why = await host.preflight(this.layout, this.log);
      if (why) {
        this.disabled = why;
        this.log.warn({ reason: why }, `network off: ${why}`);
        return;
      }
      // what `down --purge` reads to find this node's table and interfaces whatever networkTag says
      writeNetworkTagFile(this.layout);
      await host.allowThroughDocker(this.layout, this.log);
      await this.adopt(vms);
    } catch (err) {
      this.disabled = `network setup failed: ${(err as Error).message.slice(0, 300)}`;
      this.log.error({ err }, this.disabled);
      return;
    }
    this.topUpSpares();
  }

  /**
   * adopt checks every row against the host and repairs: an in-use row of a VM the table does
   * not have is freed; a lost netns bind mount of a running VM is bound again from the VM's
   * process (/proc/<pid>/ns/net: the VM keeps its namespace), of any other slot made anew; a
   * missing veth or address is made again; host veths and netns files of this node that no row
   * owns are removed; the table is rendered from the rows.
   */
  async adopt(vms: Map<string, number>): Promise<{ repaired: number[]; freed: number[]; swept: string[] }> {
    return this.mutex.run(KEY, async () => {
      const repaired: number[] = [];
      const freed: number[] = [];
      const swept: string[] = [];
      const links = await host.hostLinks(this.layout);
      const rows = this.store.list();
      for (const row of rows) {
        const a = this.addresses(row.slot);
        if (row.state === 'in-use' && !vms.has(row.vmId) && row.wasReserved) {
          // a create of the owner died with the slot: it is the owner's again (drain -> resume keeps its address)
          this.store.put({ slot: row.slot, state: 'reserved', owner: row.owner, vmId: '', egress: row.egress });
          freed.push(row.slot);
          this.log.warn({ slot: row.slot, vm_id: row.vmId, owner: row.owner }, 'adopt: slot of a VM the table does not have; reserved for its owner again');
          if (await this.repair(a, links.get(a.hostIfname), 0)) repaired.push(row.slot);
          continue;
        }
        if (row.state === 'in-use' && !vms.has(row.vmId)) {
          await host.removeSlot(a, this.worker);
          this.store.delete(row.slot);
          freed.push(row.slot);
          this.log.warn({ slot: row.slot, vm_id: row.vmId }, 'adopt: slot of a VM the table does not have; freed');
          continue;
        }
        if (await this.repair(a, links.get(a.hostIfname), row.state === 'in-use' ? (vms.get(row.vmId) ?? 0) : 0)) repaired.push(row.slot);
      }
      const owned = new Set(this.store.list().map((r) => r.slot));
      for (const name of links.keys()) {
        const s = slotOfIfname(this.layout, name);
        if (s !== undefined && !owned.has(s) && !this.making.has(s)) {
          await host.removeSlot(this.addresses(s), this.worker);
          swept.push(name);
        }
      }
      for (const s of host.netnsFiles(this.layout)) {
        if (!owned.has(s) && !this.making.has(s)) {
          await host.removeSlot(this.addresses(s), this.worker);
          swept.push(`netns/${s}`);
        }
      }
      await this.session.apply(renderTable(this.nft, this.nftSlots()));
      const log = repaired.length || freed.length || swept.length ? this.log.warn.bind(this.log) : this.log.info.bind(this.log);
      log({ slots: owned.size, repaired, freed, swept }, 'adopt: network slots checked, table rendered');
      return { repaired, freed, swept };
    });
  }

  /** repair makes what is missing of slot a (netns, veth, addresses, route); true when it had to. */
  private async repair(a: SlotAddresses, link: { addrs: string[]; up: boolean } | undefined, pid: number): Promise<boolean> {
    if (!isMountPoint(a.netnsPath) && pid > 0 && existsSync(`/proc/${pid}/ns/net`)) {
      // the VM still runs in the namespace: bind it again from its process, it keeps its traffic
      mkdirSync(path.dirname(a.netnsPath), { recursive: true, mode: 0o755 });
      writeFileSync(a.netnsPath, '', { mode: 0o444 });
      await runCommand('mount', ['--bind', `/proc/${pid}/ns/net`, a.netnsPath]);
      this.log.warn({ slot: a.slot, vm_pid: pid }, 'adopt: netns bind mount was missing; bound again from the VM process');
      return (await this.repair(a, link, 0)) || true;
    }
    if (!isMountPoint(a.netnsPath)) {
      // the namespace is gone (a reboot, a manual umount): a VM in it lost it too; make it anew
      await host.removeSlot(a, this.worker);
      await host.makeSlot(a, this.mode, this.worker, this.log);
      this.log.warn({ slot: a.slot }, 'adopt: netns was missing; slot made again');
      return true;
    }
    const inside = await host.netnsState(a);
    let fixed = false;
    if (!link || !inside.eth0 || (this.mode === 'tap' && !inside.tap0)) {
      if (link) await runCommand('ip', ['link', 'del', a.hostIfname]);
      if (inside.eth0) await runCommand('nsenter', [`--net=${a.netnsPath}`, 'ip', 'link', 'del', 'eth0']);
      await runCommand('ip', ['-batch', '-'], { input: host.hostBatch(a) });
      if (this.mode === 'tap') await runCommand('nsenter', [`--net=${a.netnsPath}`, 'sh', '-c', 'ip link del tap0 2>/dev/null; ip link del br0 2>/dev/null; true']);
      await runCommand('nsenter', [`--net=${a.netnsPath}`, 'ip', '-batch', '-'], { input: host.slotNetnsBatch(a, this.mode) });
      fixed = true;
    } else {
      if (!link.addrs.includes(`${a.gateway}/30`) || !link.up) {
        await runCommand('ip', ['-batch', '-'], { input: host.hostBatch(a, false) });
        fixed = true;
      }
      if (this.mode === 'veth' && (!inside.addrs.includes(`${a.address}/30`) || !inside.defaultRoute)) {
        await runCommand('nsenter', [`--net=${a.netnsPath}`, 'ip', '-batch', '-'], { input: host.netnsBatch(a) });
        fixed = true;
      }
    }
    if (fixed) this.log.warn({ slot: a.slot }, 'adopt: slot differed from its row; repaired');
    return fixed;
  }

  /**
   * acquire gives vmId a slot for req and returns it in use with req's policy in force.
   * FailedPreconditionError (network off: the reason), InvalidArgumentError (bad policy or slot
   * number), AlreadyExistsError (the slot is held by another owner or VM), ResourceExhaustedError
   * (no free slot). A failure leaves the slot as it was.
   */
  async acquire(vmId: string, req: NetworkRequest): Promise<VmNetworkInfo> {
    if (this.disabled !== undefined) throw new FailedPreconditionError(`the node's network is off: ${this.disabled}`);
    const egress = formatEgressPolicy(parseEgressPolicy(req.egress, 'spec.network.egress'));
    try {
      return await this.acquireOnce(vmId, req, egress);
    } catch (err) {
      // the last free slots may be spares being made: wait for them, then take one
      if (!(err instanceof ResourceExhaustedError) || this.making.size === 0) throw err;
      await this.idle();
      return this.acquireOnce(vmId, req, egress);
    }
  }

  private async acquireOnce(vmId: string, req: NetworkRequest, egress: EgressPolicyInput): Promise<VmNetworkInfo> {
    const info = await this.mutex.run(KEY, async () => {
      const rows = this.store.list(); // one read of the rows for every check below
      const mine = rows.find((r) => r.state === 'in-use' && r.vmId === vmId);
      if (mine) return this.infoOf(mine);
      // an owner holds one slot: a second row of it would stay in use after the owner is gone
      const held = rows.find((r) => r.state !== 'spare' && r.owner === req.owner && r.slot !== req.slot);
      if (held)
        throw new AlreadyExistsError(`owner ${req.owner} already holds network slot ${held.slot} (${held.state}${held.vmId ? ` by vm ${held.vmId}` : ''}); ask for that slot or release it first`);
      let s = req.slot;
      let fresh = false;
      if (s >= 0) {
        if (s >= slotCount(this.layout)) throw new InvalidArgumentError(`spec.network.slot: ${s} is outside the pool ${this.layout.pool.text} (0..${slotCount(this.layout) - 1})`);
        if (this.making.has(s)) throw new AlreadyExistsError(`network slot ${s} is being made as a spare; ask for another slot or -1`);
        const row = rows.find((r) => r.slot === s);
        if (row?.state === 'in-use') throw new AlreadyExistsError(`network slot ${s} is in use by vm ${row.vmId} (owner ${row.owner})`);
        if (row?.state === 'reserved' && row.owner !== req.owner) throw new AlreadyExistsError(`network slot ${s} is reserved for owner ${row.owner}`);
        if (this.store.quarantinedSlots().has(s)) throw new AlreadyExistsError(`network slot ${s} has a quarantined row; it is not handed out`);
        fresh = row === undefined;
      } else {
        const spare = rows.find((r) => r.state === 'spare');
        if (spare) s = spare.slot;
        else {
          s = this.freeSlot();
          fresh = true;
        }
      }
      const before = rows.find((r) => r.slot === s);
      const row: SlotRow = { slot: s, state: 'in-use', owner: req.owner, vmId, egress, ...(before?.state === 'reserved' ? { wasReserved: true } : {}) };
      const policy = parseEgressPolicy(egress);
      // a made slot (spare, reserved): its rules go in on the worker while the row is written
      // (the fsync): both are done before the answer; a crash between them leaves rules that the
      // next start's adopt renders away from the rows (the VM does not exist yet)
      const applying = fresh ? undefined : this.applyChange(s, undefined, policy);
      applying?.catch(() => undefined); // awaited below; a failure must not be unhandled while put runs
      try {
        this.store.put(row);
      } catch (err) {
        if (applying) await this.undoApply(s, applying, policy);
        throw err;
      }
      try {
        if (fresh) await host.makeSlot(this.addresses(s), this.mode, this.worker, this.log);
        await (applying ?? this.applyChange(s, undefined, policy));
      } catch (err) {
        if (before) this.store.put(before);
        else {
          await host.removeSlot(this.addresses(s), this.worker).catch(() => undefined);
          this.store.delete(s);
        }
        throw err;
      }
      this.log.info({ slot: s, vm_id: vmId, owner: req.owner, from: before?.state ?? 'free' }, 'network slot in use');
      return this.infoOf(row);
    });
    this.topUpSoon(); // after this answer: the refill's first synchronous steps are not the caller's wait
    return info;
  }

  /**
   * release ends vmId's use of its slot: keep=true reserves it for its owner (forwarding
   * refused, address kept); else its netns, veth and rules are removed. No slot: a no-op.
   */
  async release(vmId: string, keep: boolean): Promise<void> {
    await this.mutex.run(KEY, async () => {
      const row = this.forVm(vmId);
      if (!row) return;
      if (keep) {
        this.store.put({ slot: row.slot, state: 'reserved', owner: row.owner, vmId: '', egress: row.egress });
        await this.applyChange(row.slot, parseEgressPolicy(row.egress), undefined);
        this.log.info({ slot: row.slot, owner: row.owner }, 'network slot reserved for its owner');
        return;
      }
      await this.free(row);
    });
    this.topUpSpares();
  }

  /**
   * releaseReserved frees slot s when it is reserved for owner, or in use by owner's VM that
   * the VM table does not have (vmExists false: a row a lost VM left, which would else stay in
   * use for good); false (nothing changed) when it is free, a spare or another owner's.
   * FailedPreconditionError when a VM of the table uses it.
   */
  async releaseReserved(s: number, owner: string, vmExists: (vmId: string) => boolean = () => true): Promise<boolean> {
    return this.mutex.run(KEY, async () => {
      const row = this.store.get(s);
      if (!row || row.owner !== owner || row.state === 'spare') return false;
      if (row.state === 'in-use' && vmExists(row.vmId)) throw new FailedPreconditionError(`network slot ${s} is in use by vm ${row.vmId}; delete the VM first`);
      if (row.state === 'in-use') this.log.warn({ slot: s, vm_id: row.vmId, owner }, 'network slot in use by a VM the table does not have; freed');
      await this.free(row);
      return true;
    });
  }

  /**
   * update sets vmId's policy: persisted, then applied in one nft transaction (on failure the
   * old row is put back and the error thrown). InvalidArgumentError (bad policy),
   * FailedPreconditionError (the VM has no network); the caller answers NotFound for no VM.
   */
  async update(vmId: string, egressIn: EgressPolicyInput | undefined): Promise<VmNetworkInfo> {
    const egress = formatEgressPolicy(parseEgressPolicy(egressIn, 'egress'));
    return this.mutex.run(KEY, async () => {
      const row = this.forVm(vmId);
      if (!row) throw new FailedPreconditionError(`vm ${vmId} has no network`);
      const next: SlotRow = { ...row, egress };
      this.store.put(next);
      failpoints.hit(FAILPOINTS.networkUpdateAfterStore);
      try {
        await this.applyChange(row.slot, parseEgressPolicy(row.egress), parseEgressPolicy(egress));
      } catch (err) {
        this.store.put(row);
        throw err;
      }
      this.log.info({ slot: row.slot, vm_id: vmId }, 'egress policy replaced');
      return this.infoOf(next);
    });
  }

  /** close stops making spares (the slots stay). */
  async close(): Promise<void> {
    this.closed = true;
    if (this.fillSoon) clearImmediate(this.fillSoon);
    this.fillSoon = undefined;
    await this.filling;
    this.session.close();
    await this.worker?.close();
  }

  /** idle resolves when no spare is being made (tests, bench). */
  async idle(): Promise<void> {
    while (this.filling || this.fillSoon) await (this.filling ?? new Promise((r) => setImmediate(r)));
  }

  /** topUpSoon starts topUpSpares on the next turn of the event loop (once). */
  private topUpSoon(): void {
    if (this.fillSoon || this.closed) return;
    this.fillSoon = setImmediate(() => {
      this.fillSoon = undefined;
      this.topUpSpares();
    });
  }

  private async free(row: SlotRow): Promise<void> {
    const a = this.addresses(row.slot);
    if (row.state === 'in-use') await this.applyChange(row.slot, parseEgressPolicy(row.egress), undefined, (x) => x.slot !== row.slot);
    await host.removeSlot(a, this.worker);
    this.store.delete(row.slot);
    this.log.info({ slot: row.slot }, 'network slot freed');
  }

  private freeSlot(): number {
    const used = new Set(this.store.list().map((r) => r.slot));
    const bad = this.store.quarantinedSlots();
    const n = slotCount(this.layout);
    for (let s = 0; s < n; s++) if (!used.has(s) && !bad.has(s) && !this.making.has(s)) return s;
    throw new ResourceExhaustedError(`the network pool ${this.layout.pool.text} is full (${n} slots)`);
  }

  /**
   * applyChange takes slot s's rules from before to after in one transaction (renderSlotDelta);
   * when that fails (the table differs from the rows: a hand edit, a lost element) the whole
   * table is rendered from the rows (keep: which of them count), also one transaction.
   */
  private async applyChange(s: number, before: EgressPolicy | undefined, after: EgressPolicy | undefined, keep: (x: NftSlot) => boolean = () => true): Promise<void> {
    const delta = renderSlotDelta(this.nft, s, before, after);
    if (delta === '') return;
    try {
      await this.session.apply(delta);
    } catch (err) {
      this.log.warn({ err, slot: s }, 'the table differs from the slot rows; rendering it whole');
      await this.session.apply(renderTable(this.nft, this.nftSlots().filter(keep)));
    }
  }

  /** undoApply takes slot s's rules out again after its row could not be written (applying: the change that put them in). */
  private async undoApply(s: number, applying: Promise<void>, policy: EgressPolicy): Promise<void> {
    if (
      await applying.then(
        () => true,
        () => false,
      )
    )
      await this.applyChange(s, policy, undefined).catch((err) =>
        this.log.warn({ err, slot: s }, "could not take a slot's rules out after its row failed; the next start renders the table from the rows"),
      );
  }

  private nftSlots(): NftSlot[] {
    return this.store.list().map((r) => ({ slot: r.slot, policy: r.state === 'in-use' ? parseEgressPolicy(r.egress) : undefined }));
  }

  /** topUpSpares makes spares in the background until spareTarget exist (one at a time). */
  private topUpSpares(): void {
    if (this.filling || this.closed || this.disabled !== undefined || this.spareTarget === 0) return;
    this.filling = (async () => {
      try {
        for (;;) {
          if (this.closed) return;
          const s = await this.mutex.run(KEY, async () => {
            if (this.store.list().filter((r) => r.state === 'spare').length + this.making.size >= this.spareTarget) return undefined;
            let n: number;
            try {
              n = this.freeSlot();
            } catch {
              return undefined; // the pool is full: no spare until a slot is freed
            }
            this.making.add(n);
            return n;
          });
          if (s === undefined) return;
          try {
            await host.makeSlot(this.addresses(s), this.mode, this.worker, this.log);
            await this.mutex.run(KEY, async () => this.store.put({ slot: s, state: 'spare', owner: '', vmId: '', egress: { allowOut: [], denyOut: [], blockAll: false } }));
          } catch (err) {
            await host.removeSlot(this.addresses(s), this.worker).catch(() => undefined);
            this.log.warn({ err, slot: s }, 'could not make a spare network slot');
            return;
          } finally {
            this.making.delete(s);
          }
        }
      } catch (err) {
        this.log.warn({ err }, 'spare network slots: stopped');
      } finally {
        this.filling = undefined;
      }
    })();
  }
}
