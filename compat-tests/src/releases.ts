/**
 * Builds of sandnode for the compatibility matrix: the releases listed in
 * `compat-tests/releases.json` (built from git into a cache, reused while the commit is
 * unchanged) and the working tree (N, built by `npm run build`).
 *
 * A release is extracted with `git archive <commit>` (no worktree bookkeeping in .git), then
 * `npm ci` and `npm run build` run in it on the Node major the release ran on (releases.json
 * `node`, fetched into .toolchain/ by deploy/toolchain.sh, its headers as npm_config_nodedir),
 * and the build's node_modules/.sandnode-node.json names that Node: N's CLI starts the
 * build's daemons on it, so a mixed node runs mixed runtimes (nodeFor). A marker file records
 * the commit and Node; a build whose marker matches is reused as it is.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';

/** The repository root (this file is compat-tests/src/releases.ts or compat-tests/dist/releases.js). */
export const REPO_ROOT = path.resolve(__dirname, '..', '..');
/** Default cache of release builds (gitignored). */
export const DEFAULT_CACHE_DIR = path.join(REPO_ROOT, 'compat-tests', '.cache', 'builds');
const MARKER = '.sandnode-build.json';

/** One released version, as listed in releases.json. */
export interface Release {
  version: string;
  commit: string;
  /** the Node major the release ran on, e.g. "20" (built and run on the latest of it) */
  node: string;
}

/** The file in a build's node_modules naming the Node it was built for (as deploy/host-setup.sh writes it). */
const NODE_MARKER = path.join('node_modules', '.sandnode-node.json');

/**
 * nodeFor is the Node binary build b runs on (its CLI, daemons, template builder's copied
 * node): the one its node_modules were built for (NODE_MARKER: written by deploy/host-setup.sh
 * for N, by buildRelease for a release); process.execPath when b has no marker.
 */
export function nodeFor(b: Pick<Build, 'dir'>): string {
  try {
    const m = JSON.parse(readFileSync(path.join(b.dir, NODE_MARKER), 'utf8')) as { node?: unknown };
    if (typeof m.node === 'string' && existsSync(m.node)) return m.node;
  } catch {
    /* no marker */
  }
  return process.execPath;
}

/** toolchainNode provides Node `spec` (a major or exact version) with deploy/toolchain.sh; returns its dir. */
function toolchainNode(spec: string): string {
  const r = spawnSync('bash', [path.join(REPO_ROOT, 'deploy', 'toolchain.sh'), spec], { encoding: 'utf8' });
  const dir = r.stdout.trim();
  if (r.status !== 0 || !existsSync(path.join(dir, 'bin', 'node'))) throw new Error(`deploy/toolchain.sh ${spec} failed (exit ${r.status}): ${r.stderr.trim().slice(-1500)}`);
  return dir;
}

/** A build of sandnode on disk: `dir` holds services/<name>/dist/main.js for each component. */
export interface Build {
  /** "N" for the working tree, else the release version */
  label: string;
  version: string;
  commit: string;
  dir: string;
}

/** readReleases reads releases.json (oldest first). */
export function readReleases(file = path.join(REPO_ROOT, 'compat-tests', 'releases.json')): Release[] {
  const list = JSON.parse(readFileSync(file, 'utf8')) as Release[];
  for (const r of list) {
    if (!/^\d+\.\d+\.\d+/.test(r.version) || !/^[0-9a-f]{40}$/.test(r.commit) || !/^\d+(\.\d+\.\d+)?$/.test(r.node ?? '')) throw new Error(`releases.json: bad entry ${JSON.stringify(r)}`);
  }
  return list;
}

/** workingTreeBuild is N: this checkout (it must have been built). */
export function workingTreeBuild(): Build {
  const version = (JSON.parse(readFileSync(path.join(REPO_ROOT, 'package.json'), 'utf8')) as { version: string }).version;
  let commit = 'working-tree';
  try {
    commit = execFileSync('git', ['-C', REPO_ROOT, 'rev-parse', 'HEAD'], { encoding: 'utf8' }).trim();
  } catch {
    /* not a git checkout */
  }
  const b: Build = { label: 'N', version, commit, dir: REPO_ROOT };
  assertBuilt(b);
  return b;
}

/** assertBuilt throws naming the missing entry point when a build is incomplete. */
export function assertBuilt(b: Build): void {
  for (const c of ['vmm-supervisor', 'ublk-manager', 'server', 'podd']) {
    const main = path.join(b.dir, 'services', c, 'dist', 'main.js');
    if (!existsSync(main)) throw new Error(`build ${b.label} (${b.dir}) lacks ${main}: run npm run build there`);
  }
  if (!existsSync(path.join(b.dir, 'services', 'podd', 'dist', 'podd.bundle.js'))) throw new Error(`build ${b.label} lacks the podd bundle`);
}

/**
 * buildRelease returns a build of release r in cacheDir, building it when the cache has no
 * build of that commit. Progress lines go to log. Throws with the failing step's output.
 */
export function buildRelease(r: Release, opts: { cacheDir?: string; log?: (line: string) => void } = {}): Build {
  const log = opts.log ?? (() => undefined);
  const cache = opts.cacheDir ?? DEFAULT_CACHE_DIR;
  const dir = path.join(cache, `${r.version}-${r.commit.slice(0, 12)}`);
  const marker = path.join(dir, MARKER);
  const b: Build = { label: r.version, version: r.version, commit: r.commit, dir };
  const nodeDir = toolchainNode(r.node);
  const node = path.join(nodeDir, 'bin', 'node');
  if (existsSync(marker)) {
    const m = JSON.parse(readFileSync(marker, 'utf8')) as { commit?: string; node?: string };
    if (m.commit === r.commit && m.node === node && nodeFor(b) === node) {
      assertBuilt(b);
      log(`release ${r.version}: cached build at ${dir}`);
      return b;
    }
  }
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  const step = (what: string, cmd: string, args: string[], extra: { cwd?: string; input?: Buffer } = {}) => {
    const t0 = Date.now();
    const env = { ...process.env, SANDNODE_BUILD_COMMIT: r.commit, PATH: `${path.join(nodeDir, 'bin')}:${process.env.PATH ?? ''}`, npm_config_nodedir: nodeDir };
    const res = spawnSync(cmd, args, { cwd: extra.cwd ?? dir, input: extra.input, encoding: 'utf8', maxBuffer: 256 * 1024 * 1024, env });
    if (res.status !== 0) throw new Error(`release ${r.version}: ${what} failed (exit ${res.status}):\n${(res.stderr || res.stdout || '').slice(-3000)}`);
    log(`release ${r.version}: ${what} (${Date.now() - t0} ms)`);
  };
  const tar = spawnSync('git', ['-C', REPO_ROOT, 'archive', '--format=tar', r.commit], { maxBuffer: 1024 * 1024 * 1024 });
  if (tar.status !== 0) throw new Error(`release ${r.version}: git archive ${r.commit} failed: ${tar.stderr.toString().slice(-2000)} (is the commit in this clone?)`);
  step('extract', 'tar', ['-x', '-C', dir], { input: tar.stdout });
  step('npm ci', 'npm', ['ci', '--no-audit', '--no-fund', '--loglevel=error']);
  step('build', 'npm', ['run', 'build', '--silent']);
  assertBuilt(b);
  const nodeVersion = execFileSync(node, ['-p', 'process.versions.node + " " + process.versions.modules'], { encoding: 'utf8' }).trim().split(' ');
  writeFileSync(path.join(dir, NODE_MARKER), `${JSON.stringify({ node, version: nodeVersion[0], modules: nodeVersion[1] })}\n`);
  log(`release ${r.version}: built on node ${nodeVersion[0]} (${node})`);
  writeFileSync(marker, `${JSON.stringify({ version: r.version, commit: r.commit, node, builtAt: new Date().toISOString() })}\n`);
  return b;
}
