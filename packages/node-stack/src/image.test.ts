import { existsSync, lstatSync, mkdirSync, readFileSync, readlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { useTempDir } from '@sandnode/testkit';
import { buildNodeImage, imagePaths, nodeImageTag, runtimeModules, stageImageRoot } from './image';

const tmp = useTempDir('node-image-');

/** A build dir with a package-lock.json (v3) of the given packages and those files present. */
function build(packages: Record<string, object>, files: string[]): string {
  const dir = tmp();
  writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ name: 'sandnode', version: '1.2.3' }));
  writeFileSync(path.join(dir, 'package-lock.json'), JSON.stringify({ lockfileVersion: 3, packages: { '': {}, ...packages } }));
  for (const f of files) {
    mkdirSync(path.dirname(path.join(dir, f)), { recursive: true });
    writeFileSync(path.join(dir, f), '');
  }
  for (const p of Object.keys(packages)) if (p.includes('node_modules/')) mkdirSync(path.join(dir, p), { recursive: true });
  return dir;
}

describe('runtimeModules', () => {
  const pkgs = {
    'services/server': { dependencies: { a: '1', '@sandnode/shared': '1' }, devDependencies: { jest: '1' } },
    'packages/shared': { dependencies: { b: '1' } },
    'tools/bench': { dependencies: { heavy: '1' } },
    'node_modules/@sandnode/server': { link: true, resolved: 'services/server' },
    'node_modules/@sandnode/shared': { link: true, resolved: 'packages/shared' },
    'node_modules/@sandnode/bench': { link: true, resolved: 'tools/bench' },
    'node_modules/a': { dependencies: { c: '2' }, optionalDependencies: { gone: '1' } },
    'node_modules/a/node_modules/c': {},
    'node_modules/b': { dependencies: { c: '1' }, peerDependencies: { p: '1' }, peerDependenciesMeta: { p: { optional: true } } },
    'node_modules/c': {},
    'node_modules/jest': { dev: true },
    'node_modules/heavy': {},
  };

  it("takes the runtime workspaces' closure, resolved like Node (nested first), and their links; not a tooling workspace's or dev deps", () => {
    const dir = build(pkgs, []);
    expect(runtimeModules(dir)).toEqual(['node_modules/@sandnode/server', 'node_modules/@sandnode/shared', 'node_modules/a', 'node_modules/a/node_modules/c', 'node_modules/b', 'node_modules/c']);
  });

  it('fails naming a required dependency the lockfile lacks; an optional one may be absent', () => {
    const dir = build({ ...pkgs, 'node_modules/b': { dependencies: { missing: '1' } } }, []);
    expect(() => runtimeModules(dir)).toThrow(/node_modules\/b needs missing/);
  });

  it('refuses a lockfile v1 (no packages map)', () => {
    const dir = tmp();
    writeFileSync(path.join(dir, 'package-lock.json'), JSON.stringify({ lockfileVersion: 1, dependencies: {} }));
    expect(() => runtimeModules(dir)).toThrow(/lockfileVersion 2 or 3/);
  });
});

describe('imagePaths', () => {
  it('runtime: only the runtime workspaces, their data files and the module closure, never a nested entry of a listed dir twice', () => {
    const dir = build({ 'services/server': { dependencies: { a: '1' } }, 'node_modules/a': { dependencies: { c: '1' } }, 'node_modules/a/node_modules/c': {} }, [
      'services/server/package.json',
      'services/server/dist/main.js',
      'services/server/src/main.ts',
      'services/vmm-supervisor/seccomp/sandbox.json',
      'tools/bench/dist/main.js',
      'tools/cli/bin/sandnode.js',
      'packages/shared/descriptor/sandnode.binpb',
      'deploy/prestop.sh',
    ]);
    expect(imagePaths(dir, 'runtime')).toEqual([
      'package.json',
      'packages/shared/descriptor',
      'deploy',
      'services/server/package.json',
      'services/server/dist',
      'services/vmm-supervisor/seccomp',
      'tools/cli/bin',
      'node_modules/a',
    ]);
    expect(imagePaths(dir, 'all')).toContain('node_modules');
    expect(imagePaths(dir, 'all')).toContain('tools/bench/dist');
  });
});

describe('nodeImageTag', () => {
  it('is <repo>:<package.json version>; a version that is no valid tag is refused', () => {
    const dir = tmp();
    writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ version: '0.3.0-dev' }));
    expect(nodeImageTag(dir)).toBe('sandnode:0.3.0-dev');
    expect(nodeImageTag(dir, 'registry.example.com/sandnode/sandnode')).toBe('registry.example.com/sandnode/sandnode:0.3.0-dev');
    writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ version: '1.0.0+build/x' }));
    expect(() => nodeImageTag(dir)).toThrow(/not a valid image tag/);
  });
});

describe('stageImageRoot', () => {
  it('makes a merged-/usr root: node, a real /bin/sh (dash, not busybox), busybox applets for the rest, the CLI wrapper and marker', () => {
    const root = tmp();
    const r = stageImageRoot(root, process.execPath, ['busybox', 'dash', 'runc']);
    expect(readlinkSync(path.join(root, 'bin'))).toBe('usr/bin');
    expect(lstatSync(path.join(root, 'usr/local/bin/node')).size).toBeGreaterThan(1e6);
    expect(readlinkSync(path.join(root, 'usr/bin/sh'))).toBe('dash');
    expect(readlinkSync(path.join(root, 'usr/bin/ls'))).toBe('busybox');
    expect(lstatSync(path.join(root, 'usr/bin/runc')).isFile()).toBe(true);
    expect(readFileSync(path.join(root, 'usr/local/bin/sandnode'), 'utf8')).toContain('/app/tools/cli/bin/sandnode.js');
    expect(JSON.parse(readFileSync(path.join(root, 'app/node_modules/.sandnode-node.json'), 'utf8'))).toEqual({ node: '/usr/local/bin/node', modules: process.versions.modules });
    expect(r.missing).toEqual([]);
    expect(r.fingerprint).toMatch(/^[0-9a-f]{64}$/);
    // node's libraries (ldd) are in the image
    expect(existsSync(path.join(root, 'usr/lib/x86_64-linux-gnu/libc.so.6'))).toBe(true);
  });
});

describe('buildNodeImage', () => {
  it.each(['--help', 'Sandnode:1', 'sandnode', 'sandnode:', 'a b:1', 'sandnode:-x', 'sandnode:1;rm'])('refuses the image reference %j before doing anything', async (tag) => {
    await expect(buildNodeImage({ buildDir: tmp(), tag, node: process.execPath, commit: '', version: '1', docker: '/nonexistent/docker' })).rejects.toThrow(/is not <name>:<tag>/);
  });
});
