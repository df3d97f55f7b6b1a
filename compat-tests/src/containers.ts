/**
 * Container mode of the compat tests: the upgrade run of process mode with each component in
 * its own Docker container, laid out like the Kubernetes pod. The layout is not restated here:
 * containers, commands, env, volumes, mount paths and propagation, privileges, the shared
 * process namespace, probes and config files are read from `deploy/k8s/base/daemonset.yaml`
 * and `configmap.yaml` and translated into `docker run` flags, so the manifest is what runs.
 *
 * Translation (Kubernetes -> docker run):
 *   shareProcessNamespace    `--pid container:<first>` (and `--network container:<first>`: a
 *                            pod has one network namespace too); the first container owns both
 *   privileged               `--privileged`; allowPrivilegeEscalation false -> no-new-privileges
 *   command + args           `--entrypoint command[0]` + the rest after the image
 *   env                      `-e NAME=value`
 *   configMap volume         a host dir holding the ConfigMap's files, bind-mounted (readOnly)
 *   emptyDir volume          a host dir of this run; made a shared mount so that
 *   mountPropagation         Bidirectional -> `bind-propagation=rshared`,
 *                            HostToContainer -> `rslave`, none -> `rprivate`
 *   hostPath /dev            the host's /dev (loop devices must appear after start)
 *   other hostPath           remapped to a dir of this run (never the host's real state dir)
 *   startupProbe exec        run with `docker exec` until it succeeds (period shortened)
 *   image                    the build the step asks for: `sandnode-compat:<label>-<commit12>`
 *
 * Images are `docker import`ed from a tar assembled on the fly: /app = the build (services/*
 * /dist and package.json, shared/dist + descriptor, node_modules, deploy), plus node, runc,
 * busybox (sh and applets), util-linux, e2fsprogs, coreutils tools and every library `ldd`
 * lists. An image is reused while its fingerprint (commit + file sizes/mtimes + tools) matches.
 */
import { spawn, spawnSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { chmodSync, copyFileSync, existsSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, realpathSync, renameSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import YAML from 'yaml';
import { createSandnodeChannel, createServiceClient } from '@sandnode/shared';
import { DeviceServiceDefinition, HandoverResult } from '@sandnode/shared/proto/ublk/v1/ublk';
import { connectApi, versionAt, type ServerApi } from './node';
import { nodeFor, REPO_ROOT } from './releases';
import { execCollect, getSandbox, grpcStatusOf, stateName } from './scenarios';
import type { Build, ReportSection, RunContext, UpgradeRun, UpgradeStep } from './types';

// ------------------------------------------------------------------ small process helpers

/** Output of a command run by sh(). */
export interface ShResult {
  status: number;
  stdout: string;
  stderr: string;
  ms: number;
}

/** sh runs a command without blocking the event loop (exec streams keep flowing). Never throws. */
export function sh(cmd: string, args: string[], opts: { input?: string; timeoutMs?: number; env?: NodeJS.ProcessEnv } = {}): Promise<ShResult> {
  const t0 = Date.now();
  return new Promise((resolve) => {
    let child;
    try {
      child = spawn(cmd, args, { stdio: ['pipe', 'pipe', 'pipe'], env: opts.env ?? process.env });
    } catch (err) {
      resolve({ status: 127, stdout: '', stderr: (err as Error).message, ms: 0 });
      return;
    }
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('error', (err) => (stderr += err.message));
    child.stdin.on('error', () => undefined); // the command may exit before reading its input (EPIPE)
    child.stdin.end(opts.input ?? '');
    const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 300_000);
    child.on('close', (code, sig) => {
      clearTimeout(timer);
      resolve({ status: code ?? (sig ? 128 : 127), stdout, stderr: sig ? `${stderr}\n(killed by ${sig})` : stderr, ms: Date.now() - t0 });
    });
  });
}

async function docker(args: string[], timeoutMs = 120_000): Promise<ShResult> {
  return sh('docker', args, { timeoutMs });
}

async function dockerOk(args: string[], timeoutMs = 120_000): Promise<string> {
  const r = await docker(args, timeoutMs);
  if (r.status !== 0) throw new Error(`docker ${args.slice(0, 3).join(' ')} ... failed (exit ${r.status}): ${(r.stderr || r.stdout).trim().slice(-1500)}`);
  return r.stdout;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

// ------------------------------------------------------------------ engine

/**
 * dockerMissing says what keeps container mode from running (undefined when an engine answers).
 * When the CLI exists but no engine answers, it tries `deploy/docker-engine.sh` once.
 */
export async function dockerMissing(log: (l: string) => void = () => undefined): Promise<string | undefined> {
  const v = await sh('docker', ['version', '--format', '{{.Client.Version}}'], { timeoutMs: 10_000 });
  if (v.status === 127 || /ENOENT/.test(v.stderr)) return 'no `docker` binary on PATH';
  if ((await sh('docker', ['info', '--format', '{{.ServerVersion}}'], { timeoutMs: 15_000 })).status === 0) return undefined;
  const script = path.join(REPO_ROOT, 'deploy', 'docker-engine.sh');
  if (existsSync(script)) {
    const r = await sh('bash', [script], { timeoutMs: 45_000 });
    log(r.stdout.trim());
    if ((await sh('docker', ['info', '--format', '{{.ServerVersion}}'], { timeoutMs: 15_000 })).status === 0) return undefined;
    return `Docker daemon not reachable and could not be started (${(r.stdout + r.stderr).trim().split('\n').slice(-2).join(' ')})`;
  }
  return 'Docker daemon not reachable (docker info fails) and deploy/docker-engine.sh is missing';
}

// ------------------------------------------------------------------ the pod layout

/** The parts of a Kubernetes container spec the translation uses. */
export interface K8sContainer {
  name: string;
  image: string;
  command?: string[];
  args?: string[];
  env?: { name: string; value?: string }[];
  securityContext?: { privileged?: boolean; allowPrivilegeEscalation?: boolean };
  volumeMounts?: { name: string; mountPath: string; readOnly?: boolean; mountPropagation?: string; subPath?: string }[];
  startupProbe?: { exec?: { command: string[] }; periodSeconds?: number; failureThreshold?: number };
  readinessProbe?: { exec?: { command: string[] } };
}

/** The parts of a Kubernetes volume the translation uses. */
export interface K8sVolume {
  name: string;
  configMap?: { name: string };
  hostPath?: { path: string; type?: string };
  emptyDir?: Record<string, unknown>;
}

/** PodLayout is the DaemonSet's pod template plus the ConfigMap's files. */
export interface PodLayout {
  containers: K8sContainer[];
  volumes: K8sVolume[];
  shareProcessNamespace: boolean;
  configMapName: string;
  configFiles: Record<string, string>;
}

/** loadPodLayout reads the pod template and the ConfigMap from deploy/k8s/base. */
export function loadPodLayout(baseDir = path.join(REPO_ROOT, 'deploy', 'k8s', 'base')): PodLayout {
  const ds = YAML.parse(readFileSync(path.join(baseDir, 'daemonset.yaml'), 'utf8')) as {
    kind: string;
    spec: { template: { spec: { containers: K8sContainer[]; volumes?: K8sVolume[]; shareProcessNamespace?: boolean } } };
  };
  const cm = YAML.parse(readFileSync(path.join(baseDir, 'configmap.yaml'), 'utf8')) as { kind: string; metadata: { name: string }; data: Record<string, string> };
  if (ds.kind !== 'DaemonSet') throw new Error(`daemonset.yaml: kind ${ds.kind}`);
  if (cm.kind !== 'ConfigMap') throw new Error(`configmap.yaml: kind ${cm.kind}`);
  const pod = ds.spec.template.spec;
  return { containers: pod.containers, volumes: pod.volumes ?? [], shareProcessNamespace: pod.shareProcessNamespace === true, configMapName: cm.metadata.name, configFiles: cm.data };
}

/** Host side of one pod instance: where each volume lives on the host. */
export interface PodHost {
  /** run id: part of every container name and label */
  runId: string;
  root: string;
  configDir: string;
  /** volume name -> host dir */
  volumeDirs: Record<string, string>;
  /** hostPath volumes that were remapped (path in the manifest -> host dir used) */
  remapped: Record<string, string>;
}

const PROPAGATION: Record<string, string> = { Bidirectional: 'rshared', HostToContainer: 'rslave', None: 'rprivate' };

/** containerName is the docker name of pod container c in this run. */
export function containerName(host: PodHost, c: string): string {
  return `sandnode-compat-${host.runId}-${c}`;
}

/**
 * dockerRunArgs translates one container of the pod into `docker run` arguments (see the
 * file comment for the mapping). image replaces the manifest's placeholder image.
 */
export function dockerRunArgs(layout: PodLayout, host: PodHost, c: K8sContainer, image: string, privileged: string[] = ['--privileged']): string[] {
  const owner = layout.containers[0]!.name;
  const args = ['run', '-d', '--name', containerName(host, c.name)];
  // the pod's hostname is set once, on the container that owns the network namespace
  if (c.name === owner) args.push('--hostname', `sandnode-compat-${host.runId}`);
  args.push('--label', 'sandnode-compat=1', '--label', `sandnode-compat.run=${host.runId}`, '--label', `sandnode-compat.container=${c.name}`);
  if (c.securityContext?.privileged) args.push(...privileged);
  if (c.securityContext?.allowPrivilegeEscalation === false) args.push('--security-opt', 'no-new-privileges');
  if (layout.shareProcessNamespace && c.name !== owner) args.push('--pid', `container:${containerName(host, owner)}`);
  // one network namespace per pod, like the pause container's
  args.push('--network', c.name === owner ? 'none' : `container:${containerName(host, owner)}`);
  for (const e of c.env ?? []) args.push('-e', `${e.name}=${e.value ?? ''}`);
  for (const m of c.volumeMounts ?? []) {
    const src = host.volumeDirs[m.name];
    if (!src) throw new Error(`container ${c.name}: mount of unknown volume ${m.name}`);
    if (m.subPath) throw new Error(`container ${c.name}: subPath mounts are not translated`);
    const prop = PROPAGATION[m.mountPropagation ?? 'None'] ?? 'rprivate';
    args.push('--mount', `type=bind,src=${src},dst=${m.mountPath},bind-propagation=${prop}${m.readOnly ? ',readonly' : ''}`);
  }
  let argv = [...(c.command ?? []), ...(c.args ?? [])];
  // Without CAP_SYS_RESOURCE (see privilegedFlags) oom_score_adj cannot be lowered: the only
  // change made to a manifest command, reported in the section's rows.
  if (!privileged.includes('--privileged') && privileged.includes('SYS_RESOURCE')) {
    argv = argv.map((a) => a.replace('echo -1000 > /proc/self/oom_score_adj && ', "{ echo -1000 > /proc/self/oom_score_adj || echo 'compat: oom_score_adj not set (no CAP_SYS_RESOURCE)' >&2; } && "));
  }
  if (!argv.length) throw new Error(`container ${c.name}: no command (a scratch image has no default)`);
  args.push('--entrypoint', argv[0]!, image, ...argv.slice(1));
  return args;
}

/**
 * privilegedFlags finds how this engine runs a privileged container: `--privileged`, or, where
 * the engine itself runs without a capability (`--privileged` fails with "unable to apply
 * caps"), the nearest equivalent: every capability the host has, no seccomp/AppArmor, unmasked
 * /proc, every device allowed, the host's cgroup tree writable. Returns the flags and a note.
 */
export async function privilegedFlags(image: string): Promise<{ flags: string[]; note: string }> {
  const r = await docker(['run', '--rm', '--privileged', '--entrypoint', '/usr/bin/true', image], 60_000);
  if (r.status === 0) return { flags: ['--privileged'], note: '--privileged' };
  const have = BigInt(`0x${/CapBnd:\s*([0-9a-f]+)/.exec(readFileSync('/proc/self/status', 'utf8'))?.[1] ?? '0'}`);
  const names = ['CHOWN', 'DAC_OVERRIDE', 'DAC_READ_SEARCH', 'FOWNER', 'FSETID', 'KILL', 'SETGID', 'SETUID', 'SETPCAP', 'LINUX_IMMUTABLE', 'NET_BIND_SERVICE', 'NET_BROADCAST', 'NET_ADMIN', 'NET_RAW', 'IPC_LOCK', 'IPC_OWNER', 'SYS_MODULE', 'SYS_RAWIO', 'SYS_CHROOT', 'SYS_PTRACE', 'SYS_PACCT', 'SYS_ADMIN', 'SYS_BOOT', 'SYS_NICE', 'SYS_RESOURCE', 'SYS_TIME', 'SYS_TTY_CONFIG', 'MKNOD', 'LEASE', 'AUDIT_WRITE', 'AUDIT_CONTROL', 'SETFCAP', 'MAC_OVERRIDE', 'MAC_ADMIN', 'SYSLOG', 'WAKE_ALARM', 'BLOCK_SUSPEND', 'AUDIT_READ'];
  const lacking = names.filter((_, i) => (have & (1n << BigInt(i))) === 0n);
  const flags = ['--cap-add', 'ALL', ...lacking.flatMap((n) => ['--cap-drop', n]), '--security-opt', 'seccomp=unconfined', '--security-opt', 'apparmor=unconfined', '--security-opt', 'systempaths=unconfined', '--device-cgroup-rule', 'a *:* rwm', '--mount', 'type=bind,src=/sys/fs/cgroup,dst=/sys/fs/cgroup'];
  return { flags, note: `--privileged fails here (${(r.stderr.match(/unable to apply caps[^\n]*/)?.[0] ?? r.stderr.trim()).slice(0, 120)}; the engine lacks CAP_${lacking.join(', CAP_')}): privileged containers run with ${flags.join(' ')}${lacking.includes('SYS_RESOURCE') ? '; without CAP_SYS_RESOURCE the vmm command\'s `echo -1000 > /proc/self/oom_score_adj` fails, so a failure of that echo is tolerated (logged)' : ''}` };
}

/** preparePodHost makes the host dirs of the pod's volumes (the emptyDir as a shared mount). */
export async function preparePodHost(layout: PodLayout, workDir: string): Promise<PodHost> {
  const runId = randomBytes(3).toString('hex');
  const root = mkdtempSync(path.join(workDir, `pod-${runId}-`));
  const host: PodHost = { runId, root, configDir: path.join(root, 'config'), volumeDirs: {}, remapped: {} };
  mkdirSync(host.configDir);
  for (const [f, text] of Object.entries(layout.configFiles)) writeFileSync(path.join(host.configDir, f), text);
  for (const v of layout.volumes) {
    if (v.configMap) {
      if (v.configMap.name !== layout.configMapName) throw new Error(`volume ${v.name}: ConfigMap ${v.configMap.name} is not in configmap.yaml`);
      host.volumeDirs[v.name] = host.configDir;
    } else if (v.hostPath) {
      if (v.hostPath.path === '/dev') host.volumeDirs[v.name] = '/dev';
      else {
        const d = path.join(root, 'hostpath', v.name);
        mkdirSync(d, { recursive: true });
        host.volumeDirs[v.name] = d;
        host.remapped[v.hostPath.path] = d;
      }
    } else if (v.emptyDir) {
      const d = path.join(root, 'emptydir', v.name);
      mkdirSync(d, { recursive: true });
      // rshared/rslave binds need a shared source mount: make the dir its own shared mount
      let r = await sh('mount', ['--bind', d, d]);
      if (r.status === 0) r = await sh('mount', ['--make-shared', d]);
      if (r.status !== 0) throw new Error(`cannot make ${d} a shared mount: ${r.stderr.trim()}`);
      host.volumeDirs[v.name] = d;
    } else {
      throw new Error(`volume ${v.name}: only configMap, hostPath and emptyDir are translated`);
    }
  }
  return host;
}

/** The host dir mounted at mountPath in container c (e.g. the run dir at /run/sandnode). */
export function hostDirOf(layout: PodLayout, host: PodHost, c: string, mountPath: string): string {
  const m = layout.containers.find((x) => x.name === c)?.volumeMounts?.find((x) => x.mountPath === mountPath);
  if (!m) throw new Error(`container ${c} mounts nothing at ${mountPath}`);
  return host.volumeDirs[m.name]!;
}

// ------------------------------------------------------------------ images

/** Host tools copied into every image (besides node): real binaries; busybox supplies the rest. */
const TOOLS = ['runc', 'busybox', 'mkfs.ext4', 'mke2fs', 'losetup', 'mount', 'umount', 'cp', 'sync', 'blockdev', 'fsfreeze', 'timeout', 'flock', 'bash', 'date', 'stat', 'mktemp', 'tail'];

function which(t: string): string | undefined {
  const r = spawnSync('sh', ['-c', `command -v ${t}`], { encoding: 'utf8' });
  const p = r.stdout.trim();
  return r.status === 0 && p.startsWith('/') ? p : undefined;
}

/** inImage maps a host library path to its place in the image (merged /usr: /lib -> usr/lib). */
function inImage(p: string): string {
  if (p.startsWith('/lib/')) return `usr${p}`;
  if (p.startsWith('/lib64/')) return `usr${p}`;
  return p.replace(/^\//, '');
}

/**
 * stageTools copies node, the TOOLS and their ldd libraries into dir (an image root with
 * merged /usr), and links every busybox applet that has no real binary. Returns a fingerprint.
 */
export function stageTools(dir: string): string {
  const fp = createHash('sha256');
  mkdirSync(path.join(dir, 'usr', 'bin'), { recursive: true });
  mkdirSync(path.join(dir, 'usr', 'lib'), { recursive: true });
  mkdirSync(path.join(dir, 'usr', 'lib64'), { recursive: true });
  for (const [l, t] of [['bin', 'usr/bin'], ['sbin', 'usr/bin'], ['lib', 'usr/lib'], ['lib64', 'usr/lib64']] as const) symlinkSync(t, path.join(dir, l));
  symlinkSync('bin', path.join(dir, 'usr', 'sbin'));
  mkdirSync(path.join(dir, 'usr', 'local', 'bin'), { recursive: true });
  for (const d of ['tmp', 'etc', 'run', 'var/lib', 'proc', 'sys', 'dev']) mkdirSync(path.join(dir, d), { recursive: true });
  chmodSync(path.join(dir, 'tmp'), 0o1777);
  writeFileSync(path.join(dir, 'etc', 'passwd'), 'root:x:0:0:root:/root:/bin/sh\n');
  writeFileSync(path.join(dir, 'etc', 'group'), 'root:x:0:\n');
  if (existsSync('/etc/mke2fs.conf')) copyFileSync('/etc/mke2fs.conf', path.join(dir, 'etc', 'mke2fs.conf'));
  const bins: [string, string][] = [['node', process.execPath]];
  for (const t of TOOLS) {
    const p = which(t);
    if (p) bins.push([t, p]);
  }
  const libs = new Set<string>();
  for (const [name, p] of bins) {
    const real = realpathSync(p);
    copyFileSync(real, path.join(dir, 'usr', 'bin', name));
    chmodSync(path.join(dir, 'usr', 'bin', name), 0o755);
    const st = statSync(real);
    fp.update(`${name} ${real} ${st.size} ${st.mtimeMs}\n`);
    const ldd = spawnSync('ldd', [real], { encoding: 'utf8' });
    for (const line of ldd.stdout.split('\n')) {
      const m = /=>\s+(\/\S+)/.exec(line) ?? /^\s*(\/\S+)\s+\(/.exec(line);
      if (m) libs.add(m[1]!);
    }
  }
  for (const lib of libs) {
    const dst = path.join(dir, inImage(lib));
    mkdirSync(path.dirname(dst), { recursive: true });
    if (!existsSync(dst)) copyFileSync(realpathSync(lib), dst);
    fp.update(`${lib}\n`);
  }
  const applets = spawnSync(path.join(dir, 'usr', 'bin', 'busybox'), ['--list'], { encoding: 'utf8' }).stdout.split('\n').filter(Boolean);
  for (const a of applets) if (!existsSync(path.join(dir, 'usr', 'bin', a))) symlinkSync('busybox', path.join(dir, 'usr', 'bin', a));
  return fp.digest('hex');
}

/** The parts of a build an image holds (relative to the build dir). */
function buildPaths(dir: string): string[] {
  const out = ['package.json', 'node_modules', 'shared/package.json', 'shared/dist', 'shared/descriptor', 'deploy'];
  for (const s of readdirSync(path.join(dir, 'services'))) out.push(`services/${s}/package.json`, `services/${s}/dist`);
  return out.filter((p) => existsSync(path.join(dir, p)));
}

/** buildFingerprint hashes what goes into an image (sizes and mtimes; node_modules by its lock). */
function buildFingerprint(b: Build, toolsFp: string): string {
  const h = createHash('sha256').update(`recipe 3\n${b.commit}\n${toolsFp}\n${realpathSync(nodeFor(b))}\n`);
  const walk = (p: string) => {
    const st = lstatSync(p);
    h.update(`${path.relative(b.dir, p)} ${st.size} ${st.mtimeMs}\n`);
    if (st.isDirectory()) for (const e of readdirSync(p).sort()) walk(path.join(p, e));
  };
  for (const rel of buildPaths(b.dir)) {
    const p = path.join(b.dir, rel);
    if (rel === 'node_modules') {
      for (const f of ['.package-lock.json']) if (existsSync(path.join(p, f))) h.update(`${f} ${statSync(path.join(p, f)).mtimeMs}\n`);
    } else walk(p);
  }
  return h.digest('hex').slice(0, 16);
}

/** imageName is `sandnode-compat:<label>-<commit12>`. */
export function imageName(b: Build): string {
  return `sandnode-compat:${b.label.replace(/[^A-Za-z0-9_.-]/g, '-')}-${b.commit.slice(0, 12)}`;
}

/**
 * ensureImage makes the image of build b (reused when its fingerprint matches): a tar of the
 * tools dir (at /) and the build (at /app), streamed into `docker import`.
 */
export async function ensureImage(b: Build, toolsDir: string, toolsFp: string): Promise<{ image: string; built: boolean; ms: number }> {
  const t0 = Date.now();
  const image = imageName(b);
  const fp = buildFingerprint(b, toolsFp);
  const have = await docker(['image', 'inspect', '--format', '{{json .Config.Env}}', image]);
  if (have.status === 0 && have.stdout.includes(`SANDNODE_IMAGE_FP=${fp}`)) return { image, built: false, ms: Date.now() - t0 };
  const buildRel = path.relative('/', path.resolve(b.dir));
  const toolsRel = path.relative('/', path.resolve(toolsDir));
  const nodeRel = path.relative('/', realpathSync(nodeFor(b))); // the build's own Node, at /usr/local/bin/node (first on PATH)
  const members = [nodeRel, ...readdirSync(toolsDir).map((e) => `${toolsRel}/${e}`), ...buildPaths(b.dir).map((p) => `${buildRel}/${p}`)];
  const esc = (s: string) => s.replace(/[.[\]*^$\\]/g, '\\$&');
  const tarArgs = ['-C', '/', '-cf', '-', '--numeric-owner', '--transform', `flags=rh;s|^${esc(nodeRel)}$|usr/local/bin/node|`, '--transform', `flags=rh;s|^${esc(toolsRel)}/||`, '--transform', `flags=rh;s|^${esc(buildRel)}/|app/|`, ...members];
  const changes = ['ENV PATH=/usr/local/bin:/usr/bin:/bin', `ENV SANDNODE_BUILD_COMMIT=${b.commit}`, `ENV SANDNODE_IMAGE_FP=${fp}`, 'WORKDIR /app'];
  await new Promise<void>((resolve, reject) => {
    const tar = spawn('tar', tarArgs, { stdio: ['ignore', 'pipe', 'pipe'] });
    const imp = spawn('docker', ['import', ...changes.flatMap((c) => ['--change', c]), '-', image], { stdio: ['pipe', 'pipe', 'pipe'] });
    let err = '';
    tar.stderr.on('data', (d: Buffer) => (err += d.toString()));
    imp.stderr.on('data', (d: Buffer) => (err += d.toString()));
    tar.stdout.pipe(imp.stdin);
    let tarCode: number | null = null;
    tar.on('close', (c) => (tarCode = c));
    imp.on('close', (c) => {
      if (c === 0 && (tarCode === 0 || tarCode === null)) resolve();
      else reject(new Error(`image ${image}: tar exit ${tarCode}, docker import exit ${c}: ${err.trim().slice(-1500)}`));
    });
  });
  return { image, built: true, ms: Date.now() - t0 };
}

// ------------------------------------------------------------------ the running pod

/** Pod drives the containers of one pod instance. */
export class Pod {
  /** container -> image it was last started with */
  readonly images: Record<string, string> = {};
  constructor(
    readonly layout: PodLayout,
    readonly host: PodHost,
    readonly log: (l: string) => void,
    readonly privileged: string[] = ['--privileged'],
  ) {}

  spec(c: string): K8sContainer {
    const s = this.layout.containers.find((x) => x.name === c);
    if (!s) throw new Error(`no container ${c} in the manifest`);
    return s;
  }

  name(c: string): string {
    return containerName(this.host, c);
  }

  /** running says whether container c runs. */
  async running(c: string): Promise<boolean> {
    const r = await docker(['inspect', '--format', '{{.State.Running}}', this.name(c)]);
    return r.status === 0 && r.stdout.trim() === 'true';
  }

  /** logs returns the last lines of container c's output. */
  async logs(c: string, lines = 15): Promise<string> {
    const r = await docker(['logs', '--tail', String(lines), this.name(c)]);
    return `${c}:\n${(r.stdout + r.stderr).trim()}`;
  }

  /**
   * start (re)creates container c from image (like the kubelet restarting a container whose
   * image was patched) and waits until its startupProbe passes. Returns the time to ready.
   */
  async start(c: string, image: string, timeoutMs = 90_000): Promise<number> {
    const t0 = Date.now();
    await docker(['rm', '-f', this.name(c)]);
    await dockerOk(dockerRunArgs(this.layout, this.host, this.spec(c), image, this.privileged));
    this.images[c] = image;
    await this.waitReady(c, timeoutMs);
    return Date.now() - t0;
  }

  /** waitReady runs the manifest's startupProbe (docker exec) until it succeeds. */
  async waitReady(c: string, timeoutMs = 90_000): Promise<void> {
    const probe = this.spec(c).startupProbe?.exec?.command;
    const deadline = Date.now() + timeoutMs;
    let last = '';
    for (;;) {
      if (!(await this.running(c))) throw new Error(`container ${c} exited while starting:\n${await this.logs(c)}`);
      if (!probe) return;
      const r = await docker(['exec', this.name(c), ...probe], 15_000);
      if (r.status === 0) return;
      last = (r.stderr || r.stdout).trim();
      if (Date.now() > deadline) throw new Error(`container ${c}: startupProbe still failing after ${timeoutMs} ms: ${last}\n${await this.logs(c)}`);
      await sleep(250);
    }
  }

  /** exec runs argv in container c (its env: the manifest's). */
  async exec(c: string, argv: string[], timeoutMs = 180_000): Promise<ShResult> {
    return docker(['exec', this.name(c), ...argv], timeoutMs);
  }

  /** stop sends SIGTERM to container c's main process (docker stop, 30 s) and leaves it exited. */
  async stop(c: string): Promise<void> {
    await docker(['stop', '-t', '30', this.name(c)], 60_000);
  }

  /** waitExited waits until container c's main process has exited; false on timeout. */
  async waitExited(c: string, timeoutMs: number): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      if (!(await this.running(c))) return true;
      await sleep(250);
    }
    return false;
  }
}

/** removeByLabel removes every container with the label (all runs: `sandnode-compat=1`). */
export async function removeContainers(label: string): Promise<string[]> {
  const ids = (await docker(['ps', '-aq', '--filter', `label=${label}`])).stdout.split('\n').filter(Boolean);
  if (ids.length) await docker(['rm', '-f', '-v', ...ids], 120_000);
  return ids;
}

/** mountsBelow lists mount points at or below root, deepest first. */
function mountsBelow(root: string): string[] {
  const out: string[] = [];
  for (const line of readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    const mp = line.split(' ')[4]?.replace(/\\040/g, ' ');
    if (mp && (mp === root || mp.startsWith(`${root}/`))) out.push(mp);
  }
  return out.sort((a, b) => b.length - a.length);
}

/** inodesBelow lists the inodes of the regular files below root (to find our loop devices). */
function inodesBelow(root: string, dev: number): Set<number> {
  const out = new Set<number>();
  const walk = (p: string) => {
    let st;
    try {
      st = lstatSync(p);
    } catch {
      return;
    }
    if (st.dev !== dev) return;
    if (st.isFile()) out.add(st.ino);
    else if (st.isDirectory()) for (const e of readdirSync(p)) walk(path.join(p, e));
  };
  walk(root);
  return out;
}

/**
 * cleanupPodHost removes what a pod left on the host: mounts below its root (the runtime
 * dir's sandbox mounts propagated out, then the shared bind), loop devices backed by a file
 * of its remapped state dir (matched by device and inode: the backing path the kernel shows
 * is the container's), then the dirs. Containers must be gone already. Never throws.
 */
export async function cleanupPodHost(host: PodHost, sandboxIds: string[] = []): Promise<string[]> {
  const notes: string[] = [];
  const rootDev = statSync(host.root).dev;
  const inodes = inodesBelow(host.root, rootDev);
  const major = Math.floor(rootDev / 256);
  const minor = rootDev % 256;
  const loops = await sh('losetup', ['-l', '-J', '-O', 'NAME,BACK-FILE,BACK-INO,BACK-MAJ:MIN']);
  try {
    const list = (JSON.parse(loops.stdout || '{"loopdevices":[]}') as { loopdevices: { name: string; 'back-file': string; 'back-ino': string | number; 'back-maj:min': string }[] }).loopdevices;
    for (const l of list) {
      const [ma, mi] = String(l['back-maj:min']).split(':').map(Number);
      // a device image of a sandbox of this run (its file may be deleted already: match by name)
      const ours = sandboxIds.some((id) => new RegExp(`/images/${id}-[a-z]+\\.img( \\(deleted\\))?$`).test(l['back-file'] ?? ''));
      if (ours || (ma === major && mi === minor && inodes.has(Number(l['back-ino'])))) {
        const r = await sh('losetup', ['-d', l.name]);
        notes.push(`detached ${l.name}${r.status ? ` (failed: ${r.stderr.trim()})` : ''}`);
      }
    }
  } catch (err) {
    notes.push(`losetup -l: ${(err as Error).message}`);
  }
  for (let pass = 0; pass < 3; pass++) {
    const ms = mountsBelow(host.root);
    if (!ms.length) break;
    for (const m of ms) {
      const r = await sh('umount', [m]);
      if (r.status !== 0) await sh('umount', ['-l', m]);
    }
    if (pass === 0) notes.push(`unmounted ${ms.length} mount(s) below ${host.root}`);
  }
  try {
    rmSync(host.root, { recursive: true, force: true });
  } catch (err) {
    notes.push(`rm ${host.root}: ${(err as Error).message}`);
  }
  return notes;
}

// ------------------------------------------------------------------ the upgrade run

/** buildTemplateOnHost builds a template with build b's own template builder into stateDir/templates. */
async function buildTemplateOnHost(stateDir: string, name: string, b: Build): Promise<void> {
  const builder = require(path.join(b.dir, 'services', 'server', 'dist', 'core', 'template-builder.js')) as {
    buildTemplate(o: { name: string; templatesDir: string; poddBundlePath: string; poddVersion: string }): Promise<unknown>;
  };
  await builder.buildTemplate({ name, templatesDir: path.join(stateDir, 'templates'), poddBundlePath: path.join(b.dir, 'services', 'podd', 'dist', 'podd.bundle.js'), poddVersion: b.version });
}

interface Sb {
  id: string;
  pid: number;
  marker: string;
}

/** A long exec stream that runs across a handover until /workspace/<stopFile> exists. */
interface LiveStream {
  stopFile: string;
  lines: string[];
  done: Promise<{ exitCode: number; stdout: string; error?: string }>;
}

function startStream(api: ServerApi, sandboxId: string, stopFile: string): LiveStream {
  const lines: string[] = [];
  const script = `i=0; while [ ! -e /workspace/${stopFile} ]; do i=$((i+1)); echo "tick $i"; sleep 0.1; done; echo done; exit 0`;
  const done = execCollect(api, sandboxId, ['sh', '-c', script], (s) => lines.push(s)).then(
    (r) => ({ exitCode: r.exitCode, stdout: r.stdout }),
    (err: unknown) => ({ exitCode: -1, stdout: lines.join(''), error: `${grpcStatusOf(err) ?? ''} ${(err as Error).message}` }),
  );
  return { stopFile, lines, done };
}

/** checkStream says whether the stream ended cleanly with every tick in order; throws otherwise. */
function checkStream(r: { exitCode: number; stdout: string; error?: string }): string {
  if (r.error) throw new Error(`exec stream broke: ${r.error} (after ${r.stdout.split('\n').length} lines)`);
  const ls = r.stdout.trimEnd().split('\n');
  if (ls.pop() !== 'done' || r.exitCode !== 0) throw new Error(`exec stream ended without "done"/exit 0 (exit ${r.exitCode}, last ${JSON.stringify(ls.slice(-2))})`);
  ls.forEach((l, i) => {
    if (l !== `tick ${i + 1}`) throw new Error(`exec stream: line ${i + 1} is ${JSON.stringify(l)}`);
  });
  return `${ls.length} ticks in order, "done", exit 0`;
}

/** State shared by the steps of one container run. */
interface RunState {
  pod: Pod;
  runDir: string;
  stateDir: string;
  api: ServerApi;
  sbs: Sb[];
  vmmPid: number;
  builds: { old: Build; new: Build };
  images: { old: string; new: string };
}

/** A step that does not apply (a documented fallback): reported n/a with the reason. */
class NotApplicable extends Error {}

async function step(steps: UpgradeStep[], log: (l: string) => void, s: Omit<UpgradeStep, 'result' | 'ms'>, fn: () => Promise<{ detail?: string; timings?: Record<string, number> } | void>): Promise<boolean> {
  const t0 = Date.now();
  try {
    const r = (await fn()) ?? {};
    steps.push({ ...s, result: 'pass', ms: Date.now() - t0, ...(r.detail ? { detail: r.detail } : {}), ...(r.timings ? { timings: r.timings } : {}) });
    log(`container mode: ${s.name}: pass (${Date.now() - t0} ms)${r.detail ? ` ${r.detail}` : ''}`);
    return true;
  } catch (err) {
    if (err instanceof NotApplicable) {
      steps.push({ ...s, result: 'n/a', ms: Date.now() - t0, detail: err.message });
      log(`container mode: ${s.name}: n/a (${err.message})`);
      return true;
    }
    const e = err as Error & { logExcerpt?: string };
    steps.push({ ...s, result: 'fail', ms: Date.now() - t0, detail: e.message.slice(0, 3000), ...(e.logExcerpt ? { logExcerpt: e.logExcerpt } : {}) });
    log(`container mode: ${s.name}: FAIL (${Date.now() - t0} ms) ${e.message}`);
    return false;
  }
}

/** check: every sandbox keeps its pid and runs; exec works; pause/resume of one; versions as expected; vmm untouched. */
async function checkNode(st: RunState, server: Build, ublk: Build): Promise<string> {
  const notes: string[] = [];
  const sv = await versionAt(`unix://${path.join(st.runDir, 'server.sock')}`);
  if (sv.version !== server.version || sv.commit !== server.commit) throw new Error(`server answers ${sv.version}@${sv.commit.slice(0, 12)}, expected ${server.label} ${server.version}@${server.commit.slice(0, 12)}`);
  const uv = await versionAt(`unix://${path.join(st.runDir, 'ublk-manager.sock')}`);
  if (uv.version !== ublk.version || uv.commit !== ublk.commit) throw new Error(`ublk-manager answers ${uv.version}@${uv.commit.slice(0, 12)}, expected ${ublk.label} ${ublk.version}@${ublk.commit.slice(0, 12)}`);
  const vv = await versionAt(`unix://${path.join(st.runDir, 'vmm-supervisor.sock')}`);
  if (vv.pid !== st.vmmPid) throw new Error(`vmm-supervisor pid ${vv.pid}, was ${st.vmmPid}: it restarted`);
  notes.push(`server ${server.label} (pid ${sv.pid}), ublk-manager ${ublk.label} (pid ${uv.pid}), vmm-supervisor pid ${vv.pid} unchanged`);
  for (const s of st.sbs) {
    const g = await getSandbox(st.api, s.id);
    if (g.pid !== s.pid || stateName(g.state) !== 'RUNNING') throw new Error(`${s.id}: ${stateName(g.state)} pid ${g.pid}, was RUNNING pid ${s.pid}`);
    const r = await execCollect(st.api, s.id, ['cat', `/workspace/marker`]);
    if (r.exitCode !== 0 || r.stdout !== s.marker) throw new Error(`${s.id}: exec cat /workspace/marker gave exit ${r.exitCode} ${JSON.stringify(r.stdout)} (wrote ${s.marker})`);
  }
  const s0 = st.sbs[0]!;
  await st.api.sandboxes.pauseSandbox({ sandboxId: s0.id });
  const paused = await getSandbox(st.api, s0.id);
  const resumed = (await st.api.sandboxes.resumeSandbox({ sandboxId: s0.id })).sandbox;
  if (stateName(paused.state) !== 'PAUSED' || resumed?.pid !== s0.pid) throw new Error(`${s0.id}: pause/resume gave ${stateName(paused.state)} then pid ${resumed?.pid} (was ${s0.pid})`);
  notes.push(`${st.sbs.length} sandboxes RUNNING with the same pids, exec reads their data, pause/resume ok`);
  return notes.join('; ');
}

/**
 * upgradeServerIn: the README rollout for the server, in the standby slot's container `to`
 * (already running the target image): `sandnode upgrade server --from-build /app` there.
 */
async function upgradeServerIn(st: RunState, to: string): Promise<{ detail: string; timings: Record<string, number> }> {
  // The standby daemon of the `to` container takes over when it has "server.takeover.v1"
  // (`upgrade server --standby`); an older one cannot be asked, so the CLI of its image starts
  // a server from its build that takes over (`--from-build /app`), as that release documents.
  const slot = to.replace(/^server-/, '');
  const standby = await versionAt(`unix://${path.join(st.runDir, `server-${slot}-admin.sock`)}`).catch(() => undefined);
  const viaStandby = !!standby?.features.includes('server.takeover.v1');
  const args = viaStandby ? ['upgrade', 'server', '--standby', '--json'] : ['upgrade', 'server', '--from-build', '/app', '--json'];
  const r = await st.pod.exec(to, ['node', '/app/services/server/dist/cli/main.js', ...args]);
  if (r.status !== 0) throw Object.assign(new Error(`sandnode upgrade server in ${to} exited ${r.status}: ${(r.stderr || r.stdout).trim().slice(-1500)}`), { logExcerpt: await st.pod.logs(to) });
  const t = JSON.parse(r.stdout) as { oldPid: number; newPid: number; oldVersion: string; newVersion: string; holdWindowMs: number; adopted: number; adoptionMs: number; epoch: number; listeners: string[] };
  st.api.close();
  st.api = connectApi(`unix://${path.join(st.runDir, 'server.sock')}`);
  return {
    detail: `in ${to} (${viaStandby ? 'its standby took over: --standby' : 'a server from its build took over: --from-build /app'}): ${t.oldVersion} pid ${t.oldPid} -> ${t.newVersion} pid ${t.newPid}, epoch ${t.epoch}, ${t.adopted} adopted, listeners ${t.listeners.join(' ')}`,
    timings: { cliMs: r.ms, holdMs: t.holdWindowMs, adoptionMs: t.adoptionMs },
  };
}

/**
 * upgradeUblkIn: the README rollout for ublk-manager in the standby slot's container `to`.
 * First the README command (`sandnode upgrade ublk-manager --from-build /app` in `to`); when
 * it cannot run there (its new process needs the slot that the container's own daemon holds),
 * the equivalent: HandoverAll on the container's daemon from the old slot (with the node's
 * epoch), SIGTERM of the old slot's container, active-slot record and the stable link.
 */
async function upgradeUblkIn(st: RunState, from: string, to: string, slot: 'a' | 'b'): Promise<{ detail: string; timings: Record<string, number> }> {
  const notes: string[] = [];
  const timings: Record<string, number> = {};
  // The README rollout: the standby slot's own daemon takes the devices (`--standby`, a CLI of
  // this release); an older CLI only knows `--from-build`, which cannot run beside that daemon.
  let cli = await st.pod.exec(to, ['node', '/app/services/server/dist/cli/main.js', 'upgrade', 'ublk-manager', '--standby', '--json']);
  if (cli.status !== 0 && /unknown option '--standby'/.test(cli.stderr)) {
    cli = await st.pod.exec(to, ['node', '/app/services/server/dist/cli/main.js', 'upgrade', 'ublk-manager', '--from-build', '/app', '--json']);
  }
  timings.cliMs = cli.ms;
  if (cli.status === 0) {
    const r = JSON.parse(cli.stdout) as { oldPid: number; newPid: number; devices: unknown[]; stallP99Ms: number; totalMs: number };
    notes.push(`README command worked in ${to}: ${r.devices.length} devices moved, pid ${r.oldPid} -> ${r.newPid}`);
    timings.maxStallMs = r.stallP99Ms;
    timings.totalMs = r.totalMs;
    return { detail: notes.join('; '), timings };
  }
  notes.push(`README command in ${to} failed (exit ${cli.status}: ${(cli.stderr || cli.stdout).trim().split('\n').slice(-1)[0]?.slice(0, 300)}); equivalent HandoverAll to the container's own daemon`);
  const lease = JSON.parse(readFileSync(path.join(st.stateDir, 'server.lease'), 'utf8').trim().split('\n').pop() || '{}') as { epoch?: number };
  const epoch = lease.epoch ?? 0;
  const newAddr = `unix://${path.join(st.runDir, `ublk-manager-${slot}.sock`)}`;
  const oldSlot = slot === 'a' ? 'b' : 'a';
  const oldV = await versionAt(`unix://${path.join(st.runDir, `ublk-manager-${oldSlot}.sock`)}`);
  const t0 = Date.now();
  const ch = createSandnodeChannel(newAddr);
  let res;
  try {
    // the old slot's address as the new slot's container sees it
    res = await createServiceClient(DeviceServiceDefinition, ch, { timeoutMs: 120_000, epoch: () => epoch }).handoverAll({ fromAddress: `unix:///run/sandnode/ublk-manager-${oldSlot}.sock`, deviceIds: [], perDeviceTimeoutMs: 0 });
  } finally {
    ch.close();
  }
  timings.handoverMs = Date.now() - t0;
  const bad = res.devices.filter((d) => d.result !== HandoverResult.HANDOVER_RESULT_MOVED);
  if (bad.length) throw new Error(`${notes.join('; ')}; HandoverAll: ${bad.map((d) => `${d.deviceId} ${HandoverResult[d.result]} ${d.error}`).join('; ')}`);
  timings.maxStallMs = Math.max(0, ...res.devices.map((d) => d.stallMs));
  const t1 = Date.now();
  await st.pod.stop(from);
  timings.stopOldMs = Date.now() - t1;
  mkdirSync(path.join(st.stateDir, 'ublk-manager'), { recursive: true });
  writeFileSync(path.join(st.stateDir, 'ublk-manager', 'active-slot'), `${slot}\n`);
  const link = path.join(st.runDir, 'ublk-manager.sock');
  rmSync(`${link}.tmp`, { force: true });
  symlinkSync(`ublk-manager-${slot}.sock`, `${link}.tmp`);
  renameSync(`${link}.tmp`, link);
  notes.push(`${res.devices.length} devices moved ${oldSlot} (pid ${oldV.pid}) -> ${slot} (${res.mode}), container ${from} stopped, ublk-manager.sock -> ublk-manager-${slot}.sock`);
  return { detail: notes.join('; '), timings };
}

/**
 * runContainerUpgrade: all at N-1 (vmm, ublk-a, server-a) with 3 sandboxes -> ublk and server
 * to N in the b slots (exec stream across the server handover) -> checks -> back to N-1 in the
 * a slots (another stream) -> checks -> delete.
 */
async function runContainerUpgrade(ctx: RunContext, layout: PodLayout, host: PodHost, old: Build, neu: Build, images: { old: string; new: string }, privileged: string[], sandboxIds: string[]): Promise<UpgradeRun> {
  const t0 = Date.now();
  const steps: UpgradeStep[] = [];
  const log = ctx.log;
  const pod = new Pod(layout, host, log, privileged);
  const runDir = hostDirOf(layout, host, 'vmm', '/run/sandnode');
  const stateDir = hostDirOf(layout, host, 'vmm', '/var/lib/sandnode');
  const st: RunState = { pod, runDir, stateDir, api: connectApi(`unix://${path.join(runDir, 'server.sock')}`), sbs: [], vmmPid: 0, builds: { old, new: neu }, images };
  const run: UpgradeRun = { component: 'all', from: old.label, to: neu.label, result: 'fail', steps };
  const ok = async (s: Omit<UpgradeStep, 'result' | 'ms'>, fn: () => Promise<{ detail?: string; timings?: Record<string, number> } | void>) => step(steps, log, s, fn);
  let stream: LiveStream | undefined;
  try {
    const tmpl = `compat-${old.label.toLowerCase().replace(/[^a-z0-9]/g, '-')}`;
    if (
      !(await ok({ name: `start pod at ${old.label} (vmm, ublk-a, server-a)` }, async () => {
        const t1 = Date.now();
        await buildTemplateOnHost(stateDir, tmpl, old);
        const timings: Record<string, number> = { templateMs: Date.now() - t1 };
        for (const c of ['vmm', 'ublk-a', 'server-a']) timings[`${c}ReadyMs`] = await pod.start(c, images.old);
        st.vmmPid = (await versionAt(`unix://${path.join(runDir, 'vmm-supervisor.sock')}`)).pid;
        return { detail: `template ${tmpl} (podd ${old.label}); containers from ${images.old}, ready by their startupProbe`, timings };
      }))
    )
      return run;
    if (
      !(await ok({ name: 'create 3 sandboxes' }, async () => {
        const timings: Record<string, number> = {};
        for (let i = 0; i < 3; i++) {
          const t1 = Date.now();
          const s = (await st.api.sandboxes.createSandbox({ template: tmpl, metadata: { compat: 'containers' }, timeoutSeconds: 0, requestId: `compat-ct-${randomBytes(6).toString('hex')}` })).sandbox;
          if (!s || stateName(s.state) !== 'RUNNING' || s.pid <= 0) throw new Error(`create ${i}: ${s ? `${stateName(s.state)} pid ${s.pid}` : 'empty answer'}`);
          timings[`create${i}Ms`] = Date.now() - t1;
          const marker = `sandbox ${i} ${randomBytes(4).toString('hex')}`;
          await st.api.sandboxes.writeFile({ sandboxId: s.sandboxId, path: 'marker', data: Buffer.from(marker), mode: 0o644, append: false });
          st.sbs.push({ id: s.sandboxId, pid: s.pid, marker });
          sandboxIds.push(s.sandboxId);
        }
        return { detail: st.sbs.map((s) => `${s.id} pid ${s.pid}`).join(', '), timings };
      }))
    )
      return run;
    await ok({ name: 'check at start', component: 'server' }, async () => ({ detail: await checkNode(st, old, old) }));

    // ---- upgrade to N in the b slots
    await ok({ name: 'upgrade ublk-manager (ublk-b)', component: 'ublk-manager', from: old.label, to: neu.label }, async () => {
      const readyMs = await pod.start('ublk-b', images.new);
      const r = await upgradeUblkIn(st, 'ublk-a', 'ublk-b', 'b');
      return { detail: r.detail, timings: { readyMs, ...r.timings } };
    });
    stream = startStream(st.api, st.sbs[0]!.id, 'stop-1');
    await sleep(500);
    await ok({ name: 'upgrade server (server-b)', component: 'server', from: old.label, to: neu.label }, async () => {
      const readyMs = await pod.start('server-b', images.new);
      const r = await upgradeServerIn(st, 'server-b');
      return { detail: r.detail, timings: { readyMs, ...r.timings } };
    });
    await ok({ name: 'exec stream across the server upgrade', component: 'server' }, async () => {
      await st.api.sandboxes.writeFile({ sandboxId: st.sbs[0]!.id, path: 'stop-1', data: Buffer.from('x'), mode: 0o644, append: false });
      const r = await Promise.race([stream!.done, sleep(60_000).then(() => ({ exitCode: -1, stdout: stream!.lines.join(''), error: 'no end within 60 s' }))]);
      stream = undefined;
      return { detail: checkStream(r) };
    });
    await ok({ name: `check after upgrade (server, ublk-manager at ${neu.label})`, component: 'server' }, async () => ({ detail: await checkNode(st, neu, neu) }));

    // ---- roll back to N-1 in the a slots
    // Feature check, never the version: a ublk-manager without "ublk.foreign-mountns.v1" matches
    // loop devices by the backing path, which a device attached in another container renders
    // differently (another mount namespace), so it cannot take the devices back across
    // containers. Then ublk-manager stays at N (documented fallback) and the rest rolls back.
    let ublkAfterRollback = old;
    await ok({ name: 'rollback ublk-manager (ublk-a)', component: 'ublk-manager', from: neu.label, to: old.label }, async () => {
      const readyMs = await pod.start('ublk-a', images.old);
      const target = await versionAt(`unix://${path.join(st.runDir, 'ublk-manager-a.sock')}`);
      if (!target.features.includes('ublk.foreign-mountns.v1')) {
        await pod.stop('ublk-a');
        ublkAfterRollback = neu;
        throw new NotApplicable(`ublk-manager ${old.label} lacks feature "ublk.foreign-mountns.v1" (it cannot recover loop devices attached from another container's mount namespace): ublk-manager stays at ${neu.label}, ublk-a stopped again`);
      }
      const r = await upgradeUblkIn(st, 'ublk-b', 'ublk-a', 'a');
      return { detail: r.detail, timings: { readyMs, ...r.timings } };
    });
    stream = startStream(st.api, st.sbs[1]!.id, 'stop-2');
    await sleep(500);
    await ok({ name: 'rollback server (server-a)', component: 'server', from: neu.label, to: old.label }, async () => {
      // the retired server-a process ends once the streams it relayed are done
      const exited = await pod.waitExited('server-a', 30_000);
      const readyMs = await pod.start('server-a', images.old);
      const r = await upgradeServerIn(st, 'server-a');
      return { detail: `${exited ? '' : 'retired server-a still running after 30 s, replaced; '}${r.detail}`, timings: { readyMs, ...r.timings } };
    });
    await ok({ name: 'exec stream across the server rollback', component: 'server' }, async () => {
      await st.api.sandboxes.writeFile({ sandboxId: st.sbs[1]!.id, path: 'stop-2', data: Buffer.from('x'), mode: 0o644, append: false });
      const r = await Promise.race([stream!.done, sleep(60_000).then(() => ({ exitCode: -1, stdout: stream!.lines.join(''), error: 'no end within 60 s' }))]);
      stream = undefined;
      return { detail: checkStream(r) };
    });
    await ok({ name: `check after rollback (server at ${old.label}, ublk-manager at ${ublkAfterRollback.label})`, component: 'server' }, async () => ({ detail: await checkNode(st, old, ublkAfterRollback) }));
    await ok({ name: 'delete sandboxes', component: 'server' }, async () => {
      for (const s of st.sbs) await st.api.sandboxes.deleteSandbox({ sandboxId: s.id });
      const left = (await st.api.sandboxes.listSandboxes({ pageSize: 100 })).sandboxes.length;
      if (left) throw new Error(`${left} sandboxes still listed after delete`);
      return { detail: `${st.sbs.length} deleted` };
    });
  } finally {
    if (stream) await st.api.sandboxes.writeFile({ sandboxId: st.sbs[0]!.id, path: stream.stopFile, data: Buffer.from('x'), mode: 0o644, append: false }).catch(() => undefined);
    st.api.close();
    run.result = steps.length > 0 && steps.every((s) => s.result !== 'fail') ? 'pass' : 'fail';
    run.ms = Date.now() - t0;
  }
  return run;
}

/**
 * runContainerMode runs the container upgrade run of N-1 -> N -> N-1 (ctx.order: the last two
 * labels), or returns a "skipped: <what is missing>" section when no Docker engine can run.
 * Leaves no container, mount, loop device or dir behind (images are kept as the cache).
 */
export async function runContainerMode(ctx: RunContext): Promise<ReportSection> {
  const t0 = Date.now();
  const title = 'Container mode';
  const missing = await dockerMissing(ctx.log);
  if (missing) return { title, result: 'skipped', summary: `skipped: ${missing}`, ms: Date.now() - t0 };
  if (process.getuid?.() !== 0) return { title, result: 'skipped', summary: 'skipped: needs root (privileged containers, shared mounts, loop devices)', ms: Date.now() - t0 };
  const labels = ctx.order.slice(-2);
  const old = ctx.builds[labels[0] ?? ''];
  const neu = ctx.builds[labels[1] ?? ''];
  if (!old || !neu || labels.length < 2) return { title, result: 'fail', summary: `need two builds (N-1, N) in ctx.order, got ${JSON.stringify(ctx.order)}`, ms: Date.now() - t0 };
  const rows: Array<Record<string, string>> = [];
  let layout: PodLayout;
  try {
    layout = loadPodLayout();
  } catch (err) {
    return { title, result: 'fail', summary: `cannot read the manifest: ${(err as Error).message}`, ms: Date.now() - t0 };
  }
  const work = mkdtempSync(path.join(ctx.workDir, 'containers-'));
  let host: PodHost | undefined;
  let run: UpgradeRun | undefined;
  const notes: string[] = [];
  const sandboxIds: string[] = [];
  try {
    const tools = path.join(work, 'tools');
    mkdirSync(tools);
    let t1 = Date.now();
    const toolsFp = stageTools(tools);
    rows.push({ step: 'stage tools (node, runc, busybox, util-linux, e2fsprogs + libs)', ms: String(Date.now() - t1), detail: tools });
    const images = { old: '', new: '' };
    for (const [k, b] of [['old', old], ['new', neu]] as const) {
      const r = await ensureImage(b, tools, toolsFp);
      images[k] = r.image;
      rows.push({ step: `image ${r.image}`, ms: String(r.ms), detail: r.built ? 'built (docker import)' : 'cached (fingerprint matches)' });
      ctx.log(`container mode: image ${r.image} ${r.built ? 'built' : 'cached'} in ${r.ms} ms`);
    }
    t1 = Date.now();
    host = await preparePodHost(layout, work);
    rows.push({ step: 'pod host dirs', ms: String(Date.now() - t1), detail: `hostPath remapped: ${Object.entries(host.remapped).map(([a, b]) => `${a} -> ${b}`).join(', ') || 'none'}` });
    t1 = Date.now();
    const priv = await privilegedFlags(images.old);
    rows.push({ step: 'privileged containers', ms: String(Date.now() - t1), detail: priv.note });
    run = await runContainerUpgrade(ctx, layout, host, old, neu, images, priv.flags, sandboxIds);
  } catch (err) {
    notes.push(`error: ${(err as Error).message}`);
  } finally {
    const t1 = Date.now();
    const removed = host ? await removeContainers(`sandnode-compat.run=${host.runId}`) : [];
    const cleaned = host ? await cleanupPodHost(host, sandboxIds) : [];
    rmSync(work, { recursive: true, force: true });
    rows.push({ step: 'cleanup', ms: String(Date.now() - t1), detail: [`${removed.length} containers removed`, ...cleaned].join('; ') });
  }
  const result = run?.result === 'pass' && !notes.length ? 'pass' : 'fail';
  const failed = run?.steps.filter((s) => s.result === 'fail').map((s) => s.name) ?? [];
  const md = [
    '| step | result | ms | timings | detail |',
    '|---|---|---|---|---|',
    ...(run?.steps ?? []).map((s) => `| ${s.name} | ${s.result} | ${s.ms} | ${Object.entries(s.timings ?? {}).map(([k, v]) => `${k}=${v}`).join(' ')} | ${(s.detail ?? '').replace(/\|/g, '\\|').replace(/\n/g, ' ')} |`),
  ].join('\n');
  return {
    title,
    result,
    summary: `${old.label} -> ${neu.label} -> ${old.label} in containers laid out by deploy/k8s/base: ${result}${failed.length ? ` (failed: ${failed.join(', ')})` : ''}${notes.length ? `; ${notes.join('; ')}` : ''}`,
    upgrades: run ? [run] : [],
    rows,
    markdown: md,
    ms: Date.now() - t0,
  };
}
