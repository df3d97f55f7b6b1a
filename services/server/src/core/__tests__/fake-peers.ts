/**
 * Scripted peers for the core's unit tests: a device manager, a supervisor and podds that
 * record what they are asked (events) and answer as a test sets them up.
 */
import path from 'node:path';
import { AlreadyExistsError, createLogger, DeadlineExceededError, FailedPreconditionError, formatIpv4, parseIpv4 } from '@sandnode/shared';
import type { SandboxManagerOptions } from '../sandbox-manager';
import type { PoddExecStreams } from '../exec-stream';
import type { ExecArgs, ExecEvent, VmFreezeInfo, ClonedDevice, DeviceInfo, DevicePort, NetworkSlotInfo, PoddClient, PoddConnector, RecordStore, TemplateCatalog, VmInfo, VmPort } from '../types';

/** The fake supervisor's pool: slot s is 10.209.0.(4s)/30, gateway +1, VM +2. */
const POOL_BASE = parseIpv4('10.209.0.0')!;

export class Peers {
  events: string[] = [];
  ublkFeatures = ['ublk.clone'];
  poddFeatures = ['podd.quiesce'];
  thawEndedBy: 'caller' | 'watchdog' = 'caller';
  /** what podd Health answers */
  poddHealthy = true;
  /** podd Health's bulk_transfers: a number, a failure, or 'hang' (never answers within the caller's bound) */
  poddBulk: number | Error | 'hang' = 0;
  failClone = false;
  /** what a clone of source device src throws, when set (undefined: it succeeds) */
  cloneFails: ((src: string) => Error | undefined) | undefined;
  /**
   * how long a clone takes, ms; a clone given a shorter deadline fails at it with what the
   * nice-grpc deadline middleware throws (mapped): DEADLINE_EXCEEDED "Deadline exceeded"
   */
  cloneTakesMs = 0;
  /** thrown by podd Quiesce when set */
  quiesceError: Error | undefined;
  /** the fake supervisor arms freezes (vmm.freeze-arm.v1) */
  armFreezes = false;
  /** the fake supervisor thaws from the host (vmm.host-thaw.v1; event "host-thaw <token>"); "fails": ThawVmFreeze fails */
  hostThaw: boolean | 'fails' = false;
  readonly devices = new Map<string, DeviceInfo>();
  /** the freeze as the supervisor saw it (GetVmFreeze) */
  hostFreeze: VmFreezeInfo = { token: '', frozen: false, frozenAtMs: 0, endedAtMs: 0, endedBy: 'unknown' };
  /** the supervisor lacks vmm.freeze-status.v1 (freezeStatus answers undefined) */
  noFreezeStatus = false;
  /** a podd the sandbox replaced: Quiesce answers this and freezes nothing */
  lyingQuiesce: { token: string; maxFreezeMs: number; syncMs: number; freezeMs: number } | undefined;
  readonly vms = new Map<string, VmInfo>();
  /** podd Exec, when a test sets it */
  exec: ((args: ExecArgs, signal: AbortSignal) => AsyncIterable<ExecEvent>) | undefined;
  /** podd ExecStream / ListProcesses / SignalProcess, when a test sets it (add podd.exec-stream.v1 to poddFeatures too) */
  execStreams: PoddExecStreams | undefined;
  /** called inside clone, while the parent is held */
  onClone: (deadlineMs?: number) => void = () => undefined;
  /**
   * the fake supervisor lists "vmm.network.v1" (default false: a 0.2.0 supervisor, which
   * ignores VmSpec.network); networkEnabled is what ListNetworkSlots says
   */
  network = false;
  networkEnabled = true;
  /** the slots that are not free (the supervisor's table) */
  readonly slots = new Map<number, NetworkSlotInfo>();
  /** network calls, in order: "create <vm> slot=<n>", "delete <vm> keep=<bool>", "update <vm> <allow_out>", "release <slot> <owner>" */
  netEvents: string[] = [];
  /** thrown by UpdateVmNetwork when set (a fenced call: ABORTED) */
  updateNetworkError: Error | undefined;
  private nextPid = 1000;

  private takeSlot(owner: string, vmId: string, want: number): number {
    if (want >= 0) {
      const s = this.slots.get(want);
      if (s && !(s.state === 'RESERVED' && s.owner === owner)) throw new AlreadyExistsError(`network slot ${want} is held by ${s.owner}`);
      this.slots.set(want, { slot: want, state: 'IN_USE', owner, vmId, address: formatIpv4(POOL_BASE + 4 * want + 2) });
      return want;
    }
    let n = 0;
    while (this.slots.has(n)) n++;
    this.slots.set(n, { slot: n, state: 'IN_USE', owner, vmId, address: formatIpv4(POOL_BASE + 4 * n + 2) });
    return n;
  }

  private slotOf(vmId: string): NetworkSlotInfo | undefined {
    return [...this.slots.values()].find((s) => s.state === 'IN_USE' && s.vmId === vmId);
  }

  deviceInfo(id: string): DeviceInfo {
    return { deviceId: id, path: `/dev/loop-${id}`, backingFile: `/img/${id}`, sizeBytes: 1 << 20, attached: true };
  }

  readonly devicePort: DevicePort = {
    createEmpty: async (id) => {
      const d = this.deviceInfo(id);
      this.devices.set(id, d);
      return d;
    },
    clone: async (id, src, quiesced, deadlineMs): Promise<ClonedDevice> => {
      this.events.push(`clone ${src} quiesced=${quiesced}`);
      this.onClone(deadlineMs);
      if (this.failClone) throw new Error('disk full');
      const fails = this.cloneFails?.(src);
      if (fails) throw fails;
      if (this.cloneTakesMs) {
        const late = deadlineMs !== undefined && deadlineMs < this.cloneTakesMs;
        await new Promise((r) => setTimeout(r, late ? deadlineMs : this.cloneTakesMs));
        if (late) throw new DeadlineExceededError('Deadline exceeded');
      }
      const d = this.deviceInfo(id);
      this.devices.set(id, d);
      return { ...d, cloneMs: 1, reflinked: false };
    },
    // SnapshotDevices: used only when ublkFeatures lists ublk.clone-snapshot.v1 (event "snapshot <src>,<src> quiesced=<q>"); the
    // snapshots are detached until a clone of the same ids attaches them
    snapshot: async (items, quiesced, deadlineMs) => {
      this.events.push(`snapshot ${items.map((i) => i.sourceId).join(',')} quiesced=${quiesced}`);
      this.onClone(deadlineMs);
      if (this.failClone) throw new Error('disk full');
      const fails = items.map((i) => this.cloneFails?.(i.sourceId)).find((e) => e);
      if (fails) throw fails;
      return items.map((i) => {
        const d = { ...this.deviceInfo(i.deviceId), path: '', attached: false };
        this.devices.set(i.deviceId, d);
        return { ...d, cloneMs: 1, reflinked: true };
      });
    },
    version: async () => ({ version: this.ublkFeatures.includes('ublk.clone') ? '0.2.0' : '0.1.0', features: this.ublkFeatures }),
    get: async (id) => this.devices.get(id),
    list: async () => [...this.devices.values()],
    delete: async (id) => {
      this.devices.delete(id);
    },
  };

  readonly vmPort: VmPort = {
    create: async (a) => {
      const vm: VmInfo = { vmId: a.vmId, state: 'RUNNING', pid: this.nextPid++, startTimeTicks: 1, driver: 'fake', driverVersion: '1', apiSocket: '' };
      if (a.network && this.network) {
        this.netEvents.push(`create ${a.vmId} slot=${a.network.slot}`);
        const slot = this.takeSlot(a.network.owner, a.vmId, a.network.slot);
        vm.network = {
          slot,
          address: formatIpv4(POOL_BASE + 4 * slot + 2),
          gateway: formatIpv4(POOL_BASE + 4 * slot + 1),
          hostIfname: `snfakev${slot}`,
          owner: a.network.owner,
          egress: a.network.egress,
        };
      }
      this.vms.set(a.vmId, vm);
      return { ...vm };
    },
    get: async (id) => this.vms.get(id),
    list: async () => [...this.vms.values()].map((v) => ({ ...v })),
    pause: async (id) => {
      this.events.push(`pause ${id}`);
      this.vms.get(id)!.state = 'PAUSED';
      return { ...this.vms.get(id)! };
    },
    resume: async (id) => {
      this.events.push(`resume ${id}`);
      this.vms.get(id)!.state = 'RUNNING';
      return { ...this.vms.get(id)! };
    },
    delete: async (id, opts) => {
      const s = this.slotOf(id);
      if (s) {
        this.netEvents.push(`delete ${id} keep=${opts?.keepNetwork ?? false}`);
        if (opts?.keepNetwork) this.slots.set(s.slot, { ...s, state: 'RESERVED', vmId: '' });
        else this.slots.delete(s.slot);
      }
      this.vms.delete(id);
    },
    networkStatus: async () => ({
      available: this.network && this.networkEnabled,
      reason: !this.network ? 'vmm-supervisor 0.2.0 lacks feature "vmm.network.v1"' : this.networkEnabled ? '' : "the vmm-supervisor 0.3.0's network is off: nft not found",
      slots: [...this.slots.values()].sort((a, b) => a.slot - b.slot),
      pool: '10.209.0.0/16',
      dnsPort: 15053,
      egressProxyPort: 15080,
      proxiedPorts: [80, 443],
      alwaysDenied: ['10.0.0.0/8'],
    }),
    updateNetwork: async (vmId, egress) => {
      this.netEvents.push(`update ${vmId} ${egress.allowOut.join(',')}`);
      if (this.updateNetworkError) throw this.updateNetworkError;
      const vm = this.vms.get(vmId);
      if (!vm?.network) throw new FailedPreconditionError(`vm ${vmId} has no network`);
      vm.network = { ...vm.network, egress };
      return { ...vm.network };
    },
    releaseNetworkSlot: async (slot, owner) => {
      this.netEvents.push(`release ${slot} ${owner}`);
      const s = this.slots.get(slot);
      if (s?.state === 'IN_USE') throw new FailedPreconditionError(`network slot ${slot} is in use by vm ${s.vmId}`);
      if (!s || s.owner !== owner) return false;
      this.slots.delete(slot);
      return true;
    },
    freezeStatus: async () => (this.noFreezeStatus ? undefined : this.hostFreeze),
    // a supervisor with "vmm.freeze-arm.v1" only when armFreezes is set (events "arm <id> <window>" / "disarm <id>")
    armFreeze: async (id, windowMs) => {
      if (!this.armFreezes) return false;
      this.events.push(`arm ${id} ${windowMs}`);
      return true;
    },
    disarmFreeze: async (id) => {
      this.events.push(`disarm ${id}`);
    },
    thawFreeze: async (_id, token) => {
      if (!this.hostThaw) return undefined;
      this.events.push(`host-thaw ${token}`);
      if (this.hostThaw === 'fails') throw new Error('supervisor gone');
      if (this.hostFreeze.frozen && this.hostFreeze.token === token) this.hostFreeze = { ...this.hostFreeze, frozen: false, endedAtMs: Date.now(), endedBy: this.thawEndedBy };
      return { endedBy: this.thawEndedBy, frozenMs: 17 };
    },
  };

  readonly podd: PoddConnector = {
    connect: (address): PoddClient => ({
      health: async () => this.poddHealthy,
      bulkTransfers: async (timeoutMs) => {
        const b = this.poddBulk;
        if (b === 'hang') {
          await new Promise((r) => setTimeout(r, timeoutMs));
          throw new Error('podd Health: deadline exceeded');
        }
        if (b instanceof Error) throw b;
        return b;
      },
      version: async () => ({ version: this.poddFeatures.length ? '0.2.0' : '0.1.0', features: this.poddFeatures }),
      quiesce: async (max) => {
        this.events.push(`quiesce ${address.split('/').at(-2)} ${max}`);
        if (this.quiesceError) throw this.quiesceError;
        if (this.lyingQuiesce) return this.lyingQuiesce;
        this.hostFreeze = { token: 't1', frozen: true, frozenAtMs: Date.now(), endedAtMs: 0, endedBy: 'unknown' };
        return { token: 't1', maxFreezeMs: max, syncMs: 1, freezeMs: 1 };
      },
      thaw: async (token) => {
        this.events.push(`thaw ${token}`);
        if (this.hostFreeze.frozen) this.hostFreeze = { ...this.hostFreeze, frozen: false, endedAtMs: Date.now(), endedBy: this.thawEndedBy };
        return { endedBy: this.thawEndedBy, frozenMs: 42 };
      },
      exec: (args, signal) => {
        if (!this.exec) throw new Error('not used');
        return this.exec(args, signal);
      },
      readFile: async () => {
        throw new Error('not used');
      },
      writeFile: async () => {
        throw new Error('not used');
      },
      execStreams: this.execStreams,
      close: () => undefined,
    }),
    forget: () => undefined,
  };
}

export const templates: TemplateCatalog = {
  get: async (name) => ({ name, poddVersion: '0.2.0', rootfsPath: '/tpl', sizeBytes: 1, createdAtMs: 0, buildMs: 0 }),
  list: async () => [],
  build: async () => {
    throw new Error('not used');
  },
  delete: async () => {
    throw new Error('not used');
  },
};

/**
 * managerOptions: the SandboxManager of a core unit test, on these peers and store, with the
 * node's test defaults (1 vcpu, 512 MiB, 1 MiB disk, podd 5 s, no host sync); extra overrides.
 */
export function managerOptions(peers: Peers, store: RecordStore, dir: string, extra: Partial<SandboxManagerOptions> = {}): SandboxManagerOptions {
  return {
    store,
    vms: peers.vmPort,
    devices: peers.devicePort,
    podd: peers.podd,
    templates,
    log: createLogger('test', '0', 'silent'),
    runDir: path.join(dir, 'run'),
    resourceDefaults: { vcpus: 1, memoryMib: 512, diskBytes: 1 << 20 },
    poddReadyTimeoutMs: 5000,
    syncHost: async () => undefined,
    ...extra,
  };
}
