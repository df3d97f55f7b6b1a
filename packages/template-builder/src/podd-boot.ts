/**
 * podd's V8 code cache, made at template build (issue 14: podd's start was most of a cold
 * create). /opt/sandnode/podd-boot.js (what the init runs) turns on Node's compile cache
 * (`module.enableCompileCache`, portable: entries keyed by the bundle's path relative to the
 * cache dir, the same in the builder's temp dir and in the sandbox) in /opt/sandnode/compile-cache,
 * then loads podd.js. The builder fills the cache with one `podd-boot.js --help` run (podd loads
 * every module and exits; nothing listens) by the template's own Node. (A whole start of podd,
 * in a chroot, made an entry of the same size, ~520 KB: Node caches what a module's compile
 * made, not the functions compiled later, so the build does not run a root podd for nothing.)
 *
 * A cache is never trusted blindly: the boot uses it only when its manifest names the Node
 * version and arch that runs the boot and the bundle's size; Node itself keys the cache dir by
 * its version, arch and V8 flags and checks each entry's source hash (a changed bundle: miss)
 * and the entry's own checksum (a damaged cache: miss); a miss compiles from source as
 * without a cache. A sandbox can change its own copy (the rootfs overlay): that only touches
 * its own podd, which it could replace as well; the host never reads it.
 */
import { createHash } from 'node:crypto';
import { chmod, mkdir, readFile, readdir, rm, writeFile } from 'node:fs/promises';
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

/**
 * buildCompileCache fills `<root>/opt/sandnode/compile-cache` (root: a populated rootfs dir
 * with podd.js and podd-boot.js) by running the boot with `--help` on nodePath, and writes the
 * manifest. Returns false (and leaves no cache) when the run made no cache entry; the template
 * then boots podd without one. Throws CommandError (INTERNAL) when the run fails.
 */
export async function buildCompileCache(root: string, nodePath: string, nodeVersion: string): Promise<boolean> {
  const at = (p: string) => path.join(root, p);
  const dir = at(ROOTFS_PATHS.poddCompileCache);
  const bundle = await readFile(at(ROOTFS_PATHS.podd));
  const arch = (await runHost(nodePath, ['-p', 'process.arch'])).trim();
  const manifest: CompileCacheManifest = { node: nodeVersion, arch, bundleBytes: bundle.length, bundleSha256: createHash('sha256').update(bundle).digest('hex') };
  await rm(dir, { recursive: true, force: true });
  await mkdir(dir, { recursive: true, mode: 0o755 });
  await writeFile(path.join(dir, COMPILE_CACHE_MANIFEST), `${JSON.stringify(manifest, null, 2)}\n`, { mode: 0o644 });
  await run(nodePath, [at(ROOTFS_PATHS.poddBoot), '--help'], { timeoutMs: HOST_COMMAND_TIMEOUT_MS });
  const entries = (await readdir(dir, { recursive: true, withFileTypes: true })).filter((e) => e.isFile() && e.name !== COMPILE_CACHE_MANIFEST);
  // Node writes its entries 0600 and its dirs by umask: readable by every user podd may run as
  // (a user namespace's root is not host root)
  for (const e of await readdir(dir, { recursive: true, withFileTypes: true })) await chmod(path.join(e.parentPath, e.name), e.isDirectory() ? 0o755 : 0o644);
  if (entries.length) return true;
  await rm(dir, { recursive: true, force: true });
  return false;
}
