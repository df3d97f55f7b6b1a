/**
 * The embedded runc driver: each VM is a detached OCI container whose container id is the vm
 * id. Host layout under `<runDir>/vms/<id>/`:
 *
 *   upper-dev/   the rootfs-upper drive (ext4), holding upper/ and work/
 *   rootfs/      overlay: lowerdir = template rootfs, upperdir/workdir on upper-dev
 *   workspace/   the workspace drive (ext4), bind-mounted at /workspace
 *   bundle/      config.json (OCI spec) and init.pid
 *   console.log  stdio of runc and of the container in VMs of 0.2.0 (a file on the host disk)
 *   freeze-port/ the VM's FreezePortService socket freeze.sock, read-only at /run/sandnode-freeze
 *   freeze-state.json  the VM's current or latest filesystem freeze (see freeze-port.ts)
 *
 * The container is started with `runc run -d` in a new session with file stdio and its own
 * cgroup (`/sandnode/<id>`), so it is in no process group or cgroup of the supervisor and
 * survives a kill -9 of it. podd's listening socket is bound on the host at
 * `<podd_socket_dir>/podd.sock` and handed in as fd 3 (`--preserve-fds 1`); only
 * `<podd_socket_dir>/guest` is mounted (at /run/sandnode).
 *
 * Two small tmpfs of the VM live in `<runDir>/vm-tmpfs/<id>/` (vm-tmpfs.ts): guest/, the
 * guest run dir at /run/sandnode (`<podd_socket_dir>/guest` links to it), and console/, whose
 * console.log gets the stdio of runc and of the container (a file, never a pipe; kept under
 * its cap by console-log.ts).
 * With a user namespace range (config `usernsRange`, userns.ts) the container's root is the
 * range's host root: the overlay's lower is a copy of the template owned in the range, the
 * upper dir, workspace and guest dir are made the range's before the VM starts, and the host
 * dirs on the way (`vms/`, the VM dir, freeze-port/) are root:<range gid> 0710.
 *
 * Every call on an existing VM uses the runc binary recorded for it (a versioned copy), so a
 * host runc upgrade never changes the binary that manages a running container.
 */
import { spawn } from 'node:child_process';
import { closeSync, existsSync, fchownSync, fstatSync, mkdirSync, openSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { mkdir, rm } from 'node:fs/promises';
import path from 'node:path';
import { CommandError, FailedPreconditionError, InternalError, processLiveness, processStartTicks, run, VMM_FEATURES } from '@sandnode/shared';
import type { Logger } from '@sandnode/shared';
import type { LiveStatus, StartedVm, VmDriver, VmRef } from '../core/driver';
import { HostStepError } from '../core/host-error';
import type { EffectiveResources, VmSpec } from '../core/types';
import type { FreezeEnd, FreezeStatus } from '../core/freeze';
import { resolveExecutable } from './binary';
import type { VmNetworkInfo } from '../network/manager';
import { writeNetFiles } from './net-files';
import { ensureDirNoFollow, openRootDir, replaceFileNoFollow, UnsafePathError } from './beneath';
import { runCommand } from './command-runner';
import { bindPoddSocket, PODD_LISTEN_FD, preparePoddDirs, type PoddSocket } from './podd-socket';
import { failpoints, FAILPOINTS } from '../core/failpoints';
import { commandLabel, hostCommands } from '../metrics';
import { deleteStopped, freeze, freezerDir, killFrozen, liveStatus, setCpuBurst, signalInit, thaw } from './runc-cgroup';
import { cgroup2Stats, freeze2, kill2, liveStatus2, thaw2, VM_CGROUP_PARENT, vmCgroup2Dir, type Cgroup2Stats } from './runc-cgroup2';
import { cgroup2Offers, detectCgroupHierarchy, type CgroupHierarchy } from './cgroup-hierarchy';
import { mount, mountsUnderIn, mountTable, unmountChains } from './mounts';
import { buildOciSpec, CPU_PERIOD_US } from './oci-spec';
import type { SeccompProfile } from './seccomp';
import { CONSOLE_LOG_FILE, consoleTail, ConsoleWatch, DEFAULT_CONSOLE_LOG_BYTES } from './console-log';
import { runcIsolation } from './isolation';
import { blkioWeightOffered, driveBlockIo, ioLimitsInEffect, type IoLimits } from './block-io';
import { DEFAULT_GUEST_RUN_DIR_BYTES, mountVmTmpfs, removeVmTmpfsDir, vmTmpfsChains, vmTmpfsPaths } from './vm-tmpfs';
import { FREEZE_PORT_DIR, makeFreezePortDir, MAX_SOCKET_PATH_BYTES, vmCgroupRunning, VmFreezer } from './freeze-port';
import type { FreezePortServe, FreezePortServer } from '../rpc/freeze-port-service';
import { ensureTreeInRange, inRange, lchownIntoRange, makeTraversable, openToRange, ShiftedTemplates, type UsernsRange } from './userns';

/** What the driver mounts in each VM dir (`<vmDir>/<name>`), in unmount order. */
/**
 * The VM dir's mounts as unmount chains (mounts.ts unmountChains: the chains at once, each in
 * its order): the overlay rootfs before upper-dev (its upper dir lies there); the workspace on
 * its own.
 */
const VM_UNMOUNT_CHAINS = [['rootfs', 'upper-dev'], ['workspace']];
const VM_MOUNTS = VM_UNMOUNT_CHAINS.flat();

/** Default of the longest a `runc run -d` may take before it is killed, in ms (config `runcStartTimeoutMs`). */
export const DEFAULT_RUNC_START_TIMEOUT_MS = 30_000;
/** Default of the longest a VM may take to be gone after SIGKILL, in ms (config `killWaitMs`). */
export const DEFAULT_KILL_WAIT_MS = 5_000;
/** SIGTERM's number (a VM's init gets it first on a stop). */
const SIGTERM = 15;
/** Poll interval while waiting for a container to stop, in ms. */
export const STOP_POLL_MS = 25;
/** How often a stop checks whether the VM's init process is gone (in-process, /proc), in ms. */
export const INIT_POLL_MS = 2;

/**
 * isAlive says whether pid still runs as the process that started at startTicks (a zombie counts
 * as gone); a /proc entry that cannot be read (EMFILE ...) counts as alive: a VM is never taken
 * for stopped on a read that failed (processLiveness).
 */
function isAlive(pid: number, startTicks: number): boolean {
  return processLiveness(pid, startTicks) !== 'gone';
}

/** RuncDriverOptions configure the driver. */
export interface RuncDriverOptions {
  /** runc binary name or path. */
  runcBinary: string;
  /** runc state dir (`runc --root`). */
  runcRoot: string;
  /** The supervisor's runtime dir; VMs live in `<runDir>/vms/<id>`. */
  runDir: string;
  log: Logger;
  /**
   * Starts a VM's freeze port (FreezePortService on `<vmDir>/freeze-port/freeze.sock`); without
   * it VMs get the freeze-port dir and mount but nothing serves it (unit tests).
   */
  serveFreezePort?: FreezePortServe;
  /** Longest a `runc run -d` may take, in ms (default {@link DEFAULT_RUNC_START_TIMEOUT_MS}). */
  startTimeoutMs?: number;
  /** Longest a VM may take to be gone after SIGKILL, in ms (default {@link DEFAULT_KILL_WAIT_MS}). */
  killWaitMs?: number;
  /** The OCI seccomp profile of new VMs (seccomp.ts); undefined = none ("unconfined"). */
  seccomp?: SeccompProfile;
  /** Size of a VM's guest run dir tmpfs (/run/sandnode), in bytes (default {@link DEFAULT_GUEST_RUN_DIR_BYTES}). */
  guestRunDirBytes?: number;
  /** Cap of a VM's console log, in bytes (default {@link DEFAULT_CONSOLE_LOG_BYTES}). */
  consoleLogBytes?: number;
  /**
   * The user namespace of new VMs (userns.ts): the node-wide range and the dir of the template
   * copies owned in it; undefined = none (root inside is host root).
   */
  userns?: { range: UsernsRange; templatesDir: string };
  /** I/O limits of each new VM's drives (block-io.ts); undefined = none. */
  io?: IoLimits;
  /** Whether the host offers an I/O weight; default: the blkio hierarchy's weight file exists (block-io.ts), on a unified host io.weight or io.bfq.weight (cgroup-hierarchy.ts cgroup2Offers). */
  ioWeightOffered?: boolean;
  /**
   * The cgroup2 tree whose files the driver reads and writes to freeze, thaw, kill and read a
   * VM (runc-cgroup2.ts). Default: `/sys/fs/cgroup` on a unified host; none on a hybrid or
   * legacy host, where runc pauses with the v1 freezer and so does the driver (runc-cgroup.ts).
   * Tests on a hybrid host name its `/sys/fs/cgroup/unified`, where runc also puts each VM.
   */
  cgroupV2Root?: string;
  /** The host's cgroup layout; default: detected as runc does (cgroup-hierarchy.ts). */
  cgroupHierarchy?: CgroupHierarchy;
}

/** Status reported by `runc state`, or "absent" when runc has no such container. */
export type RuncStatus = 'created' | 'running' | 'paused' | 'stopped' | 'absent';

/** RuncDriver implements VmDriver with runc. */
export class RuncDriver implements VmDriver {
  readonly name = 'runc';
  readonly features: readonly string[];
  private readonly runc: string;
  private readonly root: string;
  private readonly vmsDir: string;
  private readonly log: Logger;
  private cachedVersion: string | undefined;
  private current: string | undefined;
  private readonly serveFreezePort: FreezePortServe | undefined;
  private readonly startTimeoutMs: number;
  private readonly killWaitMs: number;
  private readonly seccomp: SeccompProfile | undefined;
  private readonly runDir: string;
  private readonly guestRunDirBytes: number;
  private readonly consoleLogBytes: number;
  /** Console logs kept under their cap now, by vm id. */
  private readonly consoles = new Map<string, ConsoleWatch>();
  private readonly userns: UsernsRange | undefined;
  private readonly shiftedTemplates: ShiftedTemplates | undefined;
  private readonly io: IoLimits | undefined;
  private readonly ioWeightOffered: boolean;
  /** The cgroup2 tree of the VMs' freeze, thaw, kill and status; undefined: the v1 freezer. */
  private readonly v2Root: string | undefined;
  /** Whether new VMs get no swap (spec memory.swap = memory.limit): a unified host with swap accounting. */
  private readonly noSwap: boolean;
  /** Freeze ports served now, by vm id. */
  private readonly ports = new Map<string, { freezer: VmFreezer; server: FreezePortServer | undefined }>();

  constructor(opts: RuncDriverOptions) {
    this.runc = opts.runcBinary;
    this.root = path.resolve(opts.runcRoot);
    this.vmsDir = path.join(path.resolve(opts.runDir), 'vms');
    this.log = opts.log;
    this.serveFreezePort = opts.serveFreezePort;
    this.startTimeoutMs = opts.startTimeoutMs ?? DEFAULT_RUNC_START_TIMEOUT_MS;
    this.killWaitMs = opts.killWaitMs ?? DEFAULT_KILL_WAIT_MS;
    this.seccomp = opts.seccomp;
    this.runDir = path.resolve(opts.runDir);
    this.guestRunDirBytes = opts.guestRunDirBytes ?? DEFAULT_GUEST_RUN_DIR_BYTES;
    this.consoleLogBytes = opts.consoleLogBytes ?? DEFAULT_CONSOLE_LOG_BYTES;
    this.userns = opts.userns?.range;
    this.shiftedTemplates = opts.userns ? new ShiftedTemplates(opts.userns.templatesDir, opts.userns.range, this.log) : undefined;
    this.io = opts.io;
    const cg = opts.cgroupHierarchy ?? detectCgroupHierarchy();
    const unifiedRoot = cg.mode === 'unified' ? cg.v2Root : undefined;
    this.v2Root = opts.cgroupV2Root ?? unifiedRoot;
    this.ioWeightOffered = opts.ioWeightOffered ?? (unifiedRoot ? cgroup2Offers(unifiedRoot, 'io', ['io.weight', 'io.bfq.weight']) : blkioWeightOffered());
    // v2's memory.swap.max is swap on top of memory.max, unlimited unless set (v1's memsw
    // limit is left unset, as before: runc fails a start whose memsw file is missing)
    this.noSwap = unifiedRoot !== undefined && cgroup2Offers(unifiedRoot, 'memory', ['memory.swap.max']);
    if (unifiedRoot && !this.noSwap) this.log.info({ cgroup_root: unifiedRoot }, 'no swap accounting in the cgroup2 tree (memory.swap.max): VMs swap without a limit if the host has swap');
    if (this.io && this.io.weight > 0 && !this.ioWeightOffered)
      this.log.info({ io_weight: this.io.weight }, 'ioWeight skipped: the blkio hierarchy offers no weight (no blkio.weight nor blkio.bfq.weight)');
    this.features = [
      VMM_FEATURES.runc,
      VMM_FEATURES.poddSocketFd,
      VMM_FEATURES.versionedBinaries,
      VMM_FEATURES.freezePort,
      VMM_FEATURES.machineId,
      ...runcIsolation({ seccomp: opts.seccomp !== undefined, userns: opts.userns !== undefined, ioLimits: ioLimitsInEffect(this.io, this.ioWeightOffered) }),
    ];
    mkdirSync(this.root, { recursive: true, mode: 0o700 });
    mkdirSync(this.vmsDir, { recursive: true, mode: 0o700 });
    if (this.userns) {
      // runc's init, as the range's root, walks to <vmDir>/rootfs: every dir on the way must let it pass
      makeTraversable(this.runDir, this.userns, this.log);
      openToRange(this.vmsDir, this.userns);
    }
  }

  /** vmDir is the host dir of one VM. */
  vmDir(vmId: string): string {
    return path.join(this.vmsDir, vmId);
  }

  /** configuredBinary resolves `runcBinary` to an absolute path (ConfigError naming the key if missing). */
  configuredBinary(): string {
    return resolveExecutable(this.runc, 'runcBinary');
  }

  /** useBinary makes path the runc new containers start with. */
  useBinary(binary: string): void {
    this.current = binary;
  }

  /** currentBinary is the runc new containers start with. */
  currentBinary(): string {
    return this.current ?? this.configuredBinary();
  }

  /** version parses `runc --version` of the configured binary ("runc version 1.1.5+ds1" -> "1.1.5+ds1"). */
  async version(): Promise<string> {
    if (this.cachedVersion === undefined) {
      const { stdout } = await run(this.configuredBinary(), ['--version']);
      const m = /runc version (\S+)/.exec(stdout);
      this.cachedVersion = m?.[1] ?? stdout.split('\n')[0]?.trim() ?? 'unknown';
    }
    return this.cachedVersion;
  }

  async create(vmId: string, spec: VmSpec, resources: EffectiveResources, net?: VmNetworkInfo): Promise<StartedVm> {
    const runc = this.currentBinary();
    const dir = this.vmDir(vmId);
    const upperDev = path.join(dir, 'upper-dev');
    const rootfs = path.join(dir, 'rootfs');
    const workspace = path.join(dir, 'workspace');
    const bundle = path.join(dir, 'bundle');
    const pidFile = path.join(bundle, 'init.pid');
    const upper = spec.drives.find((d) => d.role === 'rootfs-upper')!;
    const ws = spec.drives.find((d) => d.role === 'workspace');
    let step = 'prepare dirs';
    let podd: PoddSocket | undefined;
    try {
      if (existsSync(dir)) await this.destroy({ vmId, binary: runc, process: { pid: 0, startTimeTicks: 0 }, apiSocket: '' }); // leftovers of an earlier failed attempt
      await mkdir(dir, { recursive: true, mode: 0o700 });
      if (this.userns) openToRange(dir, this.userns);
      for (const d of [upperDev, rootfs, bundle]) await mkdir(d, { recursive: true });
      step = 'mount guest run dir and console tmpfs';
      const tmpfs = vmTmpfsPaths(this.runDir, vmId);
      await mountVmTmpfs(tmpfs, { guestBytes: this.guestRunDirBytes, consoleBytes: this.consoleLogBytes });
      if (this.userns) {
        // runc's init, as the range's root, binds guest/ at /run/sandnode: the dirs on the way must let it pass
        openToRange(path.dirname(tmpfs.dir), this.userns);
        openToRange(tmpfs.dir, this.userns);
      }
      const consoleLog = path.join(tmpfs.console, CONSOLE_LOG_FILE);
      step = `prepare podd socket dir ${spec.poddSocketDir}`;
      const guestDir = preparePoddDirs(spec.poddSocketDir, tmpfs.guest);
      // podd writes its log there (a log of a boot without the namespace is host root's: shifted too)
      if (this.userns) this.ownTree(vmId, 'guest dir', guestDir, this.userns);

      step = `mount rootfs upper drive ${upper.path}`;
      await mount(upper.path, upperDev, 'ext4', SANDBOX_FS_HOST_OPTIONS);
      await mkdir(path.join(upperDev, 'upper'), { recursive: true, mode: 0o755 });
      await mkdir(path.join(upperDev, 'work'), { recursive: true, mode: 0o755 });
      if (this.userns) {
        step = 'own the upper dir in the user namespace range';
        this.ownTree(vmId, 'upper', path.join(upperDev, 'upper'), this.userns);
      }
      if (spec.machineId) {
        step = 'write /etc/machine-id';
        if (!writeMachineId(path.join(upperDev, 'upper'), spec.machineId, this.userns))
          this.log.warn({ vm_id: vmId }, 'the sandbox replaced its /etc (symlink or not a directory): machine-id left as it is');
      }

      step = 'template rootfs of the user namespace range';
      const lower = this.shiftedTemplates ? await this.shiftedTemplates.rootfsFor(spec.templateRootfs) : spec.templateRootfs;
      step = 'mount overlay rootfs';
      await mount('overlay', rootfs, 'overlay', [`lowerdir=${lower}`, `upperdir=${path.join(upperDev, 'upper')}`, `workdir=${path.join(upperDev, 'work')}`]);

      if (ws) {
        step = `mount workspace drive ${ws.path}`;
        await mkdir(workspace, { recursive: true });
        await mount(ws.path, workspace, 'ext4', ws.readOnly ? ['ro', ...SANDBOX_FS_HOST_OPTIONS] : SANDBOX_FS_HOST_OPTIONS);
        if (this.userns && !ws.readOnly) {
          step = 'own the workspace in the user namespace range';
          this.ownTree(vmId, 'workspace', workspace, this.userns);
        }
      }

      failpoints.hit(FAILPOINTS.createAfterMounts);

      step = 'serve freeze port';
      const freezePortDir = makeFreezePortDir(dir);
      await this.openFreezePort(vmId, runc);

      let network: { netnsPath: string; resolvConf: string; hosts: string } | undefined;
      if (net) {
        step = 'write resolv.conf and hosts';
        network = writeNetFiles(dir, net, spec.hostname || vmId);
      }

      step = 'write bundle/config.json';
      const blockIO = driveBlockIo(
        this.io,
        spec.drives.map((d) => d.path),
        this.ioWeightOffered,
      );
      const oci = buildOciSpec({
        vmId,
        rootfsPath: rootfs,
        poddGuestDir: guestDir,
        freezePortDir,
        poddListenFd: PODD_LISTEN_FD,
        workspacePath: ws ? workspace : undefined,
        workspaceReadOnly: ws?.readOnly,
        hostname: spec.hostname,
        env: spec.env,
        resources,
        seccomp: this.seccomp,
        userns: this.userns,
        blockIO,
        network,
        noSwap: this.noSwap,
      });
      writeFileSync(path.join(bundle, 'config.json'), `${JSON.stringify(oci, null, 2)}\n`, { mode: 0o600 });

      step = 'bind podd socket';
      podd = await bindPoddSocket(spec.poddSocketDir);

      step = 'runc run';
      await this.runDetached(runc, vmId, bundle, pidFile, consoleLog, podd.fd);
      // a burst of one quota: the init and podd start on threads at once (runc 1.1 has no spec field for it)
      setCpuBurst(vmId, resources.vcpus * CPU_PERIOD_US, undefined, this.v2Root);
      this.watchConsole(vmId);
      // The container holds the socket now: publish its name and drop our copy.
      step = 'publish podd socket';
      podd.publish();

      step = 'read init pid';
      const pid = Number(readFileSync(pidFile, 'utf8').trim());
      const startTimeTicks = processStartTicks(pid);
      if (startTimeTicks === undefined) throw new InternalError(`init pid ${pid} is not alive: ${consoleTail(consoleLog, 5)}`);
      return { process: { pid, startTimeTicks }, apiSocket: '', isolation: runcIsolation({ seccomp: this.seccomp !== undefined, userns: this.userns !== undefined, ioLimits: blockIO !== undefined }) };
    } catch (err) {
      podd?.discard();
      const why = err instanceof Error ? err.message : String(err);
      this.log.error({ vm_id: vmId, step, err }, 'create failed; undoing');
      let undo = '';
      try {
        await this.destroy({ vmId, binary: runc, process: { pid: 0, startTimeTicks: 0 }, apiSocket: '' });
      } catch (undoErr) {
        undo = `; undo failed too: ${(undoErr as Error).message}`;
        this.log.error({ vm_id: vmId, err: undoErr }, 'undo of a failed create failed');
      }
      throw new HostStepError(`create vm ${vmId}: ${step}`, `${why}${undo}`);
    }
  }

  async inspect(vm: VmRef): Promise<LiveStatus> {
    const { vmId, process: expected } = vm;
    // from its init and cgroup (no process start); runc where that cannot tell
    const fast = this.fastStatus(vm);
    if (fast === 'stopped') return { state: 'stopped', detail: `pid ${expected.pid} with start ticks ${expected.startTimeTicks} is gone` };
    if (fast) return { state: fast, process: expected };
    const st = await this.state(vmId, this.bin(vm));
    if (st.status === 'absent') return { state: 'stopped', detail: 'runc has no such container' };
    if (st.status !== 'running' && st.status !== 'paused') return { state: 'stopped', detail: `runc status ${st.status}` };
    if (st.pid !== expected.pid || processLiveness(expected.pid, expected.startTimeTicks) === 'gone') {
      return { state: 'stopped', detail: `pid ${expected.pid} with start ticks ${expected.startTimeTicks} is gone (runc pid ${st.pid})` };
    }
    return { state: st.status, process: expected };
  }

  /**
   * pause freezes the VM's cgroup as `runc pause` does, in-process: cgroup.freeze in the v2 tree
   * (runc-cgroup2.ts) or the v1 freezer (runc-cgroup.ts); with runc when that cannot (not
   * running, cgroup not found, stuck freezing).
   */
  async pause(vm: VmRef): Promise<void> {
    if (this.v2Root !== undefined) {
      const dir = this.cgroup2Of(vm);
      if (dir && liveStatus2(dir, vm.process) === 'running' && (await freeze2(dir))) return;
    } else {
      const dir = freezerDir(vm.vmId);
      if (dir && liveStatus(vm.vmId, vm.process) === 'running' && (await freeze(dir))) return;
    }
    await this.exec(this.bin(vm), ['pause', vm.vmId]);
  }

  /** resume thaws the VM's cgroup as `runc resume` does, in-process; with runc when that cannot (not paused, no v1 freezer). */
  async resume(vm: VmRef): Promise<void> {
    if (!this.thawFast(vm)) await this.exec(this.bin(vm), ['resume', vm.vmId]);
  }

  /** thawFast thaws a paused VM through its v2 cgroup.freeze or v1 freezer; false (nothing done) when it cannot tell or cannot write it. */
  private thawFast(vm: VmRef): boolean {
    if (this.v2Root !== undefined) {
      const dir = this.cgroup2Of(vm);
      return dir !== undefined && liveStatus2(dir, vm.process) === 'paused' && thaw2(dir);
    }
    const dir = freezerDir(vm.vmId);
    return dir !== undefined && liveStatus(vm.vmId, vm.process) === 'paused' && thaw(dir);
  }

  /** cgroup2Of is vm's dir in the driver's cgroup2 tree, found from runc's state and its init (runc-cgroup2.ts); undefined without a v2 tree or when it cannot be sure. */
  private cgroup2Of(vm: VmRef): string | undefined {
    return this.v2Root === undefined ? undefined : vmCgroup2Dir(this.root, vm.vmId, vm.process, this.v2Root);
  }

  /** fastStatus is what `runc state` would say, read from the VM's init and cgroup (v2 tree or v1 freezer); undefined when that cannot tell. */
  private fastStatus(vm: VmRef): 'stopped' | 'paused' | 'running' | undefined {
    return this.v2Root !== undefined ? liveStatus2(this.cgroup2Of(vm), vm.process) : liveStatus(vm.vmId, vm.process);
  }

  /**
   * killFast SIGKILLs every process of the VM in-process: cgroup.kill in the v2 tree (frozen or
   * not), or with the v1 freezer each task of a frozen cgroup (killFrozen); false when it
   * cannot (the caller runs `runc kill --all`).
   */
  private killFast(vm: VmRef): boolean {
    if (this.v2Root !== undefined) {
      const dir = this.cgroup2Of(vm);
      return dir !== undefined && kill2(dir, `/${VM_CGROUP_PARENT}/${vm.vmId}`);
    }
    return killFrozen(vm.vmId) !== undefined;
  }

  /**
   * stats reads what the VM's cgroup used (cgroup2 tree only: cpu.stat, and memory.current,
   * memory.swap.current, pids.current where those controllers are in the tree; see
   * runc-cgroup2.ts Cgroup2Stats for units); undefined without a v2 tree or when the cgroup
   * cannot be found for sure (the VM stopped, its init is not vm.process).
   */
  stats(vm: VmRef): Cgroup2Stats | undefined {
    const dir = this.cgroup2Of(vm);
    return dir === undefined ? undefined : cgroup2Stats(dir);
  }

  async stop(vm: VmRef, timeoutMs: number, signal?: AbortSignal): Promise<void> {
    const { vmId } = vm;
    const runc = this.bin(vm);
    // Tasks blocked on a frozen filesystem do not die until it is thawed.
    await this.ports.get(vmId)?.freezer.ensureThawed('stop vm');
    // from its init and cgroup (no process start); runc where that cannot tell
    const fast = this.fastStatus(vm);
    const st = fast ? { status: fast } : await this.state(vmId, runc);
    if (st.status === 'absent' || st.status === 'stopped') return;
    const dir2 = st.status === 'paused' ? this.cgroup2Of(vm) : undefined;
    if (dir2 !== undefined && kill2(dir2, `/${VM_CGROUP_PARENT}/${vmId}`)) {
      // v2: cgroup.kill ends frozen tasks too, so the init may be a zombie or gone at once (the
      // status then no longer says paused): thaw the dir found before the kill, no runc; a dir
      // already removed (its tasks gone) is fine
      thaw2(dir2);
    } else if (st.status === 'paused') {
      // Frozen tasks do not die until thawed (v1): queue SIGKILL, then thaw.
      if (!this.killFast(vm)) await this.killAll(runc, vmId);
      if (!this.thawFast(vm) && this.fastStatus(vm) !== 'stopped') await this.exec(runc, ['resume', vmId]).catch(() => undefined); // runc may already have thawed it
    } else {
      const term = signalInit(vm.process, SIGTERM);
      if (term === 'not-verified') await this.exec(runc, ['kill', vmId, 'TERM']).catch((err: unknown) => this.log.debug({ vm_id: vmId, err }, 'SIGTERM failed'));
      if (await this.waitStopped(runc, vmId, timeoutMs, signal, vm.process)) return;
      this.log.info({ vm_id: vmId, timeout_ms: timeoutMs }, 'vm ignored SIGTERM; sending SIGKILL');
      // the v2 tree's cgroup.kill; the v1 freezer's killFrozen holds only for a frozen cgroup: runc
      if (this.v2Root === undefined || !this.killFast(vm)) await this.killAll(runc, vmId);
    }
    if (!(await this.waitStopped(runc, vmId, this.killWaitMs, undefined, vm.process))) {
      throw new InternalError(`stop vm ${vmId}: processes still alive ${this.killWaitMs} ms after SIGKILL`);
    }
  }

  async destroy(vm: VmRef): Promise<void> {
    const { vmId } = vm;
    const runc = this.bin(vm);
    const dir = this.vmDir(vmId);
    const tmpfs = vmTmpfsPaths(this.runDir, vmId);
    // mountinfo is read twice (it has a line per mount of every sandbox): what is mounted
    // before, and what is left after the unmounts
    const before = mountTable();
    // a mount of someone else below the VM dir (a tmpfs at <dir>/workspace/mine) would make
    // our unmounts fail after the container is gone: refuse first, with nothing done
    const foreign = mountsUnderIn(before, dir).filter((m) => !VM_MOUNTS.includes(path.relative(dir, m)));
    if (foreign.length) {
      throw new FailedPreconditionError(`destroy vm ${vmId}: ${foreign.join(', ')} is mounted below ${dir} and sandnode did not mount it: unmount it and delete again; nothing was done`);
    }
    await this.closeFreezePort(vmId);
    this.consoles.get(vmId)?.close();
    this.consoles.delete(vmId);
    // A VM whose init is known and gone is stopped (neither paused nor running): no need to
    // ask runc (each runc call is a process start, the bulk of a drain's CPU time).
    let st: { status: RuncStatus } = vm.process.pid > 0 && !isAlive(vm.process.pid, vm.process.startTimeTicks) ? { status: 'stopped' } : await this.state(vmId, runc);
    // a stopped container's runc state is removed in-process when that is sure (runc-cgroup.ts)
    if (st.status === 'stopped' && (await deleteStopped(this.root, vmId))) st = { status: 'absent' };
    if (st.status !== 'absent') {
      if (st.status === 'paused') await this.killAll(runc, vmId);
      await this.exec(runc, ['delete', '--force', vmId]).catch((err: unknown) => {
        if (!(err instanceof CommandError && /does not exist/i.test(err.stderr))) throw err;
      });
    }
    // the VM dir's chains and the two tmpfs at once: each unmount flushes a filesystem, and
    // none of them lies on another chain's
    await unmountChains([...VM_UNMOUNT_CHAINS.map((c) => c.map((sub) => path.join(dir, sub))), ...vmTmpfsChains(tmpfs)], before);
    const after = mountTable();
    const left = mountsUnderIn(after, dir);
    if (left.length) throw new InternalError(`destroy vm ${vmId}: mounts left under ${dir}: ${left.join(', ')}`);
    await rm(dir, { recursive: true, force: true });
    await removeVmTmpfsDir(tmpfs, after).catch((err: unknown) => {
      throw new InternalError(`destroy vm ${vmId}: ${(err as Error).message}`);
    });
  }

  /**
   * adopt runs at supervisor start for every VM in the table (not creating): a VM made with a
   * freeze-port dir gets its recorded freeze recovered (past its deadline -> made sure thawed)
   * and, when live, its freeze port served again (the stale socket is replaced). VMs of 0.1.0
   * have no freeze-port dir and get no port.
   */
  async adopt(vm: VmRef, live: boolean): Promise<void> {
    if (live) this.watchConsole(vm.vmId);
    if (!existsSync(path.join(this.vmDir(vm.vmId), FREEZE_PORT_DIR))) return;
    const freezer = this.freezerOf(vm.vmId, this.bin(vm));
    await freezer.recover();
    if (live) {
      makeFreezePortDir(this.vmDir(vm.vmId));
      await this.openFreezePort(vm.vmId, this.bin(vm), freezer);
    }
  }

  /**
   * close (daemon shutdown) leaves every freeze port bound: its socket file stays, so a podd
   * that restarts while the supervisor is down still finds its port (and lists podd.quiesce);
   * its calls get UNAVAILABLE until the next supervisor serves the port again. Freezes are left
   * to their watchdogs.
   */
  async close(): Promise<void> {
    for (const c of this.consoles.values()) c.close();
    this.consoles.clear();
    this.log.info({ ports: this.ports.size }, 'freeze ports left bound for the next supervisor');
  }

  /**
   * watchConsole keeps vmId's console log (VMs made with a console tmpfs; not those of 0.2.0)
   * under its cap while this supervisor runs.
   */
  private watchConsole(vmId: string): void {
    const file = path.join(vmTmpfsPaths(this.runDir, vmId).console, CONSOLE_LOG_FILE);
    if (this.consoles.has(vmId) || !existsSync(file)) return;
    this.consoles.set(vmId, new ConsoleWatch(file, this.consoleLogBytes, this.log.child({ vm_id: vmId })));
  }

  /** freezeStatus is the VM's freeze record as its freeze port's freezer saw it (undefined: no port). */
  async freezeStatus(vmId: string): Promise<FreezeStatus | undefined> {
    return this.ports.get(vmId)?.freezer.status();
  }

  /** thawFreeze thaws the VM's freeze named by token through its freezer (undefined: no port). */
  async thawFreeze(vmId: string, token: string): Promise<{ endedBy: FreezeEnd; frozenMs: number } | undefined> {
    return this.ports.get(vmId)?.freezer.thaw(token);
  }

  private freezerOf(vmId: string, runc: string): VmFreezer {
    return (
      this.ports.get(vmId)?.freezer ??
      new VmFreezer({
        vmId,
        vmDir: this.vmDir(vmId),
        log: this.log,
        // from the VM's cgroup (no process start per freeze); runc state where it cannot tell
        isRunning: async () => vmCgroupRunning(`/sandnode/${vmId}`) ?? (await this.state(vmId, runc)).status === 'running',
      })
    );
  }

  /** openFreezePort serves vmId's freeze port (if a server factory is configured) and remembers it. */
  private async openFreezePort(vmId: string, runc: string, freezer = this.freezerOf(vmId, runc)): Promise<void> {
    let server: FreezePortServer | undefined;
    if (Buffer.byteLength(freezer.socketPath) > MAX_SOCKET_PATH_BYTES) {
      // The VM then simply has no port (podd lacks podd.quiesce; the server falls back to pause).
      this.log.warn({ vm_id: vmId, socket: freezer.socketPath }, 'freeze port socket path is too long for a unix socket; VM gets no freeze port');
    } else if (this.serveFreezePort) {
      server = await this.serveFreezePort(vmId, freezer.socketPath, freezer);
    }
    if (this.userns && server) {
      // podd connects as the range's root: connect(2) needs write permission on the socket
      openToRange(path.dirname(freezer.socketPath), this.userns, 0o750); // it may list its own port dir (read-only)
      lchownIntoRange(freezer.socketPath, this.userns);
    }
    this.ports.set(vmId, { freezer, server });
  }

  /** closeFreezePort thaws a freeze that still holds and stops the VM's freeze port. */
  private async closeFreezePort(vmId: string): Promise<void> {
    const port = this.ports.get(vmId);
    const freezer = port?.freezer ?? (existsSync(path.join(this.vmDir(vmId), 'freeze-state.json')) ? this.freezerOf(vmId, this.currentBinary()) : undefined);
    try {
      await freezer?.ensureThawed('destroy vm');
    } finally {
      this.ports.delete(vmId);
      await port?.server?.close();
    }
  }

  /**
   * ownTree makes a sandbox's upper dir or workspace the range's before the VM starts
   * (userns.ts ensureTreeInRange): a fresh drive's root, or the whole tree of a drive used
   * without the user namespace; a tree of another range (the config changed) is left and logged.
   */
  private ownTree(vmId: string, what: string, root: string, r: UsernsRange): void {
    const t0 = Date.now();
    const rep = ensureTreeInRange(root, r);
    if (!rep) this.log.warn({ vm_id: vmId, tree: what, owner: statSync(root).uid }, `the ${what} is owned outside the user namespace range (another usernsRange?): left as it is`);
    else if (rep.changed > 1)
      this.log.info({ vm_id: vmId, tree: what, entries: rep.entries, changed: rep.changed, left: rep.left, ms: Date.now() - t0 }, `${what} shifted into the user namespace range`);
  }

  /** state runs `runc state` (with runc, default the current binary) and returns its status and pid ("absent" when unknown to runc). */
  async state(vmId: string, runc = this.currentBinary()): Promise<{ status: RuncStatus; pid: number }> {
    try {
      const { stdout } = await this.exec(runc, ['state', vmId]);
      const j = JSON.parse(stdout) as { status?: string; pid?: number };
      const status = (['created', 'running', 'paused', 'stopped'] as const).find((s) => s === j.status);
      if (!status) throw new InternalError(`runc state ${vmId}: unknown status ${String(j.status)}`);
      return { status, pid: j.pid ?? 0 };
    } catch (err) {
      if (err instanceof CommandError && /does not exist/i.test(err.stderr)) return { status: 'absent', pid: 0 };
      throw err;
    }
  }

  /**
   * bin is the runc that manages vm: its recorded versioned copy, or the current binary when
   * none is recorded (rows of an older release) or the copy is gone (logged).
   */
  private bin(vm: VmRef): string {
    if (!vm.binary) return this.currentBinary();
    if (existsSync(vm.binary)) return vm.binary;
    this.log.warn({ vm_id: vm.vmId, binary: vm.binary }, 'recorded runc binary is missing; using the current one');
    return this.currentBinary();
  }

  private async killAll(runc: string, vmId: string): Promise<void> {
    await this.exec(runc, ['kill', '--all', vmId, 'KILL']).catch((err: unknown) => this.log.debug({ vm_id: vmId, err }, 'SIGKILL failed'));
  }

  /**
   * waitStopped polls until the container is gone (true) or timeoutMs passed (false); signal
   * aborts the wait (AbortError). With the VM's init process known, it watches that process
   * (every INIT_POLL_MS, no process started: runc's status is its init's); else it asks runc
   * every STOP_POLL_MS.
   */
  private async waitStopped(runc: string, vmId: string, timeoutMs: number, signal?: AbortSignal, init?: { pid: number; startTimeTicks: number }): Promise<boolean> {
    const until = Date.now() + timeoutMs;
    if (init && init.pid > 0) {
      while (isAlive(init.pid, init.startTimeTicks)) {
        signal?.throwIfAborted();
        if (Date.now() >= until) return false;
        await new Promise((r) => setTimeout(r, INIT_POLL_MS));
      }
      // runc's status of a container is its init's: gone means stopped
      return true;
    }
    for (;;) {
      signal?.throwIfAborted();
      const st = await this.state(vmId, runc);
      if (st.status === 'stopped' || st.status === 'absent') return true;
      if (Date.now() >= until) return false;
      await new Promise((r) => setTimeout(r, STOP_POLL_MS));
    }
  }

  /** exec runs `<runc> --root <root> args...` (in a command helper: see command-runner.ts). */
  private exec(runc: string, args: string[]) {
    return runCommand(runc, ['--root', this.root, ...args]);
  }

  /**
   * runDetached runs `runc run -d --preserve-fds 1` in a new session with stdin from
   * /dev/null, stdout and stderr appended to consoleLog and poddFd as fd 3, and waits for runc
   * (not the container) to exit.
   */
  private runDetached(runc: string, vmId: string, bundle: string, pidFile: string, consoleLog: string, poddFd: number): Promise<void> {
    const fd = openSync(consoleLog, 'a', 0o600);
    return new Promise<void>((resolve, reject) => {
      const args = ['--root', this.root, 'run', '-d', '--preserve-fds', '1', '--bundle', bundle, '--pid-file', pidFile, vmId];
      hostCommands.inc({ command: commandLabel(runc, args) });
      const child = spawn(runc, args, {
        detached: true,
        stdio: ['ignore', fd, fd, poddFd],
      });
      closeSync(fd);
      const timer = setTimeout(() => child.kill('SIGKILL'), this.startTimeoutMs);
      child.once('error', (err) => {
        clearTimeout(timer);
        reject(new InternalError(`${runc}: ${err.message}`));
      });
      child.once('exit', (code, signal) => {
        clearTimeout(timer);
        if (code === 0) return resolve();
        reject(new InternalError(`runc run exited ${code ?? signal}: ${consoleTail(consoleLog, 5)}`));
      });
    });
  }
}

/**
 * Options of the host-side mounts of a sandbox's filesystems (its upper drive and workspace):
 * a setuid binary or a device node the sandbox made there gives nothing to host processes
 * that walk those mounts (issue 10 §2). The sandbox's own view is the overlay and its bind
 * mounts, which keep their own options.
 */
export const SANDBOX_FS_HOST_OPTIONS = ['noatime', 'nosuid', 'nodev'];

/**
 * writeMachineId writes `<upper>/etc/machine-id` (id + "\n", mode 0444; machine-id(5)) into the
 * overlay's upper dir before the overlay is mounted; creates `<upper>/etc` (0755) if missing.
 * The upper dir holds what the sandbox wrote (a fork child's or a drained sandbox's): `etc` or
 * `machine-id` may be a symlink it planted to any host path, so the walk never follows one
 * (beneath.ts). Returns false, having written nothing, when `etc` is a symlink or not a
 * directory (the sandbox replaced its own /etc; it keeps the machine id it had). With userns,
 * `etc` (when not already the range's) and `machine-id` are owned by the range's root.
 */
export function writeMachineId(upper: string, id: string, userns?: UsernsRange): boolean {
  const root = openRootDir(upper);
  let etc: number | undefined;
  try {
    etc = ensureDirNoFollow(root, 'etc', 0o755);
    const owner = userns ? { uid: userns.hostId, gid: userns.hostId } : undefined;
    // an /etc the host just made is host root's: the sandbox's root must own it to write there
    if (userns && !inRange(fstatSync(etc).uid, userns)) fchownSync(etc, userns.hostId, userns.hostId);
    replaceFileNoFollow(etc, 'machine-id', `${id}\n`, 0o444, owner);
    return true;
  } catch (err) {
    if (err instanceof UnsafePathError) return false;
    throw err;
  } finally {
    if (etc !== undefined) closeSync(etc);
    closeSync(root);
  }
}
