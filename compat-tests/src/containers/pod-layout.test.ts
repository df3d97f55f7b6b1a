import path from 'node:path';
import { containerName, containerSpec, hostDirOf, loadPodLayout, planPodHost, podContainer, privilegeFallback, PRIVILEGED, PROBE_PERIOD_MS, PROBE_TIMEOUT_MS, type PodLayout } from './pod-layout';

const layout = loadPodLayout();
const root = '/tmp/pod-test';
const host = planPodHost(layout, root, 'abc123');
/** every capability bit set except CAP_SYS_RESOURCE (24), as in a container engine without it */
const NO_SYS_RESOURCE = ((1n << 41n) - 1n) & ~(1n << 24n);
const ALL_CAPS = (1n << 41n) - 1n;

describe('loadPodLayout', () => {
  it('reads the five containers, the shared PID namespace and the ConfigMap of deploy/k8s/base', () => {
    expect(layout.containers.map((c) => c.name)).toEqual(['vmm', 'server-a', 'server-b', 'ublk-a', 'ublk-b']);
    expect(layout.shareProcessNamespace).toBe(true);
    expect(Object.keys(layout.configFiles)).toEqual(expect.arrayContaining(['server-a.json', 'ublk-manager-b.json', 'vmm-supervisor.json']));
  });
});

describe('planPodHost', () => {
  it('binds the ConfigMap dir, the host /dev, remaps the state hostPath and lists the emptyDir', () => {
    expect(host.volumeDirs.config).toBe(path.join(root, 'config'));
    expect(host.volumeDirs.dev).toBe('/dev');
    expect(host.remapped).toEqual({ '/var/lib/sandnode': path.join(root, 'hostpath', 'state') });
    expect(host.emptyDirs).toEqual([path.join(root, 'emptydir', 'run')]);
    expect(host.secretDirs).toEqual({ 'sandnode-api-tls': path.join(root, 'secret', 'api-tls') });
    expect(hostDirOf(layout, host, 'server-b', '/run/sandnode')).toBe(path.join(root, 'emptydir', 'run'));
  });
  it('refuses a volume kind it does not translate and a ConfigMap that is not in configmap.yaml', () => {
    expect(() => planPodHost({ ...layout, volumes: [{ name: 'x' }] }, root, 'r')).toThrow(/only configMap, secret, hostPath and emptyDir/);
    expect(() => planPodHost({ ...layout, volumes: [{ name: 'x', configMap: { name: 'other' } }] }, root, 'r')).toThrow(/ConfigMap other is not in configmap.yaml/);
  });
  it('hostDirOf names the container that mounts nothing at a path', () => {
    expect(() => hostDirOf(layout, host, 'server-a', '/dev')).toThrow(/server-a mounts nothing at \/dev/);
  });
});

describe('containerSpec', () => {
  const vmmName = containerName(host, 'vmm');
  it('makes the first container the owner of the pod namespaces, privileged, with Bidirectional as rshared', () => {
    const s = containerSpec(layout, host, podContainer(layout, 'vmm'), 'img:1');
    expect(s).toMatchObject({ name: vmmName, image: 'img:1', hostname: 'sandnode-compat-abc123', networkMode: 'none', privilege: PRIVILEGED, noNewPrivileges: false });
    expect(s.pidMode).toBeUndefined();
    expect(s.labels).toEqual({ 'sandnode-compat': '1', 'sandnode-compat.run': 'abc123', 'sandnode-compat.container': 'vmm' });
    expect(s.mounts).toEqual([
      { source: path.join(root, 'config'), target: '/etc/sandnode', readOnly: true, propagation: 'rprivate' },
      { source: path.join(root, 'hostpath', 'state'), target: '/var/lib/sandnode', readOnly: false, propagation: 'rprivate' },
      { source: path.join(root, 'emptydir', 'run'), target: '/run/sandnode', readOnly: false, propagation: 'rshared' },
      { source: '/dev', target: '/dev', readOnly: false, propagation: 'rprivate' },
    ]);
    expect(s.entrypoint).toEqual(['/bin/sh']);
    expect(s.cmd[1]).toMatch(/^echo -1000 > \/proc\/self\/oom_score_adj && exec node \/app\/services\/vmm-supervisor\/dist\/main.js/);
    expect(s.env).toMatchObject({ SANDNODE_RUN_DIR: '/run/sandnode', SANDNODE_STATE_DIR: '/var/lib/sandnode' });
    expect(s.startupProbe).toEqual({ command: ['node', '/app/deploy/health-probe.js', 'unix:///run/sandnode/vmm-supervisor.sock'], periodMs: PROBE_PERIOD_MS, timeoutMs: PROBE_TIMEOUT_MS });
  });
  it('joins the other containers to the owner: shared PID and network namespace, no hostname; a server is unprivileged with HostToContainer as rslave', () => {
    const s = containerSpec(layout, host, podContainer(layout, 'server-a'), 'img:1');
    expect(s).toMatchObject({ pidMode: `container:${vmmName}`, networkMode: `container:${vmmName}`, noNewPrivileges: true });
    expect(s.hostname).toBeUndefined();
    expect(s.privilege).toBeUndefined();
    expect(s.mounts.find((m) => m.target === '/run/sandnode')?.propagation).toBe('rslave');
    expect([...s.entrypoint, ...s.cmd]).toEqual(['node', '/app/services/server/dist/main.js', '--config', '/etc/sandnode/server-a.json']);
  });
  it('with the fallback privilege: its mounts are added and only a missing CAP_SYS_RESOURCE makes the oom_score_adj echo tolerated', () => {
    const fallback = privilegeFallback(NO_SYS_RESOURCE, 'unable to apply caps');
    const vmm = containerSpec(layout, host, podContainer(layout, 'vmm'), 'i', fallback);
    expect(vmm.cmd[1]).toMatch(/^\{ echo -1000 > \/proc\/self\/oom_score_adj \|\| echo 'compat: oom_score_adj not set/);
    expect(vmm.mounts.at(-1)).toEqual({ source: '/sys/fs/cgroup', target: '/sys/fs/cgroup', readOnly: false, propagation: 'rprivate' });
    const full = containerSpec(layout, host, podContainer(layout, 'vmm'), 'i', privilegeFallback(ALL_CAPS, 'x'));
    expect(full.cmd[1]).toMatch(/^echo -1000 > \/proc\/self\/oom_score_adj && exec/);
    // an unprivileged container gets none of it
    expect(containerSpec(layout, host, podContainer(layout, 'server-b'), 'i', fallback).mounts.map((m) => m.target)).not.toContain('/sys/fs/cgroup');
  });
  it('refuses what it does not translate, naming the container', () => {
    const base = podContainer(layout, 'server-a');
    const one = (c: Partial<typeof base>): PodLayout => ({ ...layout, containers: [layout.containers[0]!, { ...base, ...c }] });
    const spec = (l: PodLayout) => containerSpec(l, host, l.containers[1]!, 'i');
    expect(() => spec(one({ volumeMounts: [{ name: 'nope', mountPath: '/x' }] }))).toThrow(/server-a: mount of unknown volume nope/);
    expect(() => spec(one({ volumeMounts: [{ name: 'state', mountPath: '/x', subPath: 'a' }] }))).toThrow(/subPath mounts are not translated/);
    expect(() => spec(one({ volumeMounts: [{ name: 'state', mountPath: '/x', mountPropagation: 'Sideways' }] }))).toThrow(/mountPropagation Sideways/);
    expect(() => spec(one({ command: [], args: [] }))).toThrow(/server-a: no command/);
    expect(() => podContainer(layout, 'sidecar')).toThrow(/no container sidecar/);
  });
});

describe('privilegeFallback', () => {
  it('adds every capability but those the engine lacks, and says which', () => {
    const p = privilegeFallback(NO_SYS_RESOURCE, 'unable to apply caps: operation not permitted');
    expect(p).toMatchObject({ privileged: false, capAdd: ['ALL'], capDrop: ['SYS_RESOURCE'], deviceCgroupRules: ['a *:* rwm'] });
    expect(p).toMatchObject({ securityOpt: ['seccomp=unconfined', 'apparmor=unconfined'], unmaskedPaths: true });
    expect(p.note).toMatch(/lacks CAP_SYS_RESOURCE.*oom_score_adj/);
    expect(privilegeFallback(ALL_CAPS, 'x').capDrop).toEqual([]);
  });
});
