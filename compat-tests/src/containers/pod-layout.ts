/**
 * The pod layout of deploy/k8s/base translated into container specs: the only part of the
 * container mode that is ours (pod.ts runs the specs on testcontainers). The layout is not
 * restated here: containers, commands, env, volumes, mount paths and propagation, privileges,
 * the shared process namespace, probes and config files are read from `daemonset.yaml` and
 * `configmap.yaml`, so the manifest is what runs. Everything in this file is pure (no engine,
 * no host changes) and unit-tested in pod-layout.test.ts.
 *
 * Translation (Kubernetes -> container spec):
 *   shareProcessNamespace    PidMode `container:<first>`, and NetworkMode `container:<first>`
 *                            (a pod has one network namespace too); the first container owns
 *                            both (network `none`, the pod's hostname)
 *   privileged               the engine's privileged mode, or its nearest equivalent where
 *                            the engine lacks a capability (privilegeFallback)
 *   allowPrivilegeEscalation false -> security opt `no-new-privileges`
 *   command + args           entrypoint command[0], cmd the rest (a scratch image has no default)
 *   env                      the container's environment
 *   configMap volume         a host dir holding the ConfigMap's files, bound (readOnly)
 *   emptyDir volume          a host dir of this run, made a shared mount (host.ts) so that
 *   mountPropagation         Bidirectional -> `rshared`, HostToContainer -> `rslave`,
 *                            none -> `rprivate`
 *   secret volume            a host dir of this run; the TLS Secret (sandnode-api-tls) gets a
 *                            throwaway CA + server pair made at prepare time (host.ts)
 *   hostPath /dev            the host's /dev (loop devices must appear after start)
 *   other hostPath           remapped to a dir of this run (never the host's real state dir)
 *   startupProbe exec        the wait strategy: the probe's argv run in the container until it
 *                            succeeds (period shortened to PROBE_PERIOD_MS)
 *   image                    the build the step asks for: N `sandnode:<version>` (the release
 *                            image), a release `sandnode-compat:<label>-<commit12>`
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import YAML from 'yaml';
import { lackingCapabilities } from '@sandnode/node-stack';
import { REPO_ROOT } from '../releases';

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
  secret?: { secretName: string };
}

/** PodLayout is the DaemonSet's pod template plus the ConfigMap's files. */
export interface PodLayout {
  containers: K8sContainer[];
  volumes: K8sVolume[];
  shareProcessNamespace: boolean;
  configMapName: string;
  configFiles: Record<string, string>;
}

/** The default manifest dir. */
export const K8S_BASE_DIR = path.join(REPO_ROOT, 'deploy', 'k8s', 'base');

/** loadPodLayout reads the pod template and the ConfigMap from baseDir; throws naming a wrong kind. */
export function loadPodLayout(baseDir = K8S_BASE_DIR): PodLayout {
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
  /** the run's host dir; every volume except /dev lives below it */
  root: string;
  /** host dir holding the ConfigMap's files */
  configDir: string;
  /** volume name -> host dir */
  volumeDirs: Record<string, string>;
  /** secret volume host dirs, by Secret name (host.ts fills the TLS one) */
  secretDirs: Record<string, string>;
  /** emptyDir host dirs (each must become a shared mount before a container binds it) */
  emptyDirs: string[];
  /** hostPath volumes that were remapped (path in the manifest -> host dir used) */
  remapped: Record<string, string>;
}

/**
 * planPodHost says where each volume of the pod lives below root (no host change: host.ts
 * makes the dirs). Throws for a volume kind that is not translated or a ConfigMap that is not
 * the one in configmap.yaml.
 */
export function planPodHost(layout: PodLayout, root: string, runId: string): PodHost {
  const host: PodHost = { runId, root, configDir: path.join(root, 'config'), volumeDirs: {}, secretDirs: {}, emptyDirs: [], remapped: {} };
  for (const v of layout.volumes) {
    if (v.configMap) {
      if (v.configMap.name !== layout.configMapName) throw new Error(`volume ${v.name}: ConfigMap ${v.configMap.name} is not in configmap.yaml`);
      host.volumeDirs[v.name] = host.configDir;
    } else if (v.hostPath) {
      if (v.hostPath.path === '/dev') host.volumeDirs[v.name] = '/dev';
      else {
        const d = path.join(root, 'hostpath', v.name);
        host.volumeDirs[v.name] = d;
        host.remapped[v.hostPath.path] = d;
      }
    } else if (v.secret) {
      const d = path.join(root, 'secret', v.name);
      host.volumeDirs[v.name] = d;
      host.secretDirs[v.secret.secretName] = d;
    } else if (v.emptyDir) {
      const d = path.join(root, 'emptydir', v.name);
      host.volumeDirs[v.name] = d;
      host.emptyDirs.push(d);
    } else {
      throw new Error(`volume ${v.name}: only configMap, secret, hostPath and emptyDir are translated`);
    }
  }
  return host;
}

/** hostDirOf is the host dir mounted at mountPath in container c (e.g. the run dir at /run/sandnode). */
export function hostDirOf(layout: PodLayout, host: PodHost, c: string, mountPath: string): string {
  const m = layout.containers.find((x) => x.name === c)?.volumeMounts?.find((x) => x.mountPath === mountPath);
  if (!m) throw new Error(`container ${c} mounts nothing at ${mountPath}`);
  const d = host.volumeDirs[m.name];
  if (!d) throw new Error(`container ${c}: volume ${m.name} has no host dir`);
  return d;
}

/** Bind propagation of a mount, as the engine names it. */
export type Propagation = 'rshared' | 'rslave' | 'rprivate';

/** One bind mount of a container. */
export interface MountSpec {
  source: string;
  target: string;
  readOnly: boolean;
  propagation: Propagation;
}

/**
 * Privilege is how this engine runs a privileged container: `privileged` (the engine's own
 * mode) or the explicit equivalent (capabilities, security opts, device rules, mounts).
 */
export interface Privilege {
  privileged: boolean;
  capAdd: string[];
  capDrop: string[];
  securityOpt: string[];
  /** /proc and /sys unmasked and writable (the CLI's `--security-opt systempaths=unconfined`) */
  unmaskedPaths: boolean;
  deviceCgroupRules: string[];
  mounts: MountSpec[];
  /** one line for the report */
  note: string;
}

/** PRIVILEGED is the engine's own privileged mode. */
export const PRIVILEGED: Privilege = { privileged: true, capAdd: [], capDrop: [], securityOpt: [], unmaskedPaths: false, deviceCgroupRules: [], mounts: [], note: 'privileged mode' };

/**
 * privilegeFallback is the nearest equivalent of privileged mode for an engine whose own
 * bounding set is capBnd (privileged mode fails there with "unable to apply caps"): every
 * capability the host has, no seccomp/AppArmor, unmasked /proc, every device allowed, the
 * host's cgroup tree writable. why is the engine's error, for the note.
 */
export function privilegeFallback(capBnd: bigint, why: string): Privilege {
  const lacking = lackingCapabilities(capBnd);
  const p: Privilege = {
    privileged: false,
    capAdd: ['ALL'],
    capDrop: lacking,
    securityOpt: ['seccomp=unconfined', 'apparmor=unconfined'],
    unmaskedPaths: true,
    deviceCgroupRules: ['a *:* rwm'],
    mounts: [{ source: '/sys/fs/cgroup', target: '/sys/fs/cgroup', readOnly: false, propagation: 'rprivate' }],
    note: '',
  };
  const noResource = lacking.includes('SYS_RESOURCE')
    ? "; without CAP_SYS_RESOURCE the vmm command's `echo -1000 > /proc/self/oom_score_adj` fails, so a failure of that echo is tolerated (logged)"
    : '';
  p.note = `privileged mode fails here (${why.slice(0, 120)}; the engine lacks CAP_${lacking.join(', CAP_')}): privileged containers run with all capabilities but ${lacking.join(', ') || 'none'}, seccomp/AppArmor/systempaths unconfined, device rule "a *:* rwm", /sys/fs/cgroup bound${noResource}`;
  return p;
}

/** The spec of one container of the pod, as pod.ts starts it. */
export interface ContainerSpec {
  /** the manifest's container name (vmm, server-a, ...) */
  podContainer: string;
  /** the engine's container name: sandnode-compat-<run>-<container> */
  name: string;
  image: string;
  /** set on the container that owns the pod's namespaces */
  hostname?: string;
  labels: Record<string, string>;
  /** undefined: unprivileged */
  privilege?: Privilege;
  noNewPrivileges: boolean;
  /** `container:<owner>` for every container but the owner, when the pod shares its PID namespace */
  pidMode?: string;
  /** `none` for the owner, `container:<owner>` for the others */
  networkMode: string;
  env: Record<string, string>;
  mounts: MountSpec[];
  entrypoint: string[];
  cmd: string[];
  /** the startupProbe: argv run in the container every periodMs until it exits 0, at most timeoutMs */
  startupProbe?: { command: string[]; periodMs: number; timeoutMs: number };
}

/** The label every container of the container mode carries (all runs). */
export const LABEL = 'sandnode-compat';
/** The label naming the run. */
export const RUN_LABEL = 'sandnode-compat.run';
/** The label naming the manifest's container. */
export const CONTAINER_LABEL = 'sandnode-compat.container';
/** The probe period used instead of the manifest's periodSeconds (2 s): a test waits less. */
export const PROBE_PERIOD_MS = 250;
/** Longest wait for a startupProbe (the manifest allows 300 s; a test fails sooner). */
export const PROBE_TIMEOUT_MS = 90_000;

const PROPAGATION: Record<string, Propagation> = { Bidirectional: 'rshared', HostToContainer: 'rslave', None: 'rprivate' };

/** containerName is the engine's name of pod container c in this run. */
export function containerName(host: PodHost, c: string): string {
  return `sandnode-compat-${host.runId}-${c}`;
}

/** OOM_ADJ is the vmm command's oom_score_adj prefix (needs CAP_SYS_RESOURCE). */
const OOM_ADJ = 'echo -1000 > /proc/self/oom_score_adj && ';
const OOM_ADJ_TOLERANT = "{ echo -1000 > /proc/self/oom_score_adj || echo 'compat: oom_score_adj not set (no CAP_SYS_RESOURCE)' >&2; } && ";

/**
 * containerSpec translates container c of the pod into the spec pod.ts starts (see the file
 * comment for the mapping). image replaces the manifest's placeholder image; privilege is how
 * this engine runs the manifest's privileged containers. Throws for a mount of an unknown
 * volume, a subPath mount, an unknown propagation or a container without a command.
 */
export function containerSpec(layout: PodLayout, host: PodHost, c: K8sContainer, image: string, privilege: Privilege = PRIVILEGED): ContainerSpec {
  const owner = layout.containers[0]?.name;
  if (!owner) throw new Error('the pod has no containers');
  const isOwner = c.name === owner;
  const ownerName = containerName(host, owner);
  const mounts: MountSpec[] = [];
  for (const m of c.volumeMounts ?? []) {
    const source = host.volumeDirs[m.name];
    if (!source) throw new Error(`container ${c.name}: mount of unknown volume ${m.name}`);
    if (m.subPath) throw new Error(`container ${c.name}: subPath mounts are not translated`);
    const propagation = PROPAGATION[m.mountPropagation ?? 'None'];
    if (!propagation) throw new Error(`container ${c.name}: mountPropagation ${m.mountPropagation} is not translated`);
    mounts.push({ source, target: m.mountPath, readOnly: m.readOnly === true, propagation });
  }
  const priv = c.securityContext?.privileged ? privilege : undefined;
  let argv = [...(c.command ?? []), ...(c.args ?? [])];
  // Without CAP_SYS_RESOURCE oom_score_adj cannot be lowered: the only change made to a
  // manifest command (the privilege note says so).
  if (priv && !priv.privileged && priv.capDrop.includes('SYS_RESOURCE')) argv = argv.map((a) => a.replace(OOM_ADJ, OOM_ADJ_TOLERANT));
  const [entry, ...cmd] = argv;
  if (!entry) throw new Error(`container ${c.name}: no command (a scratch image has no default)`);
  const probe = c.startupProbe?.exec?.command;
  const probeMs = (c.startupProbe?.periodSeconds ?? 10) * 1000 * (c.startupProbe?.failureThreshold ?? 3);
  const spec: ContainerSpec = {
    podContainer: c.name,
    name: containerName(host, c.name),
    image,
    labels: { [LABEL]: '1', [RUN_LABEL]: host.runId, [CONTAINER_LABEL]: c.name },
    noNewPrivileges: c.securityContext?.allowPrivilegeEscalation === false,
    // one network namespace per pod, like the pause container's
    networkMode: isOwner ? 'none' : `container:${ownerName}`,
    env: Object.fromEntries((c.env ?? []).map((e) => [e.name, e.value ?? ''])),
    mounts: [...mounts, ...(priv?.mounts ?? [])],
    entrypoint: [entry],
    cmd,
  };
  // the pod's hostname is set once, on the container that owns the network namespace
  if (isOwner) spec.hostname = `sandnode-compat-${host.runId}`;
  if (priv) spec.privilege = priv;
  if (layout.shareProcessNamespace && !isOwner) spec.pidMode = `container:${ownerName}`;
  if (probe?.length) spec.startupProbe = { command: probe, periodMs: PROBE_PERIOD_MS, timeoutMs: Math.min(probeMs, PROBE_TIMEOUT_MS) };
  return spec;
}

/** podContainer returns the manifest's container c; throws naming it when the pod has none. */
export function podContainer(layout: PodLayout, c: string): K8sContainer {
  const s = layout.containers.find((x) => x.name === c);
  if (!s) throw new Error(`no container ${c} in the manifest`);
  return s;
}
