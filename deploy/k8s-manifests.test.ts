/**
 * deploy/k8s and deploy/prestop.sh (ARCHITECTURE.md sections 4 "Drain" and 6).
 *
 * Every manifest is validated against the Kubernetes API schemas with kubernetes-models
 * (validators generated from the Kubernetes OpenAPI spec). There is no maintained kustomize
 * implementation on npm, so render() below implements the subset of kustomization.yaml the
 * manifests use (resources, images, patches by path + target with a strategic merge keyed on
 * `name`) and fails on any other key, so a feature it does not model cannot slip in unnoticed.
 * The OpenAPI schemas do not forbid unknown fields (the API server's strict field validation
 * does), so a misspelled optional field is not caught here; `kubectl apply --dry-run=server -k`
 * against a cluster is the check for that.
 *
 * Then the invariants the architecture demands and the daemons' own config loaders on the
 * mounted config files (the probe and pre-stop hooks: hooks.test.ts).
 */
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseAllDocuments, parse as parseYaml } from 'yaml';
import { Namespace } from 'kubernetes-models/v1/Namespace';
import { ServiceAccount } from 'kubernetes-models/v1/ServiceAccount';
import { ConfigMap } from 'kubernetes-models/v1/ConfigMap';
import { DaemonSet } from 'kubernetes-models/apps/v1/DaemonSet';
import { NetworkPolicy } from 'kubernetes-models/networking.k8s.io/v1/NetworkPolicy';
import { PodMonitor } from '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PodMonitor';
import type { IContainer } from 'kubernetes-models/v1/Container';
import type { IPodSpec } from 'kubernetes-models/v1/PodSpec';
import { configSchema as ublkConfigSchema, loadUblkConfig } from '@sandnode/ublk-manager';
import { configSchema as vmmConfigSchema, loadVmmConfig } from '@sandnode/vmm-supervisor';
import { configSchema as serverConfigSchema, loadServerConfig } from '@sandnode/server';

const ROOT = path.resolve(__dirname, '..');
const K8S = path.join(ROOT, 'deploy/k8s');

type Obj = Record<string, unknown>;
interface Resource {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string };
  [k: string]: unknown;
}

// ---------------------------------------------------------------- rendering (kustomize subset)

const SUPPORTED_KUSTOMIZATION_KEYS = new Set(['apiVersion', 'kind', 'resources', 'images', 'patches']);

function isObj(v: unknown): v is Obj {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** strategicMerge: maps merge, lists of named objects merge by name, other lists are replaced, null deletes. */
function strategicMerge(base: unknown, patch: unknown): unknown {
  if (isObj(base) && isObj(patch)) {
    const out: Obj = { ...base };
    for (const [k, v] of Object.entries(patch)) {
      if (v === null) delete out[k];
      else out[k] = k in base ? strategicMerge(base[k], v) : v;
    }
    return out;
  }
  if (Array.isArray(base) && Array.isArray(patch) && [...base, ...patch].every((e) => isObj(e) && typeof e.name === 'string')) {
    const out = base.map((e) => ({ ...(e as Obj) }));
    for (const p of patch as Obj[]) {
      const i = out.findIndex((e) => e.name === p.name);
      if (i >= 0) out[i] = strategicMerge(out[i], p) as Obj;
      else out.push(p);
    }
    return out;
  }
  return patch;
}

function podSpecOf(r: Resource): IPodSpec | undefined {
  const spec = r.spec as { template?: { spec?: IPodSpec } } | undefined;
  return spec?.template?.spec;
}

function render(dir: string): Resource[] {
  const k = parseYaml(readFileSync(path.join(dir, 'kustomization.yaml'), 'utf8')) as Obj;
  for (const key of Object.keys(k)) {
    if (!SUPPORTED_KUSTOMIZATION_KEYS.has(key)) throw new Error(`${dir}/kustomization.yaml: key "${key}" is not modelled by this test's renderer`);
  }
  expect(k.apiVersion).toBe('kustomize.config.k8s.io/v1beta1');
  expect(k.kind).toBe('Kustomization');
  let out: Resource[] = [];
  for (const rel of (k.resources as string[] | undefined) ?? []) {
    const p = path.resolve(dir, rel);
    if (statSync(p).isDirectory()) out.push(...render(p));
    else {
      for (const doc of parseAllDocuments(readFileSync(p, 'utf8'))) {
        if (doc.errors.length) throw new Error(`${p}: ${doc.errors[0]!.message}`);
        const r = doc.toJS() as Resource | null;
        if (r) out.push(r);
      }
    }
  }
  for (const patch of (k.patches as { path?: string; target?: { kind?: string; name?: string } }[] | undefined) ?? []) {
    expect(patch.path).toBeDefined(); // inline patches are not modelled
    const body = parseYaml(readFileSync(path.resolve(dir, patch.path!), 'utf8')) as Obj;
    const targets = out.filter((r) => (!patch.target?.kind || r.kind === patch.target.kind) && (!patch.target?.name || r.metadata.name === patch.target.name));
    if (targets.length === 0) throw new Error(`${dir}: patch ${patch.path} matches no resource`);
    out = out.map((r) => (targets.includes(r) ? (strategicMerge(r, body) as Resource) : r));
  }
  for (const img of (k.images as { name: string; newName?: string; newTag?: string; digest?: string }[] | undefined) ?? []) {
    let used = false;
    for (const r of out) {
      const spec = podSpecOf(r);
      for (const c of [...(spec?.containers ?? []), ...(spec?.initContainers ?? [])]) {
        const name = (c.image ?? '').replace(/[@:][^/]*$/, '');
        if (name !== img.name) continue;
        used = true;
        const tag = img.digest ? `@${img.digest}` : img.newTag ? `:${img.newTag}` : (c.image ?? '').slice(name.length);
        c.image = `${img.newName ?? name}${tag}`;
      }
    }
    if (!used) throw new Error(`${dir}: images entry ${img.name} matches no container`);
  }
  return out;
}

// ---------------------------------------------------------------- schema validation

const MODELS: Record<string, new (data: never) => { validate(): void }> = {
  'v1/Namespace': Namespace,
  'v1/ServiceAccount': ServiceAccount,
  'v1/ConfigMap': ConfigMap,
  'apps/v1/DaemonSet': DaemonSet,
  'networking.k8s.io/v1/NetworkPolicy': NetworkPolicy,
  // the prometheus-operator CRD's schema (@kubernetes-models/prometheus-operator)
  'monitoring.coreos.com/v1/PodMonitor': PodMonitor,
};

function validateResource(r: Resource): void {
  const Model = MODELS[`${r.apiVersion}/${r.kind}`];
  if (!Model) throw new Error(`${r.kind} ${r.metadata?.name}: no schema model registered for ${r.apiVersion}/${r.kind}`);
  new Model(r as never).validate();
}

// ---------------------------------------------------------------- helpers

const RENDERS: Record<string, () => Resource[]> = {
  base: () => render(path.join(K8S, 'base')),
  'overlays/example': () => render(path.join(K8S, 'overlays/example')),
  'overlays/monitoring': () => render(path.join(K8S, 'overlays/monitoring')),
};

function daemonSet(rs: Resource[]): { ds: Resource; pod: IPodSpec; byName: Map<string, IContainer> } {
  const all = rs.filter((r) => r.kind === 'DaemonSet');
  expect(all).toHaveLength(1);
  const ds = all[0]!;
  const pod = podSpecOf(ds)!;
  return { ds, pod, byName: new Map(pod.containers.map((c) => [c.name, c])) };
}

function envOf(c: IContainer, name: string): string | undefined {
  return c.env?.find((e) => e.name === name)?.value;
}

const CONTAINERS = ['vmm', 'server-a', 'server-b', 'ublk-a', 'ublk-b'];
const SERVER_SLOTS = ['server-a', 'server-b'];
/** The servers' TLS files (server keys tlsCa/tlsCert/tlsKey), set by env: see the daemon set. */
const TLS_ENV = ['SANDNODE_SERVER_TLS_CA', 'SANDNODE_SERVER_TLS_CERT', 'SANDNODE_SERVER_TLS_KEY'];
/**
 * Each container's /metrics: the env var of its daemon's metricsListen key, the port and its
 * name (declared once for the servers: the active one serves it, it moves with the lease).
 */
const METRICS: Record<string, { env: string; port: number; name?: string }> = {
  vmm: { env: 'SANDNODE_VMM_SUPERVISOR_METRICS_LISTEN', port: 9465, name: 'metrics-vmm' },
  'server-a': { env: 'SANDNODE_SERVER_METRICS_LISTEN', port: 9464, name: 'metrics-server' },
  'server-b': { env: 'SANDNODE_SERVER_METRICS_LISTEN', port: 9464 },
  'ublk-a': { env: 'SANDNODE_UBLK_MANAGER_METRICS_LISTEN', port: 9466, name: 'metrics-ublk-a' },
  'ublk-b': { env: 'SANDNODE_UBLK_MANAGER_METRICS_LISTEN', port: 9467, name: 'metrics-ublk-b' },
};

function configMapData(rs: Resource[]): Record<string, string> {
  const cm = rs.find((r) => r.kind === 'ConfigMap' && r.metadata.name === 'sandnode-config');
  expect(cm).toBeDefined();
  return cm!.data as Record<string, string>;
}

function configPathOf(c: IContainer): string {
  const argv = [...(c.command ?? []), ...(c.args ?? [])].join(' ');
  const m = /--config[ =](\S+)/.exec(argv);
  if (!m) throw new Error(`container ${c.name}: no --config FILE in its command`);
  return m[1]!;
}

// ---------------------------------------------------------------- manifests

describe.each(Object.keys(RENDERS))('deploy/k8s/%s', (which) => {
  const rs = RENDERS[which]!();

  test('renders the namespace, service account, config map, daemon set and network policy (monitoring: + PodMonitor, metrics policy)', () => {
    expect(rs.map((r) => `${r.kind}/${r.metadata.name}`).sort()).toEqual(
      [
        'ConfigMap/sandnode-config',
        'DaemonSet/sandnode',
        'Namespace/sandnode',
        'NetworkPolicy/sandnode-api',
        ...(which === 'overlays/monitoring' ? ['NetworkPolicy/sandnode-metrics', 'PodMonitor/sandnode'] : []),
        'ServiceAccount/sandnode',
      ].sort(),
    );
    for (const r of rs) if (r.kind !== 'Namespace') expect(r.metadata.namespace).toBe('sandnode');
  });

  test.each(rs.map((r) => [`${r.kind}/${r.metadata.name}`, r] as const))('%s is valid against the Kubernetes API schema', (_n, r) => {
    expect(() => validateResource(r)).not.toThrow();
  });

  test('pod layout: the five containers, one PID namespace, OnDelete', () => {
    const { ds, pod } = daemonSet(rs);
    expect(pod.containers.map((c) => c.name)).toEqual(CONTAINERS);
    expect(pod.shareProcessNamespace).toBe(true);
    expect((ds.spec as { updateStrategy: { type: string } }).updateStrategy.type).toBe('OnDelete');
    const selector = (ds.spec as { selector: { matchLabels: Record<string, string> } }).selector.matchLabels;
    const labels = (ds.spec as { template: { metadata: { labels: Record<string, string> } } }).template.metadata.labels;
    for (const [k, v] of Object.entries(selector)) expect(labels[k]).toBe(v);
  });

  test('vmm: no liveness probe, privileged, oom_score_adj -1000 before exec', () => {
    const vmm = daemonSet(rs).byName.get('vmm')!;
    expect(vmm.livenessProbe).toBeUndefined();
    expect(vmm.securityContext?.privileged).toBe(true);
    expect(vmm.command?.join(' ')).toMatch(/echo -1000 > \/proc\/self\/oom_score_adj && exec node \/app\/services\/vmm-supervisor\/dist\/main\.js/);
    expect(vmm.resources?.limits?.memory).toBeUndefined(); // a limit would OOM-kill its VMs with it
  });

  test('volumes: state on a hostPath, runtime dir on an emptyDir (Bidirectional where privileged), host /dev', () => {
    const { pod, byName } = daemonSet(rs);
    const vol = new Map((pod.volumes ?? []).map((v) => [v.name, v]));
    expect(vol.get('state')?.hostPath).toEqual({ path: '/var/lib/sandnode', type: 'DirectoryOrCreate' });
    expect(vol.get('run')?.emptyDir).toBeDefined();
    expect(vol.get('dev')?.hostPath?.path).toBe('/dev');
    expect(vol.get('config')?.configMap?.name).toBe('sandnode-config');
    for (const c of byName.values()) {
      const mounts = new Map((c.volumeMounts ?? []).map((m) => [m.name, m]));
      expect(mounts.get('state')?.mountPath).toBe('/var/lib/sandnode');
      const run = mounts.get('run');
      expect(run?.mountPath).toBe('/run/sandnode');
      // the API allows Bidirectional only in privileged containers
      if (c.securityContext?.privileged) expect(run?.mountPropagation).toBe('Bidirectional');
      else expect(run?.mountPropagation).toBe('HostToContainer');
      for (const m of c.volumeMounts ?? []) if (m.mountPropagation === 'Bidirectional') expect(c.securityContext?.privileged).toBe(true);
    }
    for (const name of ['vmm', 'ublk-a', 'ublk-b']) {
      expect(byName.get(name)!.securityContext?.privileged).toBe(true);
      expect(byName.get(name)!.volumeMounts?.find((m) => m.name === 'dev')?.mountPath).toBe('/dev');
    }
  });

  test('settings come from mounted config files, not env vars', () => {
    const { byName } = daemonSet(rs);
    const data = configMapData(rs);
    for (const c of byName.values()) {
      const mount = c.volumeMounts?.find((m) => m.name === 'config');
      expect(mount).toMatchObject({ mountPath: '/etc/sandnode', readOnly: true });
      expect(mount?.subPath).toBeUndefined(); // subPath mounts never see ConfigMap updates
      const file = configPathOf(c);
      expect(path.dirname(file)).toBe('/etc/sandnode');
      expect(data[path.basename(file)]).toBeDefined();
      // the only env vars are the pre-stop hook's, never a daemon key (SANDNODE_<SERVICE>_*),
      // but the servers' TLS file paths (fixed for the pod's life; the config files must stay
      // loadable by the previous release during a rollout, which refuses unknown keys)
      // and the metrics listener (its port is declared in the pod spec; a 0.2.0 vmm-supervisor refuses the key in its file)
      const allowed = [
        'SANDNODE_PRESTOP_DEADLINE_S',
        'SANDNODE_GRACE_PERIOD_S',
        'SANDNODE_RUN_DIR',
        'SANDNODE_STATE_DIR',
        'SANDNODE_NODE_ID',
        METRICS[c.name]!.env,
        ...(SERVER_SLOTS.includes(c.name) ? TLS_ENV : []),
      ];
      for (const e of c.env ?? []) expect(allowed).toContain(e.name);
      expect(c.envFrom).toBeUndefined();
    }
    expect(configPathOf(byName.get('server-a')!)).toBe('/etc/sandnode/server-a.json');
    expect(configPathOf(byName.get('server-b')!)).toBe('/etc/sandnode/server-b.json');
    expect(configPathOf(byName.get('ublk-a')!)).toBe('/etc/sandnode/ublk-manager-a.json');
    expect(configPathOf(byName.get('ublk-b')!)).toBe('/etc/sandnode/ublk-manager-b.json');
  });

  test("node identity: every daemon takes the Kubernetes node's name (downward API), never the pod's", () => {
    const { byName } = daemonSet(rs);
    for (const c of byName.values()) {
      const e = c.env?.find((v) => v.name === 'SANDNODE_NODE_ID');
      expect(e?.value).toBeUndefined();
      expect(e?.valueFrom?.fieldRef?.fieldPath).toBe('spec.nodeName');
    }
  });

  test('pre-stop: deadline below terminationGracePeriodSeconds; servers drain, the others wait', () => {
    const { pod, byName } = daemonSet(rs);
    const grace = pod.terminationGracePeriodSeconds!;
    expect(grace).toBeGreaterThan(0);
    for (const c of byName.values()) {
      const cmd = c.lifecycle?.preStop?.exec?.command ?? [];
      expect(cmd[0]).toBe('/app/deploy/prestop.sh');
      expect(cmd[1]).toBe(SERVER_SLOTS.includes(c.name) ? 'drain' : 'wait');
      const deadline = Number(envOf(c, 'SANDNODE_PRESTOP_DEADLINE_S'));
      expect(Number(envOf(c, 'SANDNODE_GRACE_PERIOD_S'))).toBe(grace);
      expect(deadline).toBeGreaterThan(0);
      expect(deadline).toBeLessThan(grace);
      expect(envOf(c, 'SANDNODE_RUN_DIR')).toBe('/run/sandnode');
      expect(envOf(c, 'SANDNODE_STATE_DIR')).toBe('/var/lib/sandnode');
    }
  });

  test('probes: exec health probes on each daemon own socket, readiness + startup, no liveness', () => {
    const { byName } = daemonSet(rs);
    const socket: Record<string, string> = {
      vmm: 'unix:///run/sandnode/vmm-supervisor.sock',
      'server-a': 'unix:///run/sandnode/server-a-admin.sock',
      'server-b': 'unix:///run/sandnode/server-b-admin.sock',
      'ublk-a': 'unix:///run/sandnode/ublk-manager-a.sock',
      'ublk-b': 'unix:///run/sandnode/ublk-manager-b.sock',
    };
    for (const c of byName.values()) {
      expect(c.livenessProbe).toBeUndefined();
      for (const p of [c.readinessProbe, c.startupProbe]) expect(p?.exec?.command).toEqual(['node', '/app/deploy/health-probe.js', socket[c.name]]);
    }
  });

  test('the public gRPC port is declared once and matches the servers listen key', () => {
    const { pod } = daemonSet(rs);
    const ports = pod.containers.flatMap((c) => (c.ports ?? []).map((p) => ({ c: c.name, ...p }))).filter((p) => !p.name?.startsWith('metrics-'));
    expect(ports).toEqual([{ c: 'server-a', name: 'grpc', containerPort: 7070, protocol: 'TCP' }]);
    const data = configMapData(rs);
    for (const f of ['server-a.json', 'server-b.json']) expect((JSON.parse(data[f]!) as { listen: string }).listen).toBe('0.0.0.0:7070');
  });

  test('API access (issue 10 §4): the TCP port needs mutual TLS from the mounted Secret, and only labelled client pods may reach it', () => {
    const { pod, byName } = daemonSet(rs);
    const data = configMapData(rs);
    const vol = (pod.volumes ?? []).find((v) => v.name === 'api-tls');
    expect(vol?.secret).toMatchObject({ secretName: 'sandnode-api-tls', defaultMode: 0o400, optional: true });
    for (const slot of ['a', 'b']) {
      const c = byName.get(`server-${slot}`)!;
      const mount = c.volumeMounts?.find((m) => m.name === 'api-tls');
      expect(mount).toMatchObject({ mountPath: '/etc/sandnode-tls', readOnly: true });
      expect(TLS_ENV.map((k) => envOf(c, k))).toEqual(['/etc/sandnode-tls/ca.crt', '/etc/sandnode-tls/tls.crt', '/etc/sandnode-tls/tls.key']);
      // not in the config file: the previous release refuses keys it does not know
      expect(Object.keys(JSON.parse(data[`server-${slot}.json`]!) as object).filter((k) => k.startsWith('tls'))).toEqual([]);
    }
    // no other container sees the key
    for (const c of byName.values()) if (!SERVER_SLOTS.includes(c.name)) expect(c.volumeMounts?.some((m) => m.name === 'api-tls')).toBe(false);
    const nps = rs.filter((r) => r.kind === 'NetworkPolicy' && r.metadata.name === 'sandnode-api');
    expect(nps).toHaveLength(1);
    const np = nps[0]!.spec as { podSelector: { matchLabels: Record<string, string> }; policyTypes: string[]; ingress: { from: unknown[]; ports: unknown[] }[] };
    const labels = (daemonSet(rs).ds.spec as { template: { metadata: { labels: Record<string, string> } } }).template.metadata.labels;
    for (const [k, v] of Object.entries(np.podSelector.matchLabels)) expect(labels[k]).toBe(v);
    expect(np.policyTypes).toEqual(['Ingress']);
    expect(np.ingress).toEqual([{ from: [{ namespaceSelector: {}, podSelector: { matchLabels: { 'sandnode.io/api-client': 'true' } } }], ports: [{ port: 7070, protocol: 'TCP' }] }]);
  });

  test('seccomp RuntimeDefault for the pod; the unprivileged servers drop every capability but the file and signal ones', () => {
    const { pod, byName } = daemonSet(rs);
    expect(pod.securityContext?.seccompProfile).toEqual({ type: 'RuntimeDefault' });
    for (const name of SERVER_SLOTS) {
      const sc = byName.get(name)!.securityContext!;
      expect(sc).toMatchObject({ privileged: false, allowPrivilegeEscalation: false, seccompProfile: { type: 'RuntimeDefault' } });
      expect(sc.capabilities?.drop).toEqual(['ALL']);
      expect(sc.capabilities?.add).toEqual(['CHOWN', 'DAC_OVERRIDE', 'FOWNER', 'FSETID', 'KILL']);
    }
  });

  test('each slot config names its slot and its own sockets', () => {
    const data = configMapData(rs);
    const cfg = (f: string) => JSON.parse(data[f]!) as Record<string, unknown>;
    for (const slot of ['a', 'b']) {
      expect(cfg(`server-${slot}.json`).slot).toBe(slot);
      expect(cfg(`ublk-manager-${slot}.json`)).toMatchObject({ slot, listen: `unix:///run/sandnode/ublk-manager-${slot}.sock` });
    }
    for (const v of Object.values(data)) expect(JSON.parse(v)).toMatchObject({ version: 1, stateDir: '/var/lib/sandnode', runDir: '/run/sandnode' });
  });

  test('a metrics port per component: on the pod IP by its env var, declared with a unique name, none shared by two daemons that run at once', () => {
    const { byName } = daemonSet(rs);
    const declared: { c: string; name: string; port: number }[] = [];
    for (const c of byName.values()) {
      const m = METRICS[c.name]!;
      expect(envOf(c, m.env)).toBe(`0.0.0.0:${m.port}`);
      const ps = (c.ports ?? []).filter((p) => p.name?.startsWith('metrics-'));
      expect(ps).toEqual(m.name ? [{ name: m.name, containerPort: m.port, protocol: 'TCP' }] : []);
      for (const p of ps) declared.push({ c: c.name, name: p.name!, port: p.containerPort });
    }
    // port names are at most 15 characters (IANA_SVC_NAME) and unique in the pod
    for (const d of declared) expect(d.name.length).toBeLessThanOrEqual(15);
    expect(new Set(declared.map((d) => d.name)).size).toBe(declared.length);
    expect(new Set(declared.map((d) => d.port)).size).toBe(declared.length);
    // the only shared port is the servers', which only the active slot serves
    expect(new Set(Object.values(METRICS).map((m) => m.port)).size).toBe(Object.keys(METRICS).length - 1);
    // the config files leave the key to the env var (no file value a 0.2.0 daemon could refuse)
    for (const v of Object.values(configMapData(rs))) expect(Object.keys(JSON.parse(v) as object)).not.toContain('metricsListen');
  });

  test('scheduling: system-node-critical, tolerates every taint (one pod on every node, control plane included)', () => {
    const { pod } = daemonSet(rs);
    expect(pod.priorityClassName).toBe('system-node-critical');
    // an empty key with operator Exists matches every taint of every effect
    expect(pod.tolerations).toEqual([{ operator: 'Exists' }]);
    expect(pod.nodeSelector).toBeUndefined();
    expect(pod.affinity).toBeUndefined();
  });

  if (which === 'overlays/monitoring') {
    test('PodMonitor scrapes every declared metrics port of the pod; the metrics policy admits exactly those ports', () => {
      const { ds, pod } = daemonSet(rs);
      const pm = rs.find((r) => r.kind === 'PodMonitor')!;
      const spec = pm.spec as { selector: { matchLabels: Record<string, string> }; podMetricsEndpoints: { port: string; path: string; relabelings?: unknown[] }[] };
      const labels = (ds.spec as { template: { metadata: { labels: Record<string, string> } } }).template.metadata.labels;
      for (const [k, v] of Object.entries(spec.selector.matchLabels)) expect(labels[k]).toBe(v);
      const metricsPorts = pod.containers.flatMap((c) => c.ports ?? []).filter((p) => p.name?.startsWith('metrics-'));
      expect(spec.podMetricsEndpoints.map((e) => e.port).sort()).toEqual(metricsPorts.map((p) => p.name).sort());
      for (const e of spec.podMetricsEndpoints) {
        expect(e.path).toBe('/metrics');
        expect(e.relabelings).toContainEqual({ sourceLabels: ['__meta_kubernetes_pod_node_name'], targetLabel: 'node' });
      }
      const np = rs.find((r) => r.kind === 'NetworkPolicy' && r.metadata.name === 'sandnode-metrics')!.spec as {
        podSelector: { matchLabels: Record<string, string> };
        ingress: { ports: { port: number; protocol: string }[] }[];
      };
      for (const [k, v] of Object.entries(np.podSelector.matchLabels)) expect(labels[k]).toBe(v);
      expect(np.ingress.flatMap((i) => i.ports.map((p) => p.port)).sort()).toEqual(metricsPorts.map((p) => p.containerPort).sort());
      expect(np.ingress.flatMap((i) => i.ports.map((p) => p.port))).not.toContain(7070);
    });
  }

  if (which === 'overlays/example') {
    test('the overlay sets a registry image with a tag on every container and the longer deadline', () => {
      const { pod, byName } = daemonSet(rs);
      for (const c of byName.values()) expect(c.image).toBe('registry.example.com/sandnode/sandnode:0.0.1');
      expect(pod.terminationGracePeriodSeconds).toBe(90);
      for (const c of byName.values()) expect(envOf(c, 'SANDNODE_PRESTOP_DEADLINE_S')).toBe('75');
      // the patch merged env by name: the run/state dirs from the base are still there
      for (const c of byName.values()) expect(envOf(c, 'SANDNODE_RUN_DIR')).toBe('/run/sandnode');
    });
  } else {
    test('the base uses one placeholder image per container, so a slot can be moved alone', () => {
      const { byName } = daemonSet(rs);
      expect([...byName.values()].map((c) => c.image)).toEqual(['sandnode-vmm', 'sandnode-server-a', 'sandnode-server-b', 'sandnode-ublk-a', 'sandnode-ublk-b']);
    });
  }
});

describe('schema validation is live', () => {
  test('a wrong type in the daemon set is rejected', () => {
    const ds = structuredClone(daemonSet(RENDERS.base!()).ds);
    (podSpecOf(ds)!.terminationGracePeriodSeconds as unknown) = 'sixty';
    expect(() => validateResource(ds)).toThrow(/terminationGracePeriodSeconds/);
  });
  test('a PodMonitor of the wrong shape is rejected (the CRD schema is live too)', () => {
    const pm = structuredClone(RENDERS['overlays/monitoring']!().find((r) => r.kind === 'PodMonitor')!);
    (pm.spec as { podMetricsEndpoints: unknown }).podMetricsEndpoints = 'metrics-vmm';
    expect(() => validateResource(pm)).toThrow(/podMetricsEndpoints/);
  });
  test('a missing required field is rejected', () => {
    const ds = structuredClone(daemonSet(RENDERS.base!()).ds);
    delete (podSpecOf(ds)!.containers[0] as Partial<IContainer>).name;
    expect(() => validateResource(ds)).toThrow(/name/);
  });
});

// ---------------------------------------------------------------- config files vs the daemons

/**
 * Keys the config files carry for the live-upgrade release before every daemon's config schema
 * has them (server `slot`, `role`; ublk-manager `slot`). A key is stripped for the loader only
 * while the daemon's schema lacks it; once it lands the file is loaded as it is.
 */
const PENDING_KEYS: Record<string, string[]> = { server: [], 'ublk-manager': ['slot'], 'vmm-supervisor': [] };

describe('config files load with the daemons own config loaders', () => {
  const data = configMapData(RENDERS['overlays/example']!());
  let dir: string;
  beforeAll(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-k8s-'));
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  function write(file: string, service: string, shape: Record<string, unknown>): string {
    const cfg = JSON.parse(data[file]!) as Record<string, unknown>;
    for (const k of PENDING_KEYS[service]!) if (!(k in shape)) delete cfg[k];
    const p = path.join(dir, file);
    writeFileSync(p, JSON.stringify(cfg));
    return p;
  }

  test.each(['a', 'b'])('server-%s.json (with the container TLS env; without it the pod-network listener is refused)', (slot) => {
    const file = write(`server-${slot}.json`, 'server', serverConfigSchema.shape);
    const c = daemonSet(RENDERS['overlays/example']!()).byName.get(`server-${slot}`)!;
    const env = Object.fromEntries(TLS_ENV.map((k) => [k, envOf(c, k)!]));
    expect(loadServerConfig({ file, env })).toMatchObject({
      stateDir: '/var/lib/sandnode',
      runDir: '/run/sandnode',
      listen: '0.0.0.0:7070',
      tlsCert: '/etc/sandnode-tls/tls.crt',
      vmmAddress: 'unix:///run/sandnode/vmm-supervisor.sock',
    });
    expect(() => loadServerConfig({ file, env: {} })).toThrow(/^listen: 0.0.0.0:7070 is not a loopback address/);
  });
  test.each(['a', 'b'])('ublk-manager-%s.json', (slot) => {
    const c = loadUblkConfig({ file: write(`ublk-manager-${slot}.json`, 'ublk-manager', ublkConfigSchema.shape), env: {} });
    expect(c).toMatchObject({ stateDir: '/var/lib/sandnode', listen: `unix:///run/sandnode/ublk-manager-${slot}.sock`, driver: 'loop' });
  });
  test('vmm-supervisor.json', () => {
    const c = loadVmmConfig({ file: write('vmm-supervisor.json', 'vmm-supervisor', vmmConfigSchema.shape), env: {} });
    expect(c).toMatchObject({ stateDir: '/var/lib/sandnode', runDir: '/run/sandnode', listen: 'unix:///run/sandnode/vmm-supervisor.sock', driver: 'runc' });
  });
});
