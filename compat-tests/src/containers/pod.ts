/**
 * The pod on testcontainers: each ContainerSpec of pod-layout.ts becomes a GenericContainer
 * (PodContainer adds what the builder has no method for: the shared PID namespace, bind
 * propagation, device cgroup rules), started with the manifest's startupProbe as its wait
 * strategy. Pod drives the containers of one pod instance (start, exec, logs, stop,
 * waitExited); removeContainers cleans up by label.
 *
 * testcontainers' reaper is never used (see engine.ts): every container is created with
 * autoCleanup off and the caller removes the run's containers by label (`removeContainers`).
 */
import { readFileSync } from 'node:fs';
import { GenericContainer, Wait, type StartedTestContainer, type WaitStrategy } from 'testcontainers';
import { runtime } from './engine';
import { containerName, containerSpec, LABEL, podContainer, privilegeFallback, PRIVILEGED, RUN_LABEL, type ContainerSpec, type PodHost, type PodLayout, type Privilege } from './pod-layout';

type EngineContainer = Parameters<WaitStrategy['waitUntilReady']>[0];

/** Result of an exec in a container. */
export interface ExecResult {
  status: number;
  stdout: string;
  stderr: string;
  ms: number;
}

/** demux splits the engine's multiplexed log frames (8-byte header: stream, 0, 0, 0, size BE32). */
function demux(buf: Buffer): string {
  let out = '';
  for (let i = 0; i + 8 <= buf.length;) {
    const size = buf.readUInt32BE(i + 4);
    out += buf.subarray(i + 8, i + 8 + size).toString();
    i += 8 + size;
  }
  return out;
}

/** tailOf returns the last lines of a container's output ("" when it is gone). */
async function tailOf(container: EngineContainer, lines: number): Promise<string> {
  try {
    return demux(await container.logs({ stdout: true, stderr: true, tail: lines, follow: false })).trim();
  } catch {
    return '';
  }
}

/**
 * StartupProbeWait is the manifest's startupProbe as a wait strategy: the probe's argv (no
 * shell) is exec'd in the container every periodMs until it exits 0. Fails at once, with the
 * container's last output, when the container exits; fails after the startup timeout with
 * the probe's last output. Without a probe, ready = running.
 */
class StartupProbeWait implements WaitStrategy {
  private timeoutMs: number;
  private timeoutSet = false;
  constructor(
    private readonly name: string,
    private readonly probe: ContainerSpec['startupProbe'],
  ) {
    this.timeoutMs = probe?.timeoutMs ?? 60_000;
  }
  withStartupTimeout(ms: number): this {
    this.timeoutMs = ms;
    this.timeoutSet = true;
    return this;
  }
  isStartupTimeoutSet(): boolean {
    return this.timeoutSet;
  }
  getStartupTimeout(): number {
    return this.timeoutMs;
  }
  async waitUntilReady(container: EngineContainer): Promise<void> {
    const client = await runtime();
    const deadline = Date.now() + this.timeoutMs;
    for (;;) {
      if (!(await container.inspect()).State.Running) throw new Error(`container ${this.name} exited while starting:\n${await tailOf(container, 15)}`);
      if (!this.probe) return;
      const r = await client.container.exec(container, this.probe.command);
      if (r.exitCode === 0) return;
      if (Date.now() > deadline) throw new Error(`container ${this.name}: startupProbe still failing after ${this.timeoutMs} ms: ${r.output.trim()}\n${await tailOf(container, 15)}`);
      await new Promise((res) => setTimeout(res, this.probe!.periodMs));
    }
  }
}

/** PodContainer is a GenericContainer made from a ContainerSpec. */
class PodContainer extends GenericContainer {
  constructor(spec: ContainerSpec) {
    super(spec.image);
    this.withName(spec.name)
      .withLabels(spec.labels)
      .withEnvironment(spec.env)
      .withEntrypoint(spec.entrypoint)
      .withCommand(spec.cmd)
      .withNetworkMode(spec.networkMode)
      .withAutoCleanup(false)
      .withWaitStrategy(new StartupProbeWait(spec.podContainer, spec.startupProbe));
    if (spec.startupProbe) this.withStartupTimeout(spec.startupProbe.timeoutMs);
    if (spec.hostname) this.withHostname(spec.hostname);
    const p = spec.privilege;
    if (p?.privileged) this.withPrivilegedMode();
    if (p?.capAdd.length) this.withAddedCapabilities(...p.capAdd);
    if (p?.capDrop.length) this.withDroppedCapabilities(...p.capDrop);
    if (p?.securityOpt.length) this.withSecurityOpt(...p.securityOpt);
    if (p?.unmaskedPaths) {
      this.hostConfig.MaskedPaths = [];
      this.hostConfig.ReadonlyPaths = [];
    }
    if (p?.deviceCgroupRules.length) this.hostConfig.DeviceCgroupRules = [...p.deviceCgroupRules];
    if (spec.noNewPrivileges) this.withSecurityOpt('no-new-privileges');
    if (spec.pidMode) this.hostConfig.PidMode = spec.pidMode;
    this.hostConfig.Mounts = spec.mounts.map((m) => ({ Type: 'bind' as const, Source: m.source, Target: m.target, ReadOnly: m.readOnly, BindOptions: { Propagation: m.propagation } }));
  }
}

/**
 * privilegeOf finds how this engine runs a privileged container: its privileged mode when a
 * privileged one-shot container of image runs, else privilegeFallback for the capabilities
 * this process has (an engine in a container without CAP_SYS_RESOURCE cannot apply them all).
 * The probe container carries the run's labels; removeContainers removes it.
 */
export async function privilegeOf(image: string, host: PodHost): Promise<Privilege> {
  try {
    const c = await new GenericContainer(image)
      .withName(`sandnode-compat-${host.runId}-privilege-probe`)
      .withLabels({ [LABEL]: '1', [RUN_LABEL]: host.runId })
      .withEntrypoint(['/usr/bin/true'])
      .withNetworkMode('none')
      .withPrivilegedMode()
      .withAutoCleanup(false)
      .withWaitStrategy(Wait.forOneShotStartup())
      .withStartupTimeout(60_000)
      .start();
    await c.stop({ remove: true });
    return PRIVILEGED;
  } catch (err) {
    const msg = (err as Error).message;
    const capBnd = BigInt(`0x${/CapBnd:\s*([0-9a-f]+)/.exec(readFileSync('/proc/self/status', 'utf8'))?.[1] ?? '0'}`);
    return privilegeFallback(capBnd, msg.match(/unable to apply caps[^\n]*/)?.[0] ?? msg.trim());
  }
}

/** Pod drives the containers of one pod instance, each started from the manifest's spec. */
export class Pod {
  /** container -> image it was last started with */
  readonly images: Record<string, string> = {};
  private readonly started = new Map<string, StartedTestContainer>();
  constructor(
    readonly layout: PodLayout,
    readonly host: PodHost,
    readonly privilege: Privilege = PRIVILEGED,
  ) {}

  /** spec is container c's spec with image. */
  spec(c: string, image: string): ContainerSpec {
    return containerSpec(this.layout, this.host, podContainer(this.layout, c), image, this.privilege);
  }

  private async engineContainer(c: string): Promise<EngineContainer> {
    return (await runtime()).container.getById(containerName(this.host, podContainer(this.layout, c).name));
  }

  /** running says whether container c runs (false when it does not exist). */
  async running(c: string): Promise<boolean> {
    try {
      return (await (await this.engineContainer(c)).inspect()).State.Running;
    } catch {
      return false;
    }
  }

  /** logs returns the last lines of container c's output, headed by its name. */
  async logs(c: string, lines = 15): Promise<string> {
    return `${c}:\n${await tailOf(await this.engineContainer(c), lines)}`;
  }

  /**
   * start (re)creates container c from image (like the kubelet restarting a container whose
   * image was patched: an exited container of that name is removed first) and waits until its
   * startupProbe passes. Returns the time to ready in ms. Throws with the container's output
   * when it exits or stays unready.
   */
  async start(c: string, image: string): Promise<number> {
    const t0 = Date.now();
    const spec = this.spec(c, image);
    await (await this.engineContainer(c)).remove({ force: true }).catch(() => undefined);
    this.started.delete(c);
    this.started.set(c, await new PodContainer(spec).start());
    this.images[c] = image;
    return Date.now() - t0;
  }

  /** exec runs argv in container c (its env: the manifest's); status -1 when timeoutMs passes. */
  async exec(c: string, argv: string[], timeoutMs = 180_000): Promise<ExecResult> {
    const t0 = Date.now();
    const s = this.started.get(c);
    if (!s) throw new Error(`exec in ${c}: not started by this pod`);
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<ExecResult>((res) => (timer = setTimeout(() => res({ status: -1, stdout: '', stderr: `exec timed out after ${timeoutMs} ms`, ms: timeoutMs }), timeoutMs)));
    try {
      return await Promise.race([s.exec(argv).then((r) => ({ status: r.exitCode, stdout: r.stdout, stderr: r.stderr, ms: Date.now() - t0 })), timeout]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** stop sends SIGTERM to container c's main process (30 s, then SIGKILL) and keeps it, exited. */
  async stop(c: string): Promise<void> {
    const s = this.started.get(c);
    if (!s) throw new Error(`stop ${c}: not started by this pod`);
    await s.stop({ timeout: 30_000, remove: false });
  }

  /** waitExited waits until container c's main process has exited; false on timeout. */
  async waitExited(c: string, timeoutMs: number): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      if (!(await this.running(c))) return true;
      await new Promise((res) => setTimeout(res, 250));
    }
    return false;
  }
}

/** removeContainers removes every container with the label (`k=v`; all runs: `sandnode-compat=1`) and returns their ids. */
export async function removeContainers(label: string): Promise<string[]> {
  const engine = (await runtime()).container.dockerode;
  const list = await engine.listContainers({ all: true, filters: { label: [label] } });
  await Promise.all(
    list.map((c) =>
      engine
        .getContainer(c.Id)
        .remove({ force: true, v: true })
        .catch(() => undefined),
    ),
  );
  return list.map((c) => c.Id);
}
