/**
 * The node image (issue 15 §3): `sandnode image build` of this checkout, then a whole node run
 * from it in one privileged container: `sandnode up`, `status --json`, a template build, a
 * sandbox create + exec, `down --purge`. One build serves the file (and is reused by the compat
 * container mode of the same run while the inputs are unchanged: fingerprint). Needs root, a
 * Docker engine and the build; under CI=true (.ci/run installs docker.io) a missing one fails.
 * Leaves no container behind (named per run, removed in afterAll), nor its state dir.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { buildNodeImage, nodeFor, nodeImageTag, privilegedRunArgs, type NodeImageResult } from '@sandnode/node-stack';
import { built, describeWith, NODE_PARTS, PARTS } from '@sandnode/testkit';

jest.setTimeout(10 * 60_000);

const REPO = path.resolve(__dirname, '..', '..', '..');
const VERSION = (JSON.parse(readFileSync(path.join(REPO, 'package.json'), 'utf8')) as { version: string }).version;
const NAME = `sandnode-image-it-${randomBytes(4).toString('hex')}`;

/** run `docker args`; returns stdout, throws with stderr on a non-zero exit. */
function docker(args: string[], timeoutMs = 120_000): string {
  const r = spawnSync('docker', args, { encoding: 'utf8', timeout: timeoutMs, maxBuffer: 64 << 20 });
  if (r.status !== 0) throw new Error(`docker ${args.slice(0, 3).join(' ')} ... exit ${r.status ?? r.signal}: ${(r.stderr || r.error?.message || '').trim().slice(-2000)}`);
  return r.stdout;
}

/** in runs argv inside the node container. */
function inNode(argv: string[], timeoutMs = 180_000): string {
  return docker(['exec', NAME, ...argv], timeoutMs);
}

describeWith('node image', [...NODE_PARTS, PARTS.docker, built('@sandnode/cli')], () => {
  let img: NodeImageResult;
  let stateDir: string;
  let started = false;

  beforeAll(async () => {
    const commit = execFileSync('git', ['rev-parse', 'HEAD'], { cwd: REPO }).toString().trim();
    img = await buildNodeImage({ buildDir: REPO, tag: nodeImageTag(REPO), node: nodeFor(REPO), commit, version: VERSION, log: (l) => console.log(l) });
    console.log(`node image ${img.image}: ${img.built ? 'built' : 'reused'} in ${img.ms} ms, ${(img.sizeBytes / 1e6).toFixed(1)} MB`);
    stateDir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-image-it-'));
  });

  afterAll(() => {
    if (started) {
      spawnSync('docker', ['exec', NAME, 'sandnode', 'down', '--purge'], { stdio: 'ignore', timeout: 120_000 });
      spawnSync('docker', ['rm', '-f', NAME], { stdio: 'ignore', timeout: 60_000 });
    }
    if (stateDir) rmSync(stateDir, { recursive: true, force: true });
  });

  test('is tagged with the release version and holds node, the CLI and the host tools the node runs', () => {
    expect(img.image).toBe(`sandnode:${VERSION}`);
    expect(img.missingTools).toEqual([]);
    const run = (cmd: string) => docker(['run', '--rm', '--network', 'none', img.image, 'sh', '-c', cmd]);
    expect(run('node --version').trim()).toBe(`v${readFileSync(path.join(REPO, 'deploy', 'node-version'), 'utf8').trim()}`);
    const v = JSON.parse(run('sandnode version --json')) as { cli?: { version?: string } } & Record<string, unknown>;
    expect(JSON.stringify(v)).toContain(VERSION);
    // real binaries, not busybox applets: /bin/sh is dash, ip has netns, nft, runc, mkfs.ext4
    const tools = run('readlink /bin/sh; ip -V; nft --version; runc --version | head -1; mkfs.ext4 -V 2>&1 | head -1; losetup --version; busybox | head -1');
    expect(tools).toMatch(/^dash\n/);
    expect(tools).toMatch(/ip utility, iproute2/);
    expect(tools).toMatch(/nftables v/);
    expect(tools).toMatch(/runc version/);
    expect(tools).toMatch(/mke2fs \d/);
    expect(tools).toMatch(/losetup from util-linux/);
    // the runtime closure only: no test or build tooling in /app/node_modules
    const mods = run('ls /app/node_modules /app/node_modules/@sandnode');
    for (const dev of ['jest', 'typescript', 'testcontainers', 'eslint']) expect(mods.split('\n')).not.toContain(dev);
    for (const svc of ['server', 'vmm-supervisor', 'ublk-manager', 'cli', 'shared']) expect(mods.split('\n')).toContain(svc);
  });

  test('runs a whole node in one privileged container: up, status, template, sandbox create + exec, down', () => {
    const priv = privilegedRunArgs(img.image);
    console.log(`node image: ${priv.note}`);
    // /dev of the host: loop devices attached after the start must appear (as in deploy/k8s)
    docker(['run', '-d', '--name', NAME, ...priv.args, '-v', '/dev:/dev', '-v', `${stateDir}:/var/lib/sandnode`, img.image, 'sleep', 'infinity']);
    started = true;
    inNode(['sandnode', 'up']);
    const st = JSON.parse(inNode(['sandnode', 'status', '--json'])) as { components: { name: string; up: boolean; version: string | null }[] };
    const comps = Object.fromEntries(st.components.map((c) => [c.name, c]));
    for (const c of ['vmm-supervisor', 'ublk-manager', 'server']) expect(comps[c]).toMatchObject({ version: VERSION, up: true });
    inNode(['sandnode', 'template', 'build', 'base']);
    const sb = JSON.parse(inNode(['sandnode', 'sandbox', 'create', '--template', 'base', '--json'])) as { id: string; state: string };
    expect(sb.state).toBe('RUNNING');
    const out = inNode(['sandnode', 'sandbox', 'exec', sb.id, '--', 'sh', '-c', 'echo "hello from $(hostname)"; echo data > /workspace/f; cat /workspace/f']);
    expect(out).toBe(`hello from ${sb.id}\ndata\n`);
    inNode(['sandnode', 'sandbox', 'delete', sb.id]);
    const purge = inNode(['sandnode', 'down', '--purge']);
    expect(purge).toMatch(/removed/);
  });
});
