/**
 * podd's compile cache (podd-boot.ts): made at build, used by a boot anywhere the rootfs is
 * (portable), and ignored, with podd still running, when its manifest names another Node or
 * bundle, when the bundle changed, or when the cache is damaged. Node's own reads are seen
 * through NODE_DEBUG_NATIVE=COMPILE_CACHE.
 */
import { cpSync, mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { execFileSync, spawnSync } from 'node:child_process';
import path from 'node:path';
import { useTempDir } from '@sandnode/testkit';
import { ROOTFS_PATHS } from './layout';
import { buildCompileCache, COMPILE_CACHE_MANIFEST, poddBootScript } from './podd-boot';

const tmp = useTempDir('podd-boot');

/** A fake podd with enough code for a cache entry; prints its marker. */
const FAKE_PODD = `'use strict';\nfunction f(n) { let s = 0; for (let i = 0; i < n; i++) s += i; return s; }\nconsole.log('podd ran ' + f(10) + ' ' + require.main?.filename.length);\n`;

/** rootfs makes a root with podd.js and the boot, and builds its cache; returns the root. */
async function rootfs(name: string): Promise<string> {
  const root = path.join(tmp(), name);
  mkdirSync(path.join(root, path.dirname(ROOTFS_PATHS.podd)), { recursive: true });
  writeFileSync(path.join(root, ROOTFS_PATHS.podd), FAKE_PODD);
  writeFileSync(path.join(root, ROOTFS_PATHS.poddBoot), poddBootScript());
  expect(await buildCompileCache(root, process.execPath, process.version)).toBe(true);
  return root;
}

/** boot runs the root's podd-boot.js; its stdout and stderr (Node's cache debug lines included). */
function boot(root: string): { out: string; err: string } {
  const r = spawnSync(process.execPath, [path.join(root, ROOTFS_PATHS.poddBoot)], { env: { ...process.env, NODE_DEBUG_NATIVE: 'COMPILE_CACHE', NODE_COMPILE_CACHE: '' }, encoding: 'utf8' });
  expect(r.status).toBe(0);
  return { out: r.stdout, err: r.stderr };
}

/** cacheEntries lists the cache's entry files (the manifest excluded). */
function cacheEntries(root: string): string[] {
  const dir = path.join(root, ROOTFS_PATHS.poddCompileCache);
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile() && e.name !== COMPILE_CACHE_MANIFEST)
    .map((e) => path.join(e.parentPath, e.name));
}

const HIT = /reading cache from .* for CommonJS .*podd\.js\.\.\.\[[^\]]*\]\.\.\. success/;

describe('podd compile cache', () => {
  it('is made at build with its manifest and used by a boot of the rootfs copied elsewhere', async () => {
    const root = await rootfs('a');
    const m = JSON.parse(readFileSync(path.join(root, ROOTFS_PATHS.poddCompileCache, COMPILE_CACHE_MANIFEST), 'utf8')) as Record<string, unknown>;
    expect(m).toMatchObject({ node: process.version, arch: process.arch, bundleBytes: Buffer.byteLength(FAKE_PODD) });
    expect(m.bundleSha256).toMatch(/^[0-9a-f]{64}$/);
    expect(cacheEntries(root).length).toBe(1);
    for (const e of cacheEntries(root)) expect(statSync(e).mode & 0o777).toBe(0o644);
    const moved = path.join(tmp(), 'moved');
    cpSync(root, moved, { recursive: true });
    const r = boot(moved);
    expect(r.out).toContain('podd ran 45');
    expect(r.err).toMatch(HIT);
    expect(r.err).not.toContain('podd-boot: compile cache not used');
  });

  it('is ignored when its manifest names another node version: podd still runs', async () => {
    const root = await rootfs('b');
    const mp = path.join(root, ROOTFS_PATHS.poddCompileCache, COMPILE_CACHE_MANIFEST);
    writeFileSync(mp, JSON.stringify({ ...JSON.parse(readFileSync(mp, 'utf8')), node: 'v0.0.1' }));
    const r = boot(root);
    expect(r.out).toContain('podd ran 45');
    expect(r.err).toContain('podd-boot: compile cache not used: made by node v0.0.1');
    expect(r.err).not.toMatch(/reading cache/);
  });

  it('is ignored when the manifest is missing or not JSON: podd still runs', async () => {
    const root = await rootfs('c');
    writeFileSync(path.join(root, ROOTFS_PATHS.poddCompileCache, COMPILE_CACHE_MANIFEST), '{not json');
    const r = boot(root);
    expect(r.out).toContain('podd ran 45');
    expect(r.err).toContain('podd-boot: compile cache not used: no usable manifest');
  });

  it('is ignored when podd.js changed (another bundle of the same size): the new code runs', async () => {
    const root = await rootfs('d');
    writeFileSync(path.join(root, ROOTFS_PATHS.podd), FAKE_PODD.replace('podd ran', 'podd RAN'));
    const r = boot(root);
    expect(r.out).toContain('podd RAN 45');
    expect(r.err).toMatch(/code hash mismatch/);
    expect(r.err).not.toMatch(HIT);
  });

  it('is ignored when a cache entry is damaged: podd still runs', async () => {
    const root = await rootfs('e');
    const [entry] = cacheEntries(root);
    const b = readFileSync(entry!);
    b[b.length - 8] = (b[b.length - 8] ?? 0) ^ 0xff;
    writeFileSync(entry!, b);
    const r = boot(root);
    expect(r.out).toContain('podd ran 45');
    expect(r.err).toMatch(/cache hash mismatch/);
    expect(r.err).not.toMatch(HIT);
  });

  it('the boot script is plain node: it parses', () => {
    writeFileSync(path.join(tmp(), 'boot.js'), poddBootScript());
    execFileSync(process.execPath, ['--check', path.join(tmp(), 'boot.js')]);
  });
});
