/**
 * podd's V8 code cache, made at template build (issue 14: podd's start was most of a cold
 * create). /opt/sandnode/podd-boot.js (what the init runs) turns on Node's compile cache
 * (`module.enableCompileCache`, portable: entries keyed by the bundle's path relative to the
 * cache dir, the same in the builder's temp dir and in the sandbox) in /opt/sandnode/compile-cache,
 * then loads podd.js. The builder fills the cache with one start of podd in a chroot of the new
 * rootfs, stopped once it listens (else one `podd-boot.js --help` run: every module loaded,
 * nothing listens), by the template's own Node.
 *
 * A cache is never trusted blindly: the boot uses it only when its manifest names the Node
 * version and arch that runs the boot and the bundle's size; Node itself keys the cache dir by
 * its version, arch and V8 flags and checks each entry's source hash (a changed bundle: miss)
 * and the entry's own checksum (a damaged cache: miss); a miss compiles from source as
 * without a cache. A sandbox can change its own copy (the rootfs overlay): that only touches
 * its own podd, which it could replace as well; the host never reads it.
 */
import { createHash } from 'node:crypto';
import { spawn } from 'node:child_process';
import { chmod, mkdir, readFile, readdir, rm, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { run } from '@sandnode/shared';
import { HOST_COMMAND_TIMEOUT_MS, runHost } from './elf';
import { ROOTFS_PATHS } from './layout';

/** Name of the cache's manifest in the cache dir. */
export const COMPILE_CACHE_MANIFEST = 'manifest.json';

/** The cache manifest: who made the cache, from which bundle. */
export interface CompileCacheManifest {
  /** `process.version` of the Node that made it, e.g. "v24.22.3" */
  node: string;
  /** `process.arch`, e.g. "x64" */
  arch: string;
  /** bytes of podd.js it was made from */
  bundleBytes: number;
  /** sha256 (hex) of podd.js it was made from (for people; the boot checks the size, Node the content) */
  bundleSha256: string;
}

/**
 * poddBootScript is /opt/sandnode/podd-boot.js: turns the compile cache on when its manifest
 * matches this Node and bundle (else says why on stderr, once, and runs without), then loads
 * podd.js. Without module.enableCompileCache (Node < 22.1) podd runs without a cache.
 */
export function poddBootScript(): string {
  const podd = path.basename(ROOTFS_PATHS.podd);
  const cache = path.relative(path.dirname(ROOTFS_PATHS.podd), ROOTFS_PATHS.poddCompileCache);
  return `'use strict';
// podd-boot (written by the template builder): podd with the V8 code cache made at build.
const fs = require('node:fs');
const path = require('node:path');
const mod = require('node:module');
const bundle = path.join(__dirname, ${JSON.stringify(podd)});
const dir = path.join(__dirname, ${JSON.stringify(cache)});
let why = '';
try {
  const m = JSON.parse(fs.readFileSync(path.join(dir, ${JSON.stringify(COMPILE_CACHE_MANIFEST)}), 'utf8'));
  if (m.node !== process.version || m.arch !== process.arch) why = 'made by node ' + m.node + ' ' + m.arch + ', this is ' + process.version + ' ' + process.arch;
  else if (m.bundleBytes !== fs.statSync(bundle).size) why = 'made from another podd.js (' + m.bundleBytes + ' bytes)';
  else if (typeof mod.enableCompileCache !== 'function') why = 'this node has no module.enableCompileCache';
} catch (err) {
  why = 'no usable manifest (' + err.message + ')';
}
if (why) process.stderr.write('podd-boot: compile cache not used: ' + why + '\\n');
else mod.enableCompileCache({ directory: dir, portable: true });
require(bundle);
`;
}

/** Where the warm-up podd listens, inside the rootfs (removed after). */
const WARM_SOCKET = '/run/sandnode/compile-cache-warm.sock';

/**
 * warmStart starts podd once in a chroot of root (the template's own Node, its own /run: every
 * path podd touches is the new rootfs's) until it says "podd listening", then stops it with
 * SIGTERM: at its exit Node writes the cache of every function the start compiled. root is
 * 0700 meanwhile (host users cannot reach the socket of that root podd), the socket removed
 * after. Resolves false when the run did not get there (no chroot, not root, podd failed,
 * HOST_COMMAND_TIMEOUT_MS passed: the process killed).
 */
async function warmStart(root: string): Promise<boolean> {
  const mode = (await stat(root)).mode & 0o7777;
  await chmod(root, 0o700);
  try {
    const child = spawn('chroot', [root, ROOTFS_PATHS.node, ROOTFS_PATHS.poddBoot, '--socket', WARM_SOCKET], { stdio: ['ignore', 'ignore', 'pipe'], env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin' } });
    let listening = false;
    let text = '';
    child.stderr.setEncoding('utf8').on('data', (d: string) => {
      text = (text + d).slice(-4096);
      if (!listening && text.includes('"podd listening"')) {
        listening = true;
        child.kill('SIGTERM');
      }
    });
    const timer = setTimeout(() => child.kill('SIGKILL'), HOST_COMMAND_TIMEOUT_MS);
    const code = await new Promise<number | null>((resolve) => {
      child.on('error', () => resolve(-1));
      child.on('exit', (c) => resolve(c));
    });
    clearTimeout(timer);
    return listening && code === 0;
  } finally {
    await rm(path.join(root, WARM_SOCKET), { force: true });
    await chmod(root, mode);
  }
}

/**
 * buildCompileCache fills `<root>/opt/sandnode/compile-cache` (root: a populated rootfs dir
 * with podd.js and podd-boot.js) by one start of podd (warmStart), else by running the boot with
 * `--help` on nodePath, and writes the manifest. Returns false (and leaves no cache) when the run made no cache entry; the template
 * then boots podd without one. Throws CommandError (INTERNAL) when the `--help` run fails.
 */
export async function buildCompileCache(root: string, nodePath: string, nodeVersion: string): Promise<'start' | 'help' | undefined> {
  const at = (p: string) => path.join(root, p);
  const dir = at(ROOTFS_PATHS.poddCompileCache);
  const bundle = await readFile(at(ROOTFS_PATHS.podd));
  const arch = (await runHost(nodePath, ['-p', 'process.arch'])).trim();
  const manifest: CompileCacheManifest = { node: nodeVersion, arch, bundleBytes: bundle.length, bundleSha256: createHash('sha256').update(bundle).digest('hex') };
  await rm(dir, { recursive: true, force: true });
  await mkdir(dir, { recursive: true, mode: 0o755 });
  await writeFile(path.join(dir, COMPILE_CACHE_MANIFEST), `${JSON.stringify(manifest, null, 2)}\n`, { mode: 0o644 });
  // a whole start caches the functions it compiles too; where chroot is refused, the module loads of `--help`
  const by = (await warmStart(root)) ? 'start' : 'help';
  if (by === 'help') await run(nodePath, [at(ROOTFS_PATHS.poddBoot), '--help'], { timeoutMs: HOST_COMMAND_TIMEOUT_MS });
  const entries = (await readdir(dir, { recursive: true, withFileTypes: true })).filter((e) => e.isFile() && e.name !== COMPILE_CACHE_MANIFEST);
  // Node writes its entries 0600 and its dirs by umask: readable by every user podd may run as
  // (a user namespace's root is not host root)
  for (const e of await readdir(dir, { recursive: true, withFileTypes: true })) await chmod(path.join(e.parentPath, e.name), e.isDirectory() ? 0o755 : 0o644);
  if (entries.length) return by;
  await rm(dir, { recursive: true, force: true });
  return undefined;
}
