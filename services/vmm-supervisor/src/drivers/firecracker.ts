/**
 * The firecracker driver: one `firecracker --api-sock <runDir>/vms/<id>/fc.sock --id <id>`
 * process per VM, started detached (own session and process group, stdio to a log file) so it
 * survives the supervisor, and configured over its API socket. Host layout under
 * `<runDir>/vms/<id>/`:
 *
 *   fc.sock          the VMM's API socket (recorded as the VM's api_socket)
 *   vsock.sock       host end of the VM's vsock device (podd is reached through it)
 *   firecracker.pid  "<pid> <start ticks>" of the VMM, so destroy can kill it after the row
 *                    forgot the pid
 *   firecracker.log  stdout and stderr of the VMM
 *
 * The template rootfs is an ext4 image attached read-only as the root device; the
 * rootfs-upper and workspace drives are attached as `upper` and `workspace`.
 */
import { spawn } from 'node:child_process';
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { InternalError, processLiveness, processStartTicks, run, VMM_FEATURES } from '@sandnode/shared';
import type { Logger } from '@sandnode/shared';
import type { LiveStatus, StartedVm, VmDriver, VmRef } from '../core/driver';
import { HostStepError } from '../core/host-error';
import type { EffectiveResources, VmProcess, VmSpec } from '../core/types';
import { resolveExecutable } from './binary';
import type { VmNetworkInfo } from '../network/manager';
import { bootVm, CTRL_ALT_DEL, FirecrackerApi, vmStateRequest } from './firecracker-api';

/** Longest the VMM may take to create its API socket after spawn, in ms. */
export const DEFAULT_FC_SOCKET_WAIT_MS = 5_000;
/** Longest a VMM may take to be gone after SIGKILL, in ms. */
export const DEFAULT_FC_KILL_WAIT_MS = 5_000;
/** Poll interval while waiting for the API socket or for the VMM to exit, in ms. */
export const FC_POLL_MS = 20;

/** FirecrackerDriverOptions configure the driver. */
export interface FirecrackerDriverOptions {
  /** firecracker binary name or path. */
  firecrackerBinary: string;
  /** Guest kernel image (absolute path). */
  kernelImage: string;
  /** Guest kernel command line. */
  kernelArgs: string;
  /** The supervisor's runtime dir; VMs live in `<runDir>/vms/<id>`. */
  runDir: string;
  log: Logger;
  /** Environment of the VMM processes; default the supervisor's. */
  env?: NodeJS.ProcessEnv;
  /** Longest a VMM may take to be gone after SIGKILL, in ms (default {@link DEFAULT_FC_KILL_WAIT_MS}). */
  killWaitMs?: number;
}

/** The tap of a networked firecracker VM, in its slot's netns (bridged there to the veth's eth0). */
export const FC_TAP = 'tap0';

/** vmmCommand is the command line that starts the VMM, inside netnsPath when given. Pure. */
export function vmmCommand(binary: string, args: string[], netnsPath?: string): [string, string[]] {
  return netnsPath ? ['nsenter', [`--net=${netnsPath}`, '--', binary, ...args]] : [binary, args];
}

/**
 * alive says whether proc may be running: not gone, not a reused pid, not a zombie. A /proc
 * read that failed for another reason (EMFILE when the supervisor is out of descriptors) counts
 * as alive (processLiveness `unknown`): a VM is never reported stopped on a failed read. Exported
 * for tests.
 */
export function alive(proc: VmProcess): boolean {
  return proc.pid > 0 && processLiveness(proc.pid, proc.startTimeTicks) !== 'gone';
}

/** FirecrackerDriver implements VmDriver with one firecracker process per VM. */
export class FirecrackerDriver implements VmDriver {
  readonly name = 'firecracker';
  readonly features = [VMM_FEATURES.firecracker] as const;
  private readonly vmsDir: string;
  private cachedVersion: string | undefined;
  private current: string | undefined;

  constructor(private readonly opts: FirecrackerDriverOptions) {
    this.vmsDir = path.join(path.resolve(opts.runDir), 'vms');
    mkdirSync(this.vmsDir, { recursive: true, mode: 0o700 });
  }

  /** vmDir is the host dir of one VM. */
  vmDir(vmId: string): string {
    return path.join(this.vmsDir, vmId);
  }

  /** apiSocketPath is the API socket of vmId's VMM. */
  apiSocketPath(vmId: string): string {
    return path.join(this.vmDir(vmId), 'fc.sock');
  }

  /** configuredBinary resolves `firecrackerBinary` (ConfigError naming the key when missing). */
  configuredBinary(): string {
    return resolveExecutable(this.opts.firecrackerBinary, 'firecrackerBinary');
  }

  /** useBinary makes path the firecracker new VMs start with. */
  useBinary(binary: string): void {
    this.current = binary;
  }

  /** currentBinary is the firecracker new VMs start with. */
  currentBinary(): string {
    return this.current ?? this.configuredBinary();
  }

  /** version parses `firecracker --version` ("Firecracker v1.7.0" -> "1.7.0"). */
  async version(): Promise<string> {
    if (this.cachedVersion === undefined) {
      const { stdout } = await run(this.configuredBinary(), ['--version']);
      const m = /v?(\d+\.\d+\.\d+\S*)/.exec(stdout);
      this.cachedVersion = m?.[1] ?? stdout.split('\n')[0]?.trim() ?? 'unknown';
    }
    return this.cachedVersion;
  }

  async create(vmId: string, spec: VmSpec, resources: EffectiveResources, net?: VmNetworkInfo): Promise<StartedVm> {
    const binary = this.currentBinary();
    const dir = this.vmDir(vmId);
    const apiSocket = this.apiSocketPath(vmId);
    const upper = spec.drives.find((d) => d.role === 'rootfs-upper')!;
    const ws = spec.drives.find((d) => d.role === 'workspace');
    let step = 'prepare dir';
    try {
      if (existsSync(dir)) await this.destroy({ vmId, binary, process: { pid: 0, startTimeTicks: 0 }, apiSocket }); // leftovers
      mkdirSync(dir, { recursive: true, mode: 0o700 });

      step = `spawn ${binary}`;
      const proc = await this.spawnVmm(binary, vmId, apiSocket, path.join(dir, 'firecracker.log'), net?.netnsPath);
      writeFileSync(path.join(dir, 'firecracker.pid'), `${proc.pid} ${proc.startTimeTicks}\n`, { mode: 0o600 });

      step = 'wait for the API socket';
      await this.waitForSocket(apiSocket, proc);

      step = 'configure and start over the API';
      await bootVm(new FirecrackerApi(apiSocket), {
        kernelImage: this.opts.kernelImage,
        kernelArgs: this.opts.kernelArgs,
        rootfsImage: spec.templateRootfs,
        upperDrive: upper.path,
        workspaceDrive: ws ? { path: ws.path, readOnly: ws.readOnly } : undefined,
        vcpus: resources.vcpus,
        memoryMib: resources.memoryMib,
        vsockPath: path.join(dir, 'vsock.sock'),
        network: net ? { tap: FC_TAP, address: net.address, gateway: net.gateway, prefixLen: net.prefixLen } : undefined,
      });
      return { process: proc, apiSocket };
    } catch (err) {
      const why = err instanceof Error ? err.message : String(err);
      this.opts.log.error({ vm_id: vmId, step, err }, 'create failed; undoing');
      let undo = '';
      try {
        await this.destroy({ vmId, binary, process: { pid: 0, startTimeTicks: 0 }, apiSocket });
      } catch (undoErr) {
        undo = `; undo failed too: ${(undoErr as Error).message}`;
        this.opts.log.error({ vm_id: vmId, err: undoErr }, 'undo of a failed create failed');
      }
      throw new HostStepError(`create vm ${vmId}: ${step}`, `${why}${undo}`);
    }
  }

  async inspect(vm: VmRef): Promise<LiveStatus> {
    if (!alive(vm.process)) return { state: 'stopped', detail: `firecracker pid ${vm.process.pid} with start ticks ${vm.process.startTimeTicks} is gone` };
    const state = await this.api(vm).state();
    if (state === 'Running') return { state: 'running', process: vm.process };
    if (state === 'Paused') return { state: 'paused', process: vm.process };
    return { state: 'stopped', detail: `firecracker reports state ${JSON.stringify(state)}` };
  }

  async pause(vm: VmRef): Promise<void> {
    await this.api(vm).call(vmStateRequest('Paused'));
  }

  async resume(vm: VmRef): Promise<void> {
    await this.api(vm).call(vmStateRequest('Resumed'));
  }

  async stop(vm: VmRef, timeoutMs: number, signal?: AbortSignal): Promise<void> {
    const proc = this.processOf(vm);
    if (!proc || !alive(proc)) return;
    let paused = false;
    try {
      paused = (await this.api(vm).state()) === 'Paused';
    } catch (err) {
      this.opts.log.debug({ vm_id: vm.vmId, err }, 'state query before stop failed');
    }
    // A paused guest cannot react to Ctrl-Alt-Del: kill it at once, as runc kills a frozen container.
    if (!paused && timeoutMs > 0) {
      let sent = false;
      try {
        await this.api(vm).call(CTRL_ALT_DEL);
        sent = true;
      } catch (err) {
        this.opts.log.debug({ vm_id: vm.vmId, err }, 'SendCtrlAltDel failed; sending SIGKILL');
      }
      if (sent) {
        if (await this.waitGone(proc, timeoutMs, signal)) return;
        this.opts.log.info({ vm_id: vm.vmId, timeout_ms: timeoutMs }, 'vm ignored Ctrl-Alt-Del; sending SIGKILL');
      }
    }
    this.kill(proc);
    const killWaitMs = this.opts.killWaitMs ?? DEFAULT_FC_KILL_WAIT_MS;
    if (!(await this.waitGone(proc, killWaitMs))) {
      throw new InternalError(`stop vm ${vm.vmId}: firecracker pid ${proc.pid} still alive ${killWaitMs} ms after SIGKILL`);
    }
  }

  async destroy(vm: VmRef): Promise<void> {
    await this.stop(vm, 0);
    rmSync(this.vmDir(vm.vmId), { recursive: true, force: true });
  }

  /** api talks to vm's VMM on its own socket, `<vmDir>/fc.sock`: never on a path a VM-table row names (a row could name any socket on the host). */
  private api(vm: VmRef): FirecrackerApi {
    return new FirecrackerApi(this.apiSocketPath(vm.vmId));
  }

  /** processOf is the VMM of vm: the recorded one, else the one in firecracker.pid (a half-done or forgotten VM). */
  private processOf(vm: VmRef): VmProcess | undefined {
    if (vm.process.pid > 0) return vm.process;
    try {
      const [pid, ticks] = readFileSync(path.join(this.vmDir(vm.vmId), 'firecracker.pid'), 'utf8')
        .trim()
        .split(' ')
        .map(Number);
      if (pid && ticks !== undefined && Number.isFinite(ticks)) return { pid, startTimeTicks: ticks };
    } catch {
      /* no pid file */
    }
    return undefined;
  }

  private kill(proc: VmProcess): void {
    // only a process /proc shows to be this VM's is killed (never a pid /proc could not say of)
    if (proc.pid <= 0 || processLiveness(proc.pid, proc.startTimeTicks) !== 'alive') return;
    try {
      process.kill(proc.pid, 'SIGKILL');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ESRCH') throw err;
    }
  }

  /** waitGone polls until proc is gone (true) or timeoutMs passed (false); signal aborts the wait (AbortError). */
  private async waitGone(proc: VmProcess, timeoutMs: number, signal?: AbortSignal): Promise<boolean> {
    const until = Date.now() + timeoutMs;
    while (alive(proc)) {
      signal?.throwIfAborted();
      if (Date.now() >= until) return false;
      await new Promise((r) => setTimeout(r, FC_POLL_MS));
    }
    return true;
  }

  /**
   * spawnVmm starts the VMM in its own session and process group with stdio to logFile; with
   * netnsPath, inside that network namespace (`nsenter --net=<path>` execs the VMM: same pid).
   */
  private spawnVmm(binary: string, vmId: string, apiSocket: string, logFile: string, netnsPath?: string): Promise<VmProcess> {
    rmSync(apiSocket, { force: true }); // firecracker refuses an existing socket path
    const fd = openSync(logFile, 'a', 0o600);
    const [cmd, args] = vmmCommand(binary, ['--api-sock', apiSocket, '--id', vmId], netnsPath);
    return new Promise<VmProcess>((resolve, reject) => {
      const child = spawn(cmd, args, {
        detached: true,
        stdio: ['ignore', fd, fd],
        env: this.opts.env ?? process.env,
      });
      closeSync(fd);
      child.once('error', (err) => reject(new InternalError(`${binary}: ${err.message}`)));
      child.once('spawn', () => {
        child.unref();
        const pid = child.pid!;
        const startTimeTicks = processStartTicks(pid);
        if (startTimeTicks === undefined) reject(new InternalError(`firecracker pid ${pid} exited at once (see ${logFile})`));
        else resolve({ pid, startTimeTicks });
      });
    });
  }

  private async waitForSocket(apiSocket: string, proc: VmProcess): Promise<void> {
    const until = Date.now() + DEFAULT_FC_SOCKET_WAIT_MS;
    while (!existsSync(apiSocket)) {
      if (!alive(proc)) throw new InternalError(`firecracker pid ${proc.pid} exited before creating ${apiSocket}`);
      if (Date.now() >= until) throw new InternalError(`${apiSocket} did not appear in ${DEFAULT_FC_SOCKET_WAIT_MS} ms`);
      await new Promise((r) => setTimeout(r, FC_POLL_MS));
    }
  }
}
