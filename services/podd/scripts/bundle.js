#!/usr/bin/env node
/**
 * Bundles podd into dist/podd.bundle.js: one file that runs with plain `node` and no
 * node_modules (it is copied into sandbox templates as /opt/sandnode/podd.js). Defines the
 * build constants shared/src/version.ts reads: __SANDNODE_VERSION__ (this package's version)
 * and __SANDNODE_COMMIT__ (SANDNODE_BUILD_COMMIT, else `git rev-parse HEAD`, else "unknown").
 * It bundles the TypeScript sources (src/main.ts, and @sandnode/shared's src/ with its generated
 * protos), not tsc's CommonJS output: from ES modules esbuild leaves out what podd never imports
 * (podd listened 113-149 ms after exec instead of 143-231 ms, compile cache warm: podd's start is
 * most of a cold create's wait for podd). Run after `npm run gen` and `tsc -b
 * services/podd/tsconfig.build.json` (the type check; dist/ is not read). Copies koffi's
 * native module (linux glibc build) beside the bundle as dist/koffi.node: podd's pty support
 * (src/core/pty.ts) loads it from there, and the template builder copies it into templates.
 */
'use strict';
const { execFileSync } = require('node:child_process');
const { copyFileSync, readFileSync, existsSync } = require('node:fs');
const path = require('node:path');
const esbuild = require('esbuild');

const pkgDir = path.resolve(__dirname, '..');
const entry = path.join(pkgDir, 'src', 'main.ts');
const sharedSrc = path.resolve(pkgDir, '..', '..', 'packages', 'shared', 'src');

/** sharedSources resolves @sandnode/shared to its src/index.ts and @sandnode/shared/proto/X to src/gen/sandnode/X.ts. */
const sharedSources = {
  name: 'sandnode-shared-sources',
  setup(b) {
    b.onResolve({ filter: /^@sandnode\/shared(\/proto\/.+)?$/ }, (a) => {
      const file = a.path === '@sandnode/shared' ? path.join(sharedSrc, 'index.ts') : path.join(sharedSrc, 'gen', 'sandnode', `${a.path.slice('@sandnode/shared/proto/'.length)}.ts`);
      if (!existsSync(file)) return { errors: [{ text: `${a.path}: ${file} is missing (run \`npm run gen\`)` }] };
      return { path: file };
    });
  },
};
const outfile = path.join(pkgDir, 'dist', 'podd.bundle.js');

function commit() {
  if (process.env.SANDNODE_BUILD_COMMIT) return process.env.SANDNODE_BUILD_COMMIT;
  try {
    return (
      execFileSync('git', ['rev-parse', 'HEAD'], { cwd: pkgDir, stdio: ['ignore', 'pipe', 'ignore'], timeout: 5000 })
        .toString()
        .trim() || 'unknown'
    );
  } catch {
    return 'unknown';
  }
}

/** koffiNative is the path of koffi's prebuilt module for this platform (glibc), or undefined. */
function koffiNative() {
  try {
    const dir = path.dirname(require.resolve(`@koromix/koffi-${process.platform}-${process.arch}/package.json`, { paths: [path.dirname(require.resolve('koffi'))] }));
    const p = path.join(dir, `${process.platform}_${process.arch}`, 'koffi.node');
    return existsSync(p) ? p : undefined;
  } catch {
    return undefined;
  }
}

async function main() {
  if (!existsSync(entry)) {
    console.error(`bundle: ${entry} is missing`);
    process.exit(1);
  }
  const version = JSON.parse(readFileSync(path.join(pkgDir, 'package.json'), 'utf8')).version;
  const sha = commit();
  await esbuild.build({
    entryPoints: [entry],
    bundle: true,
    platform: 'node',
    target: 'node24',
    format: 'cjs',
    outfile,
    tsconfig: path.join(pkgDir, 'tsconfig.build.json'),
    plugins: [sharedSources],
    logLevel: 'warning',
    legalComments: 'none',
    define: {
      __SANDNODE_VERSION__: JSON.stringify(version),
      __SANDNODE_COMMIT__: JSON.stringify(sha),
    },
  });
  const native = koffiNative();
  if (native) copyFileSync(native, path.join(pkgDir, 'dist', 'koffi.node'));
  else console.error('bundle: koffi native module not found: podd in templates will not offer pty exec');
  console.error(`bundle: ${path.relative(process.cwd(), outfile)} (podd ${version}, commit ${sha})`);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
