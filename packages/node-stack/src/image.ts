/**
 * The OCI image of a node (issue 15 §3), built from local parts only: no registry, no base
 * image. The root filesystem is assembled here and imported through the engine
 * (`docker import`, a single layer):
 *
 *   /usr/local/bin/node       the Node the build's node_modules were built for (nodeFor)
 *   /usr/local/bin/sandnode   the CLI (`node /app/tools/cli/bin/sandnode.js`)
 *   /usr/bin/...              IMAGE_TOOLS copied from the host (runc, static busybox and its
 *                             applets, dash as /bin/sh, e2fsprogs, util-linux, nftables, iproute2, coreutils)
 *   /usr/lib/...              every library `ldd` lists for them (merged /usr)
 *   /app                      the build: package.json, per workspace package.json + dist + bin
 *                             + data files, the descriptor set, deploy/, and node_modules
 *                             (`runtime`: only the closure of the runtime workspaces'
 *                             dependencies read from package-lock.json; `all`: as it is)
 *
 * The image carries `SANDNODE_IMAGE_FP` (a fingerprint of every input: paths, sizes, mtimes,
 * tools, node) and is reused while it matches; `SANDNODE_BUILD_COMMIT` for GetVersion.
 */
import { spawn, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, copyFileSync, existsSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, realpathSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

/** Host tools copied into the image as real binaries (besides node); busybox supplies the rest. Missing ones are listed in the result. */
export const IMAGE_TOOLS = [
  'runc',
  'busybox',
  'bash',
  'dash',
  'mkfs.ext4',
  'mke2fs',
  'e2fsck',
  'debugfs',
  'resize2fs',
  'tune2fs',
  'losetup',
  'mount',
  'umount',
  'ldd',
  'nsenter',
  'setpriv',
  'fsfreeze',
  'blockdev',
  'flock',
  'nft',
  'ip',
  'cp',
  'dd',
  'sync',
  'truncate',
  'timeout',
  'date',
  'stat',
  'mktemp',
  'tail',
] as const;

/**
 * The workspaces the node runs (daemons, CLI and what they load); their dependencies, not the
 * test and tooling workspaces', make the `runtime` node_modules. A missing one is skipped
 * (older layouts).
 */
export const RUNTIME_WORKSPACES = [
  'packages/shared',
  'packages/node-stack',
  'packages/template-builder',
  'services/podd',
  'services/vmm-supervisor',
  'services/ublk-manager',
  'services/server',
  'tools/cli',
  'deploy',
] as const;

/** Paths inside node_modules the node never reads (native build intermediates, sources). */
const MODULE_EXCLUDES = ['*/build/Release/obj.target', '*/build/Release/.deps', '*/build/Release/obj', '*/build/deps', 'node_modules/better-sqlite3/deps', 'node_modules/better-sqlite3/src'];

/** The marker bin/sandnode.js reads (which Node node_modules were built for). */
const NODE_MARKER = path.join('node_modules', '.sandnode-node.json');

function which(t: string): string | undefined {
  const r = spawnSync('sh', ['-c', 'command -v "$1"', 'sh', t], { encoding: 'utf8' });
  const p = r.stdout.trim();
  return r.status === 0 && p.startsWith('/') ? p : undefined;
}

/** inImage maps a host library path to its place in the image (merged /usr: /lib -> usr/lib). */
function inImage(p: string): string {
  if (p.startsWith('/lib/') || p.startsWith('/lib64/')) return `usr${p}`;
  return p.replace(/^\//, '');
}

/** What stageImageRoot made: the fingerprint of what it copied and the tools the host lacks. */
export interface StagedRoot {
  /** sha256 hex of the copied binaries and libraries (paths, sizes, mtimes) */
  fingerprint: string;
  /** IMAGE_TOOLS entries not found on the host (left out of the image) */
  missing: string[];
}

/**
 * stageImageRoot makes an image root in dir (empty or absent): merged-/usr skeleton, /etc
 * files, node (the file `node`) at usr/local/bin/node, the sandnode CLI wrapper, tools and
 * their ldd libraries, busybox applet links for every name without a real binary. Throws when
 * busybox is missing or dynamically linked (templates copy it into sandboxes).
 */
export function stageImageRoot(dir: string, node: string, tools: readonly string[] = IMAGE_TOOLS): StagedRoot {
  const fp = createHash('sha256');
  makeMergedUsrRoot(dir, ['var/lib/sandnode', 'var/run', 'root']);
  writeFileSync(path.join(dir, 'etc', 'passwd'), 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/bin/false\n');
  writeFileSync(path.join(dir, 'etc', 'group'), 'root:x:0:\nnogroup:x:65534:\n');
  writeFileSync(path.join(dir, 'etc', 'nsswitch.conf'), 'passwd: files\ngroup: files\nhosts: files dns\n');
  if (existsSync('/etc/mke2fs.conf')) copyFileSync('/etc/mke2fs.conf', path.join(dir, 'etc', 'mke2fs.conf'));
  writeFileSync(path.join(dir, 'usr', 'local', 'bin', 'sandnode'), '#!/bin/sh\nexec /usr/local/bin/node /app/tools/cli/bin/sandnode.js "$@"\n', { mode: 0o755 });
  const bins: [string, string, string][] = [['node', realpathSync(node), 'usr/local/bin/node']];
  const missing: string[] = [];
  for (const t of tools) {
    const p = which(t);
    if (p) bins.push([t, realpathSync(p), `usr/bin/${t}`]);
    else missing.push(t);
  }
  if (!bins.some(([n]) => n === 'busybox')) throw new Error('busybox is not on PATH: apt-get install busybox-static');
  const libs = new Set<string>();
  for (const [name, real, dst] of bins) {
    copyFileSync(real, path.join(dir, dst));
    chmodSync(path.join(dir, dst), 0o755);
    const st = statSync(real);
    fp.update(`${name} ${real} ${st.size} ${st.mtimeMs}\n`);
    const ldd = spawnSync('ldd', [real], { encoding: 'utf8' });
    if (name === 'busybox' && ldd.status === 0 && /=>/.test(ldd.stdout)) throw new Error(`busybox at ${real} is dynamically linked: apt-get install busybox-static`);
    for (const line of ldd.stdout.split('\n')) {
      const m = /=>\s+(\/\S+)/.exec(line) ?? /^\s*(\/\S+)\s+\(/.exec(line);
      if (m?.[1]) libs.add(m[1]);
    }
  }
  for (const lib of [...libs].sort()) {
    const dst = path.join(dir, inImage(lib));
    mkdirSync(path.dirname(dst), { recursive: true });
    if (!existsSync(dst)) copyFileSync(realpathSync(lib), dst);
    fp.update(`${lib}\n`);
  }
  // /bin/sh is a real shell: Debian's static busybox prefers its own applets inside `sh -c`,
  // so `sh -c 'exec ip -batch -'` would run busybox's ip, which lacks netns and -batch
  const shell = ['dash', 'bash'].find((t) => bins.some(([n]) => n === t));
  if (!shell) throw new Error('neither dash nor bash is on PATH: /bin/sh of the image needs one');
  symlinkSync(shell, path.join(dir, 'usr', 'bin', 'sh'));
  const applets = spawnSync(path.join(dir, 'usr', 'bin', 'busybox'), ['--list'], { encoding: 'utf8' })
    .stdout.split('\n')
    .filter(Boolean);
  for (const a of applets) if (!existsSync(path.join(dir, 'usr', 'bin', a)) && !existsSync(path.join(dir, 'usr', 'local', 'bin', a))) symlinkSync('busybox', path.join(dir, 'usr', 'bin', a));
  // the CLI's re-exec marker, pointing at the image's node (the build's one names a host path)
  const abi = spawnSync(node, ['-p', 'process.versions.modules'], { encoding: 'utf8' }).stdout.trim();
  mkdirSync(path.join(dir, 'app', 'node_modules'), { recursive: true });
  writeFileSync(path.join(dir, 'app', NODE_MARKER), `${JSON.stringify({ node: '/usr/local/bin/node', modules: abi })}\n`);
  fp.update(`abi ${abi}\n`);
  return { fingerprint: fp.digest('hex'), missing };
}

interface LockEntry {
  dependencies?: Record<string, string>;
  optionalDependencies?: Record<string, string>;
  peerDependencies?: Record<string, string>;
  peerDependenciesMeta?: Record<string, { optional?: boolean }>;
  link?: boolean;
  resolved?: string;
}

/**
 * runtimeModules lists the node_modules entries (paths relative to buildDir, as in
 * package-lock.json v2/v3 `packages`) that the RUNTIME_WORKSPACES need: the closure of their
 * dependencies, optional and required peer dependencies, resolved the way Node does (nearest
 * node_modules first, then each parent's). Workspace links (node_modules/@sandnode/*) are
 * listed too, and the link of every runtime workspace (the CLI resolves the daemons by package name). Throws when the build has no lockfile v2+ or a required dependency is not in it.
 */
export function runtimeModules(buildDir: string): string[] {
  const lockFile = path.join(buildDir, 'package-lock.json');
  const lock = JSON.parse(readFileSync(lockFile, 'utf8')) as { lockfileVersion?: number; packages?: Record<string, LockEntry> };
  const pkgs = lock.packages;
  if (!pkgs || (lock.lockfileVersion ?? 1) < 2) throw new Error(`${lockFile}: lockfileVersion 2 or 3 (with "packages") is needed`);
  const out = new Set<string>();
  const seen = new Set<string>();
  const resolve = (from: string, name: string): string | undefined => {
    // from "node_modules/a/node_modules/b": b's own node_modules, then a's, then the root's
    for (let d = from; ;) {
      const cand = d ? `${d}/node_modules/${name}` : `node_modules/${name}`;
      if (pkgs[cand]) return cand;
      if (!d) return undefined;
      const i = d.lastIndexOf('/node_modules/');
      d = i >= 0 ? d.slice(0, i) : ''; // a top-level package or a workspace dir: the root is next
    }
  };
  const visit = (at: string): void => {
    if (seen.has(at)) return;
    seen.add(at);
    const e = pkgs[at];
    if (!e) return;
    if (e.link && e.resolved) {
      out.add(at);
      visit(e.resolved);
      return;
    }
    if (at.includes('node_modules/')) out.add(at);
    const optional = new Set([...Object.keys(e.optionalDependencies ?? {}), ...Object.entries(e.peerDependenciesMeta ?? {}).flatMap(([k, v]) => (v.optional ? [k] : []))]);
    for (const name of new Set([...Object.keys(e.dependencies ?? {}), ...Object.keys(e.optionalDependencies ?? {}), ...Object.keys(e.peerDependencies ?? {})])) {
      const r = resolve(at, name);
      if (r) visit(r);
      else if (!optional.has(name)) throw new Error(`${lockFile}: ${at || '(root)'} needs ${name}, which the lockfile does not hold`);
    }
  };
  for (const ws of RUNTIME_WORKSPACES) if (pkgs[ws]) visit(ws);
  // every runtime workspace's own link (the CLI finds the daemons as @sandnode/<service>)
  for (const [at, e] of Object.entries(pkgs)) if (e.link && e.resolved && (RUNTIME_WORKSPACES as readonly string[]).includes(e.resolved)) out.add(at);
  return [...out].filter((p) => existsSync(path.join(buildDir, p))).sort();
}

/** Which node_modules an image takes: `runtime` (runtimeModules) or `all` (the dir as it is; builds without a v2+ lockfile). */
export type ImageModules = 'runtime' | 'all';

/**
 * imagePaths lists the parts of a build an image holds, relative to buildDir: package.json,
 * deploy/, the descriptor set, and per workspace of either layout (0.1.0/0.2.0: services/*
 * and shared/; from 0.3.0: packages/*, services/*, tools/*) package.json, dist, bin and data
 * files (seccomp/), then node_modules as `modules` says. Only paths that exist.
 */
export function imagePaths(buildDir: string, modules: ImageModules): string[] {
  const out = ['package.json', 'shared/package.json', 'shared/dist', 'shared/descriptor', 'packages/shared/descriptor', 'deploy'];
  const runtimeOnly = modules === 'runtime';
  for (const root of ['packages', 'services', 'tools']) {
    if (!existsSync(path.join(buildDir, root))) continue;
    for (const s of readdirSync(path.join(buildDir, root)).sort()) {
      if (runtimeOnly && !(RUNTIME_WORKSPACES as readonly string[]).includes(`${root}/${s}`)) continue;
      out.push(`${root}/${s}/package.json`, `${root}/${s}/dist`, `${root}/${s}/bin`, `${root}/${s}/seccomp`);
    }
  }
  if (runtimeOnly) out.push(...runtimeModules(buildDir).filter((p) => p.startsWith('node_modules/') || p.includes('/node_modules/')));
  else out.push('node_modules');
  const seen = new Set<string>();
  return out.filter((p) => {
    if (seen.has(p) || !existsSync(path.join(buildDir, p))) return false;
    // drop an entry already inside a listed directory (a nested node_modules of a listed package)
    for (let d = path.dirname(p); d !== '.'; d = path.dirname(d)) if (seen.has(d)) return false;
    seen.add(p);
    return true;
  });
}

/** An image reference with a tag: [host[:port]/]name[/name...]:tag (docker's grammar, without digests). */
const IMAGE_REF = /^(?:[a-z0-9]+(?:[.-][a-z0-9]+)*(?::[0-9]+)?\/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:\/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/;

/** What buildNodeImage is asked for. */
export interface NodeImageOptions {
  /** a built checkout (package.json, dist of every runtime workspace, node_modules) */
  buildDir: string;
  /** image reference to tag, e.g. "sandnode:0.3.0" (refused unless name:tag) */
  tag: string;
  /** the Node binary the build's node_modules were built for */
  node: string;
  /** git commit of the build (SANDNODE_BUILD_COMMIT; "" when unknown) */
  commit: string;
  /** release version (label org.opencontainers.image.version) */
  version: string;
  /** node_modules selection (default `runtime`) */
  modules?: ImageModules;
  /** rebuild even when the engine has an image of the same fingerprint */
  force?: boolean;
  /** the docker CLI (default `docker` on PATH) */
  docker?: string;
  /** progress lines */
  log?: (line: string) => void;
}

/** What buildNodeImage did. */
export interface NodeImageResult {
  /** the tag */
  image: string;
  /** the engine's image id (sha256:...) */
  id: string;
  /** false when an image with the same fingerprint was reused */
  built: boolean;
  /** the inputs' fingerprint (SANDNODE_IMAGE_FP), 16 hex */
  fingerprint: string;
  /** the image's size as the engine reports it, bytes */
  sizeBytes: number;
  /** wall time of the whole call, ms; stageMs: the root's staging, importMs: tar + import */
  ms: number;
  stageMs: number;
  importMs: number;
  /** IMAGE_TOOLS the host lacks (not in the image) */
  missingTools: string[];
}

function docker(bin: string, args: string[], input?: string): { status: number; stdout: string; stderr: string } {
  const r = spawnSync(bin, args, { encoding: 'utf8', input, maxBuffer: 64 << 20 });
  if (r.error) throw new Error(`${bin} ${args[0]}: ${r.error.message} (a Docker engine is needed: apt-get install docker.io; bash deploy/docker-engine.sh)`);
  return { status: r.status ?? 1, stdout: r.stdout, stderr: r.stderr };
}

/** inspectImage returns the engine's {id, env, size} of ref, or undefined when it has none. */
function inspectImage(bin: string, ref: string): { id: string; env: string[]; size: number } | undefined {
  const r = docker(bin, ['image', 'inspect', '--format', '{{json .Id}} {{json .Config.Env}} {{json .Size}}', ref]);
  if (r.status !== 0) return undefined;
  const [id, env, size] = r.stdout.trim().split(' ');
  return { id: JSON.parse(id!) as string, env: (JSON.parse(env!) as string[] | null) ?? [], size: Number(size) };
}

/** fingerprintOf hashes the inputs: recipe, commit, tag, staged root, and the build's paths (sizes, mtimes; node_modules entries by their package.json). */
function fingerprintOf(o: NodeImageOptions, rootFp: string, paths: string[]): string {
  const h = createHash('sha256').update(`recipe node-image 2\n${o.commit}\n${o.version}\n${rootFp}\n${o.modules ?? 'runtime'}\n`);
  const walk = (p: string) => {
    const st = lstatSync(p);
    h.update(`${path.relative(o.buildDir, p)} ${st.size} ${st.mtimeMs}\n`);
    if (st.isDirectory()) for (const e of readdirSync(p).sort()) walk(path.join(p, e));
  };
  for (const rel of paths) {
    const p = path.join(o.buildDir, rel);
    if (rel === 'node_modules' || rel.includes('node_modules/')) {
      const pj = path.join(p, rel === 'node_modules' ? '.package-lock.json' : 'package.json');
      h.update(`${rel} ${existsSync(pj) ? statSync(pj).mtimeMs : lstatSync(p).mtimeMs}\n`);
    } else walk(p);
  }
  return h.digest('hex').slice(0, 16);
}

/**
 * buildNodeImage builds (or reuses) the node image of o.buildDir as o.tag: stages the root
 * (stageImageRoot) in a temp dir, streams one tar of it and the build's imagePaths (at /app)
 * into `docker import` with ENV PATH, SANDNODE_BUILD_COMMIT, SANDNODE_IMAGE_FP, WORKDIR /app and
 * OCI labels. Throws naming tar's or the engine's error, or a build that is not built (no
 * tools/cli/dist or services/server/dist). The previous image of the tag is removed when no
 * container uses it. The temp dir is always removed.
 */
export async function buildNodeImage(o: NodeImageOptions): Promise<NodeImageResult> {
  const t0 = Date.now();
  if (!IMAGE_REF.test(o.tag)) throw new Error(`image reference ${JSON.stringify(o.tag)} is not <name>:<tag> (lowercase name components, tag [A-Za-z0-9_.-], at most 128 characters)`);
  const bin = o.docker ?? 'docker';
  const log = o.log ?? (() => undefined);
  const buildDir = path.resolve(o.buildDir);
  const modules = o.modules ?? 'runtime';
  const stage = mkdtempSync(path.join(os.tmpdir(), 'sandnode-image-'));
  try {
    const root = path.join(stage, 'root');
    mkdirSync(root);
    const staged = stageImageRoot(root, o.node);
    const stageMs = Date.now() - t0;
    if (staged.missing.length) log(`image: host lacks ${staged.missing.join(', ')} (left out)`);
    const paths = imagePaths(buildDir, modules);
    const fp = fingerprintOf({ ...o, buildDir }, staged.fingerprint, paths);
    const before = inspectImage(bin, o.tag);
    if (before && !o.force && before.env.includes(`SANDNODE_IMAGE_FP=${fp}`)) {
      log(`image: ${o.tag} is up to date (fingerprint ${fp})`);
      return { image: o.tag, id: before.id, built: false, fingerprint: fp, sizeBytes: before.size, ms: Date.now() - t0, stageMs, importMs: 0, missingTools: staged.missing };
    }
    log(`image: importing ${paths.length} build paths + ${readdirSync(root).length} root entries as ${o.tag}`);
    const t1 = Date.now();
    const buildRel = path.relative('/', buildDir);
    const rootRel = path.relative('/', root);
    const esc = (s: string) => s.replace(/[.[\]*^$\\|]/g, '\\$&');
    const tarArgs = [
      '-C',
      '/',
      '-cf',
      '-',
      '--numeric-owner',
      '--owner=0',
      '--group=0',
      ...MODULE_EXCLUDES.map((e) => `--exclude=${e}`),
      '--transform',
      `flags=rh;s|^${esc(rootRel)}/||`,
      '--transform',
      `flags=rh;s|^${esc(buildRel)}/|app/|`,
      ...readdirSync(root).map((e) => `${rootRel}/${e}`),
      ...paths.map((p) => `${buildRel}/${p}`),
    ];
    const changes = [
      'ENV PATH=/usr/local/bin:/usr/bin:/bin',
      `ENV SANDNODE_BUILD_COMMIT=${o.commit}`,
      // the CLI's dirs where deploy/k8s mounts them (not /app/.sandnode, inside the image)
      'ENV SANDNODE_STATE_DIR=/var/lib/sandnode',
      'ENV SANDNODE_RUN_DIR=/run/sandnode',
      `ENV SANDNODE_IMAGE_FP=${fp}`,
      'WORKDIR /app',
      `LABEL org.opencontainers.image.version=${o.version} org.opencontainers.image.revision=${o.commit || 'unknown'} org.opencontainers.image.title=sandnode`,
      'CMD ["sandnode", "--help"]',
    ];
    const err = await new Promise<string | undefined>((resolve) => {
      const tar = spawn('tar', tarArgs, { stdio: ['ignore', 'pipe', 'pipe'] });
      const imp = spawn(bin, ['import', ...changes.flatMap((c) => ['--change', c]), '-', o.tag], { stdio: ['pipe', 'pipe', 'pipe'] });
      let tarErr = '';
      let impErr = '';
      let tarCode: number | null | undefined;
      let impCode: number | null | undefined;
      tar.stderr.on('data', (d: Buffer) => (tarErr += d.toString()));
      imp.stderr.on('data', (d: Buffer) => (impErr += d.toString()));
      imp.stdout.resume();
      tar.stdout.pipe(imp.stdin);
      imp.stdin.on('error', () => undefined); // the import's own exit status says why
      const end = () => {
        if (tarCode === undefined || impCode === undefined) return;
        const errs = [tarCode !== 0 && `tar exit ${tarCode}: ${tarErr.trim().slice(-1500)}`, impCode !== 0 && `${bin} import exit ${impCode}: ${impErr.trim().slice(-1500)}`].filter(Boolean);
        resolve(errs.length ? errs.join('; ') : undefined);
      };
      tar.on('error', (e) => ((tarCode = -1), (tarErr = e.message), end()));
      imp.on('error', (e) => ((impCode = -1), (impErr = `${e.message} (a Docker engine is needed: apt-get install docker.io; bash deploy/docker-engine.sh)`), end()));
      tar.on('close', (c) => ((tarCode = c), end()));
      imp.on('close', (c) => ((impCode = c), end()));
    });
    if (err) throw new Error(`image ${o.tag}: ${err}`);
    const after = inspectImage(bin, o.tag);
    if (!after) throw new Error(`image ${o.tag}: import ended but the engine has no such image`);
    // the replaced image (same tag, older inputs) is unreachable now: remove it unless a container uses it
    if (before && before.id !== after.id) docker(bin, ['image', 'rm', before.id]);
    const importMs = Date.now() - t1;
    log(`image: ${o.tag} built (${(after.size / 1e6).toFixed(0)} MB, stage ${stageMs} ms, import ${importMs} ms)`);
    return { image: o.tag, id: after.id, built: true, fingerprint: fp, sizeBytes: after.size, ms: Date.now() - t0, stageMs, importMs, missingTools: staged.missing };
  } finally {
    rmSync(stage, { recursive: true, force: true });
  }
}

/** nodeImageTag is the release tag of a build: `<repo>:<package.json version>` (repo default "sandnode"). */
export function nodeImageTag(buildDir: string, repo = 'sandnode'): string {
  const v = (JSON.parse(readFileSync(path.join(buildDir, 'package.json'), 'utf8')) as { version?: unknown }).version;
  if (typeof v !== 'string' || !/^[0-9A-Za-z][0-9A-Za-z_.-]{0,127}$/.test(v)) throw new Error(`${buildDir}/package.json: version ${JSON.stringify(v)} is not a valid image tag`);
  return `${repo}:${v}`;
}

/** Capability names by bit number (linux/capability.h), for the fallback of privilegedRunArgs. */
const CAP_NAMES = [
  'CHOWN',
  'DAC_OVERRIDE',
  'DAC_READ_SEARCH',
  'FOWNER',
  'FSETID',
  'KILL',
  'SETGID',
  'SETUID',
  'SETPCAP',
  'LINUX_IMMUTABLE',
  'NET_BIND_SERVICE',
  'NET_BROADCAST',
  'NET_ADMIN',
  'NET_RAW',
  'IPC_LOCK',
  'IPC_OWNER',
  'SYS_MODULE',
  'SYS_RAWIO',
  'SYS_CHROOT',
  'SYS_PTRACE',
  'SYS_PACCT',
  'SYS_ADMIN',
  'SYS_BOOT',
  'SYS_NICE',
  'SYS_RESOURCE',
  'SYS_TIME',
  'SYS_TTY_CONFIG',
  'MKNOD',
  'LEASE',
  'AUDIT_WRITE',
  'AUDIT_CONTROL',
  'SETFCAP',
  'MAC_OVERRIDE',
  'MAC_ADMIN',
  'SYSLOG',
  'WAKE_ALARM',
  'BLOCK_SUSPEND',
  'AUDIT_READ',
  'PERFMON',
  'BPF',
  'CHECKPOINT_RESTORE',
];

/** lackingCapabilities names the capabilities (CAP_ names without the prefix) not in the bounding set capBnd (CapBnd of /proc/<pid>/status). */
export function lackingCapabilities(capBnd: bigint): string[] {
  return CAP_NAMES.filter((_, i) => (capBnd & (1n << BigInt(i))) === 0n);
}

/**
 * makeMergedUsrRoot lays out an empty root filesystem in dir the way Debian does (merged /usr:
 * /bin, /sbin, /lib, /lib64 and /usr/sbin are links into /usr), with /tmp (mode 1777), /etc,
 * /run, /var/lib, /proc, /sys, /dev and the extra dirs (relative to dir).
 */
export function makeMergedUsrRoot(dir: string, extra: readonly string[] = []): void {
  for (const d of ['usr/bin', 'usr/lib', 'usr/lib64', 'usr/local/bin']) mkdirSync(path.join(dir, d), { recursive: true });
  for (const [l, t] of [
    ['bin', 'usr/bin'],
    ['sbin', 'usr/bin'],
    ['lib', 'usr/lib'],
    ['lib64', 'usr/lib64'],
  ] as const)
    symlinkSync(t, path.join(dir, l));
  symlinkSync('bin', path.join(dir, 'usr', 'sbin'));
  for (const d of ['tmp', 'etc', 'run', 'var/lib', 'proc', 'sys', 'dev', ...extra]) mkdirSync(path.join(dir, d), { recursive: true });
  chmodSync(path.join(dir, 'tmp'), 0o1777);
}

/**
 * privilegedRunArgs are the `docker run` flags for a container that may run the whole node
 * (runc, loop devices, mounts, netns, nftables) from image: `--privileged` when a privileged
 * one-shot container of image starts on this engine; else (an engine that runs inside a
 * container without every capability: "unable to apply caps") the nearest equivalent: every
 * capability this process has, seccomp/AppArmor/system paths unconfined, every device allowed,
 * the host's cgroup tree bound writable. `note` says which and why.
 */
export function privilegedRunArgs(image: string, bin = 'docker'): { args: string[]; note: string } {
  const probe = docker(bin, ['run', '--rm', '--privileged', '--network', 'none', '--entrypoint', '/usr/bin/true', image]);
  if (probe.status === 0) return { args: ['--privileged'], note: 'privileged mode' };
  const capBnd = BigInt(`0x${/CapBnd:\s*([0-9a-f]+)/.exec(readFileSync('/proc/self/status', 'utf8'))?.[1] ?? '0'}`);
  const lacking = lackingCapabilities(capBnd);
  const args = [
    '--cap-add',
    'ALL',
    ...lacking.flatMap((c) => ['--cap-drop', c]),
    '--security-opt',
    'seccomp=unconfined',
    '--security-opt',
    'apparmor=unconfined',
    '--security-opt',
    'systempaths=unconfined',
    '--device-cgroup-rule',
    'a *:* rwm',
    '-v',
    '/sys/fs/cgroup:/sys/fs/cgroup',
  ];
  const why = /unable to apply caps[^\n]*/.exec(probe.stderr)?.[0] ?? probe.stderr.trim().slice(-200);
  return { args, note: `privileged mode fails here (${why}): all capabilities but ${lacking.join(', ') || 'none'}, unconfined, every device, /sys/fs/cgroup bound` };
}
