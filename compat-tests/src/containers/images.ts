/**
 * The image of a build, made locally (no registry: images are imported FROM scratch). N (this
 * checkout) runs from the node's release image itself, `sandnode:<version>` as
 * `sandnode image build` / `npm run image` makes it (@sandnode/node-stack image.ts), so the
 * container mode tests what deploy/k8s deploys; the releases before it have no image of their
 * own and get this file's recipe: /app =
 * the build (package.json + dist + bin of packages/*, tools/*, services/*, the common package's
 * descriptor, node_modules, deploy), plus node, runc, busybox (sh and applets), util-linux,
 * e2fsprogs, coreutils tools and every library `ldd` lists. An image is reused while its
 * fingerprint (commit + file sizes/mtimes + tools) matches the SANDNODE_IMAGE_FP it carries.
 */
import { spawn, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, copyFileSync, existsSync, lstatSync, mkdirSync, readdirSync, realpathSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { ImageName } from 'testcontainers';
import { buildNodeImage, makeMergedUsrRoot, nodeImageTag } from '@sandnode/node-stack';
import { nodeFor, REPO_ROOT } from '../releases';
import type { Build } from '../types';
import { runtime } from './engine';

/** Host tools copied into every image (besides node): real binaries; busybox supplies the rest. */
const TOOLS = ['runc', 'busybox', 'mkfs.ext4', 'mke2fs', 'losetup', 'mount', 'umount', 'cp', 'sync', 'blockdev', 'fsfreeze', 'timeout', 'flock', 'bash', 'date', 'stat', 'mktemp', 'tail'];

function which(t: string): string | undefined {
  const r = spawnSync('sh', ['-c', `command -v ${t}`], { encoding: 'utf8' });
  const p = r.stdout.trim();
  return r.status === 0 && p.startsWith('/') ? p : undefined;
}

/** inImage maps a host library path to its place in the image (merged /usr: /lib -> usr/lib). */
function inImage(p: string): string {
  if (p.startsWith('/lib/') || p.startsWith('/lib64/')) return `usr${p}`;
  return p.replace(/^\//, '');
}

/**
 * stageTools copies node, the TOOLS and their ldd libraries into dir (an image root with
 * merged /usr), and links every busybox applet that has no real binary. Returns a fingerprint
 * of what it copied (paths, sizes, mtimes) for the image cache.
 */
export function stageTools(dir: string): string {
  const fp = createHash('sha256');
  makeMergedUsrRoot(dir);
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
      if (m?.[1]) libs.add(m[1]);
    }
  }
  for (const lib of libs) {
    const dst = path.join(dir, inImage(lib));
    mkdirSync(path.dirname(dst), { recursive: true });
    if (!existsSync(dst)) copyFileSync(realpathSync(lib), dst);
    fp.update(`${lib}\n`);
  }
  const applets = spawnSync(path.join(dir, 'usr', 'bin', 'busybox'), ['--list'], { encoding: 'utf8' })
    .stdout.split('\n')
    .filter(Boolean);
  for (const a of applets) if (!existsSync(path.join(dir, 'usr', 'bin', a))) symlinkSync('busybox', path.join(dir, 'usr', 'bin', a));
  return fp.digest('hex');
}

/**
 * buildPaths lists the parts of a build an image holds, relative to the build dir: either
 * layout (0.1.0/0.2.0: services/server holds the CLI, `shared/`; from 0.3.0: tools/*,
 * packages/*, `packages/shared`), whatever exists of package.json, dist, bin and data files
 * (vmm-supervisor's seccomp/) per package.
 */
export function buildPaths(dir: string): string[] {
  const out = ['package.json', 'node_modules', 'shared/package.json', 'shared/dist', 'shared/descriptor', 'packages/shared/descriptor', 'deploy'];
  for (const root of ['packages', 'services', 'tools']) {
    if (!existsSync(path.join(dir, root))) continue;
    for (const s of readdirSync(path.join(dir, root))) out.push(`${root}/${s}/package.json`, `${root}/${s}/dist`, `${root}/${s}/bin`, `${root}/${s}/seccomp`);
  }
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
      const lock = path.join(p, '.package-lock.json');
      if (existsSync(lock)) h.update(`.package-lock.json ${statSync(lock).mtimeMs}\n`);
    } else walk(p);
  }
  return h.digest('hex').slice(0, 16);
}

/** usesReleaseImage: build b is this checkout (N), which runs from the node's release image (`sandnode:<version>`), not this file's recipe. */
export function usesReleaseImage(b: Pick<Build, 'dir'>): boolean {
  return path.resolve(b.dir) === path.resolve(REPO_ROOT);
}

/** imageName is `sandnode-compat:<label>-<commit12>` (the recipe's images: releases before N). */
export function imageName(b: Build): string {
  return `sandnode-compat:${b.label.replace(/[^A-Za-z0-9_.-]/g, '-')}-${b.commit.slice(0, 12)}`;
}

/** tarOf streams a tar of the tools dir (at /) and the build (at /app). */
function tarOf(b: Build, toolsDir: string): { stream: NodeJS.ReadableStream; done: Promise<string | undefined> } {
  const buildRel = path.relative('/', path.resolve(b.dir));
  const toolsRel = path.relative('/', path.resolve(toolsDir));
  // the build's own Node (a release runs on the Node it was built for), at /usr/local/bin/node: first on PATH
  const nodeRel = path.relative('/', realpathSync(nodeFor(b)));
  const members = [nodeRel, ...readdirSync(toolsDir).map((e) => `${toolsRel}/${e}`), ...buildPaths(b.dir).map((p) => `${buildRel}/${p}`)];
  const esc = (s: string) => s.replace(/[.[\]*^$\\]/g, '\\$&');
  const args = [
    '-C',
    '/',
    '-cf',
    '-',
    '--numeric-owner',
    '--transform',
    `flags=rh;s|^${esc(nodeRel)}$|usr/local/bin/node|`,
    '--transform',
    `flags=rh;s|^${esc(toolsRel)}/||`,
    '--transform',
    `flags=rh;s|^${esc(buildRel)}/|app/|`,
    ...members,
  ];
  const tar = spawn('tar', args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let err = '';
  tar.stderr.on('data', (d: Buffer) => (err += d.toString()));
  const done = new Promise<string | undefined>((resolve) => {
    tar.on('error', (e) => resolve(e.message));
    tar.on('close', (c) => resolve(c === 0 ? undefined : `tar exit ${c}: ${err.trim().slice(-1500)}`));
  });
  return { stream: tar.stdout, done };
}

/**
 * ensureImage makes the image of build b (reused when its fingerprint matches): the tar of
 * tarOf imported through the engine API (`POST /images/create?fromSrc=-`, what `docker import`
 * does). Returns the image name, whether it was built, and the time taken. Throws with the
 * engine's or tar's error.
 */
export async function ensureImage(b: Build, toolsDir: string, toolsFp: string): Promise<{ image: string; built: boolean; ms: number }> {
  const t0 = Date.now();
  if (usesReleaseImage(b)) {
    const r = await buildNodeImage({ buildDir: b.dir, tag: nodeImageTag(b.dir), node: nodeFor(b), commit: b.commit, version: b.version });
    return { image: r.image, built: r.built, ms: Date.now() - t0 };
  }
  const image = imageName(b);
  const ref = ImageName.fromString(image);
  const fp = buildFingerprint(b, toolsFp);
  const client = await runtime();
  if (await client.image.exists(ref)) {
    const env = (await client.image.inspect(ref)).Config?.Env ?? [];
    if (env.includes(`SANDNODE_IMAGE_FP=${fp}`)) return { image, built: false, ms: Date.now() - t0 };
  }
  const changes = ['ENV PATH=/usr/local/bin:/usr/bin:/bin', `ENV SANDNODE_BUILD_COMMIT=${b.commit}`, `ENV SANDNODE_IMAGE_FP=${fp}`, 'WORKDIR /app'];
  const tar = tarOf(b, toolsDir);
  const engine = client.container.dockerode;
  const progress = await engine.importImage(tar.stream, { repo: ref.image, tag: ref.tag, changes });
  const out = await new Promise<Array<{ error?: string }>>((resolve, reject) =>
    engine.modem.followProgress(progress, (err: Error | null, o: Array<{ error?: string }>) => (err ? reject(err) : resolve(o))),
  );
  const tarErr = await tar.done;
  const engineErr = out.find((o) => o.error)?.error;
  if (tarErr || engineErr) throw new Error(`image ${image}: ${[tarErr, engineErr && `import: ${engineErr}`].filter(Boolean).join('; ')}`);
  if (!(await client.image.exists(ref))) throw new Error(`image ${image}: import ended but the engine has no such image`);
  await pruneOlderImages(engine, image).catch(() => undefined); // housekeeping: never fails the build
  return { image, built: true, ms: Date.now() - t0 };
}

/**
 * pruneOlderImages removes the engine's other images of the same label (`sandnode-compat:N-*`
 * of earlier commits: ~600 MB each, one per commit tested, piled up on a machine that runs the
 * matrix often); release images have their own label and stay cached. An image a container
 * still uses is left (the engine refuses: 409).
 */
async function pruneOlderImages(
  engine: { listImages(o: object): Promise<Array<{ RepoTags?: string[] | null }>>; getImage(n: string): { remove(o: object): Promise<unknown> } },
  image: string,
): Promise<void> {
  const label = image.slice(0, image.lastIndexOf('-') + 1); // "sandnode-compat:N-"
  const tags = (await engine.listImages({ filters: { reference: [`${label.split(':')[0]}:*`] } })).flatMap((i) => i.RepoTags ?? []);
  for (const t of tags.filter((t) => t.startsWith(label) && t !== image))
    await engine
      .getImage(t)
      .remove({})
      .catch(() => undefined);
}
