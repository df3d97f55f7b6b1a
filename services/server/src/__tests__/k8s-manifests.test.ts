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
 * Then the invariants the architecture demands, the daemons' own config loaders on the
 * mounted config files, deploy/health-probe.js against a real gRPC health server, and
 * prestop.sh with a fake CLI.
 */
import { spawnSync, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync, existsSync, utimesSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseAllDocuments, parse as parseYaml } from 'yaml';
import { Namespace } from 'kubernetes-models/v1/Namespace';
import { ServiceAccount } from 'kubernetes-models/v1/ServiceAccount';
import { ConfigMap } from 'kubernetes-models/v1/ConfigMap';
import { DaemonSet } from 'kubernetes-models/apps/v1/DaemonSet';
import type { IContainer } from 'kubernetes-models/v1/Container';
import type { IPodSpec } from 'kubernetes-models/v1/PodSpec';
import { createServer } from 'nice-grpc';
import { HealthDefinition, HealthServiceImpl, HealthState } from 'nice-grpc-server-health';
import { configSchema as ublkConfigSchema, loadUblkConfig } from '@sandnode/ublk-manager';
import { configSchema as vmmConfigSchema, loadVmmConfig } from '@sandnode/vmm-supervisor';
import { resolveServerConfig, serverConfigSchema } from '../config';

const ROOT = path.resolve(__dirname, '../../../..');
const K8S = path.join(ROOT, 'deploy/k8s');
const PRESTOP = path.join(ROOT, 'deploy/prestop.sh');
const PROBE = path.join(ROOT, 'deploy/health-probe.js');

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

  test('renders the namespace, service account, config map and daemon set', () => {
    expect(rs.map((r) => `${r.kind}/${r.metadata.name}`).sort()).toEqual(['ConfigMap/sandnode-config', 'DaemonSet/sandnode', 'Namespace/sandnode', 'ServiceAccount/sandnode']);
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
      // the only env vars are the pre-stop hook's, never a daemon key (SANDNODE_<SERVICE>_*)
      for (const e of c.env ?? []) expect(['SANDNODE_PRESTOP_DEADLINE_S', 'SANDNODE_GRACE_PERIOD_S', 'SANDNODE_RUN_DIR', 'SANDNODE_STATE_DIR']).toContain(e.name);
      expect(c.envFrom).toBeUndefined();
    }
    expect(configPathOf(byName.get('server-a')!)).toBe('/etc/sandnode/server-a.json');
    expect(configPathOf(byName.get('server-b')!)).toBe('/etc/sandnode/server-b.json');
    expect(configPathOf(byName.get('ublk-a')!)).toBe('/etc/sandnode/ublk-manager-a.json');
    expect(configPathOf(byName.get('ublk-b')!)).toBe('/etc/sandnode/ublk-manager-b.json');
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
    const ports = pod.containers.flatMap((c) => (c.ports ?? []).map((p) => ({ c: c.name, ...p })));
    expect(ports).toEqual([{ c: 'server-a', name: 'grpc', containerPort: 7070, protocol: 'TCP' }]);
    const data = configMapData(rs);
    for (const f of ['server-a.json', 'server-b.json']) expect((JSON.parse(data[f]!) as { listen: string }).listen).toBe('0.0.0.0:7070');
  });

  test('each slot config names its slot and its own sockets', () => {
    const data = configMapData(rs);
    const cfg = (f: string) => JSON.parse(data[f]!) as Record<string, unknown>;
    for (const slot of ['a', 'b']) {
      expect(cfg(`server-${slot}.json`).slot).toBe(slot);
      expect(cfg(`ublk-manager-${slot}.json`)).toMatchObject({ slot, listen: `unix:///run/sandnode/ublk-manager-${slot}.sock` });
    }
    for (const [f, v] of Object.entries(data)) expect(JSON.parse(v)).toMatchObject({ version: 1, stateDir: '/var/lib/sandnode', runDir: '/run/sandnode' });
  });

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

  test.each(['a', 'b'])('server-%s.json', (slot) => {
    const c = resolveServerConfig(write(`server-${slot}.json`, 'server', serverConfigSchema.shape));
    expect(c).toMatchObject({ stateDir: '/var/lib/sandnode', runDir: '/run/sandnode', listen: '0.0.0.0:7070', vmmAddress: 'unix:///run/sandnode/vmm-supervisor.sock' });
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

// ---------------------------------------------------------------- deploy/health-probe.js

function runAsync(cmd: string, args: string[], env: NodeJS.ProcessEnv = {}): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const p = spawn(cmd, args, { env: { PATH: process.env.PATH, ...env } });
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    p.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    p.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

describe('deploy/health-probe.js', () => {
  let dir: string;
  beforeAll(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-probe-'));
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  test('exits 0 when SERVING, 1 when NOT_SERVING, 1 when nothing listens', async () => {
    const health = HealthState();
    const server = createServer();
    server.add(HealthDefinition, HealthServiceImpl(health));
    const address = `unix://${path.join(dir, 'd.sock')}`;
    await server.listen(address);
    try {
      health.setStatus('healthy');
      expect((await runAsync('node', [PROBE, address])).code).toBe(0);
      health.setStatus('unhealthy');
      const r = await runAsync('node', [PROBE, address]);
      expect(r.code).toBe(1);
      expect(r.stderr).toMatch(/not serving/);
    } finally {
      await server.shutdown();
    }
    const gone = await runAsync('node', [PROBE, `unix://${path.join(dir, 'missing.sock')}`, '--timeout-ms', '1000']);
    expect(gone.code).toBe(1);
    expect(gone.stderr).toMatch(/missing\.sock/);
  });
});

// ---------------------------------------------------------------- deploy/prestop.sh

describe('deploy/prestop.sh', () => {
  let dir: string;
  let fakeCli: string;
  beforeAll(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-prestop-'));
    // a stand-in for `sandnode drain`: FAKE_DRAIN=ok|fail|hang|crash; records its argv
    fakeCli = path.join(dir, 'fake-cli.js');
    writeFileSync(
      fakeCli,
      `const fs = require('fs');
fs.writeFileSync(process.env.FAKE_ARGV, JSON.stringify(process.argv.slice(2)));
const mode = process.env.FAKE_DRAIN;
if (mode === 'hang') setInterval(() => {}, 1000);
else if (mode === 'crash') { process.stderr.write('sandnode: UNAVAILABLE: no server\\n'); process.exit(1); }
else process.stdout.write(JSON.stringify({
  sandboxes: [
    { sandbox_id: 'sb-1', outcome: 'DRAIN_OUTCOME_PRESERVED', resume_method: 'cold-start' },
    ...(mode === 'fail' ? [{ sandbox_id: 'sb-2', outcome: 'DRAIN_OUTCOME_FAILED', error: 'pause timed out' }] : []),
  ],
  duration_ms: 12, device_manager_stopped: true }));
`,
    );
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  function prestop(env: Record<string, string>, mode = 'drain') {
    const run = mkdtempSync(path.join(dir, 'run-'));
    const env2 = { PATH: process.env.PATH, SANDNODE_RUN_DIR: path.join(run, 'run'), SANDNODE_STATE_DIR: path.join(run, 'state'), SANDNODE_CLI: `node ${fakeCli}`, FAKE_ARGV: path.join(run, 'argv.json'), ...env };
    const t0 = Date.now();
    const r = spawnSync('bash', [PRESTOP, mode], { env: env2, encoding: 'utf8', timeout: 30_000 });
    return { ...r, ms: Date.now() - t0, run, argv: existsSync(env2.FAKE_ARGV) ? (JSON.parse(readFileSync(env2.FAKE_ARGV, 'utf8')) as string[]) : undefined };
  }

  test.each([
    ['45', '45'],
    ['60', '45'],
  ])('refuses to start (exit 2, no drain) when the deadline %s >= the grace period %s', (deadline, grace) => {
    const r = prestop({ SANDNODE_PRESTOP_DEADLINE_S: deadline, SANDNODE_GRACE_PERIOD_S: grace });
    expect(r.status).toBe(2);
    expect(r.stderr).toMatch(/refusing to start: SANDNODE_PRESTOP_DEADLINE_S=\d+ must be below SANDNODE_GRACE_PERIOD_S=\d+/);
    expect(r.argv).toBeUndefined();
  });

  test('refuses the default deadline (45 s) against a shorter grace period, and non-numbers', () => {
    expect(prestop({ SANDNODE_GRACE_PERIOD_S: '30' }).status).toBe(2);
    expect(prestop({ SANDNODE_PRESTOP_DEADLINE_S: '4x' }).stderr).toMatch(/SANDNODE_PRESTOP_DEADLINE_S=4x is not a whole number/);
  });

  test('drains with a deadline below its own and reports what was preserved', () => {
    const r = prestop({ SANDNODE_PRESTOP_DEADLINE_S: '20', SANDNODE_GRACE_PERIOD_S: '30', FAKE_DRAIN: 'ok' });
    expect(r.status).toBe(0);
    expect(r.argv?.slice(0, 2)).toEqual(['drain', '--deadline-ms']);
    const ms = Number(r.argv?.[2]);
    expect(ms).toBeGreaterThan(10_000);
    expect(ms).toBeLessThanOrEqual(15_000); // deadline 20 s - margin 5 s
    expect(r.stderr).toMatch(/drain done .*preserved 1, failed 0 of 1 sandboxes; device manager stopped: yes/);
    expect(r.stderr).toMatch(/preserved sb-1 \(resume: cold-start\)/);
    expect(readFileSync(path.join(r.run, 'state', 'prestop.log'), 'utf8')).toMatch(/preserved 1/);
  });

  test('a drain that reports failures exits 0 and says loudly what was lost', () => {
    const r = prestop({ SANDNODE_PRESTOP_DEADLINE_S: '20', SANDNODE_GRACE_PERIOD_S: '30', FAKE_DRAIN: 'fail' });
    expect(r.status).toBe(0);
    expect(r.stderr).toMatch(/ERROR: !!! DRAIN INCOMPLETE: the drain reported failures/);
    expect(r.stderr).toMatch(/FAILED {4}sb-2: pause timed out/);
  });

  test('a failing CLI exits 0 with its error logged', () => {
    const r = prestop({ SANDNODE_PRESTOP_DEADLINE_S: '20', SANDNODE_GRACE_PERIOD_S: '30', FAKE_DRAIN: 'crash' });
    expect(r.status).toBe(0);
    expect(r.stderr).toMatch(/DRAIN INCOMPLETE: the drain command failed \(exit 1\)/);
    expect(r.stderr).toMatch(/drain stderr: sandnode: UNAVAILABLE: no server/);
  });

  test('a drain that hangs is killed before the deadline and the hook exits 0', () => {
    const r = prestop({ SANDNODE_PRESTOP_DEADLINE_S: '4', SANDNODE_GRACE_PERIOD_S: '10', SANDNODE_PRESTOP_MARGIN_S: '1', FAKE_DRAIN: 'hang' });
    expect(r.status).toBe(0);
    expect(r.ms).toBeLessThan(4_500);
    expect(r.stderr).toMatch(/DRAIN INCOMPLETE: the drain did not return within \ds and was killed \(exit 124\)/);
  });

  test('a second drain during the same stop (the other server slot) does not drain again', () => {
    const first = prestop({ SANDNODE_PRESTOP_DEADLINE_S: '20', SANDNODE_GRACE_PERIOD_S: '30', FAKE_DRAIN: 'ok' });
    rmSync(path.join(first.run, 'argv.json'));
    const r = spawnSync('bash', [PRESTOP, 'drain'], {
      env: { PATH: process.env.PATH, SANDNODE_RUN_DIR: path.join(first.run, 'run'), SANDNODE_STATE_DIR: path.join(first.run, 'state'), SANDNODE_CLI: `node ${fakeCli}`, FAKE_ARGV: path.join(first.run, 'argv.json'), SANDNODE_PRESTOP_DEADLINE_S: '20', SANDNODE_GRACE_PERIOD_S: '30' },
      encoding: 'utf8',
    });
    expect(r.status).toBe(0);
    expect(r.stderr).toMatch(/another server slot already drained/);
    expect(existsSync(path.join(first.run, 'argv.json'))).toBe(false);
  });

  test('wait returns once the drain is done, and soon when nobody drains', () => {
    const first = prestop({ SANDNODE_PRESTOP_DEADLINE_S: '20', SANDNODE_GRACE_PERIOD_S: '30', FAKE_DRAIN: 'ok' });
    const env = { PATH: process.env.PATH, SANDNODE_RUN_DIR: path.join(first.run, 'run'), SANDNODE_STATE_DIR: path.join(first.run, 'state'), SANDNODE_PRESTOP_DEADLINE_S: '20', SANDNODE_GRACE_PERIOD_S: '30' };
    const done = spawnSync('bash', [PRESTOP, 'wait'], { env, encoding: 'utf8' });
    expect(done.status).toBe(0);
    expect(done.stderr).toMatch(/drain finished after \d+s: .*preserved 1/);

    const old = new Date(Date.now() - 3600_000);
    utimesSync(path.join(first.run, 'run', 'prestop.done'), old, old); // an old drain does not count
    const t0 = Date.now();
    const none = spawnSync('bash', [PRESTOP, 'wait'], { env, encoding: 'utf8' });
    expect(none.status).toBe(0);
    expect(none.stderr).toMatch(/no drain is running/);
    expect(Date.now() - t0).toBeLessThan(8_000);
  });
});
