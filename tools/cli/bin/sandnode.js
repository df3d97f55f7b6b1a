#!/usr/bin/env node
// The `sandnode` CLI entry point. A committed file (not dist/) so that `npm ci` links the bin
// even before the first build; the CLI itself is built into dist/ by `npm run build`.
//
// Runtime: the CLI runs on the Node the repository's node_modules were built for, named by
// node_modules/.sandnode-node.json (deploy/host-setup.sh writes it; on a machine whose own node
// is older than 22 that is .toolchain/node-<version>/bin/node). Started by another Node (e.g.
// `npx sandnode` on Debian's node 20), it re-executes itself on that one, forwarding
// arguments, stdio, SIGTERM/SIGHUP and the exit status; every daemon the CLI starts inherits it
// (they are spawned with process.execPath).
'use strict';
const { existsSync, readFileSync } = require('node:fs');
const path = require('node:path');

/** Oldest Node major the CLI runs on (package.json engines). */
const MIN_NODE_MAJOR = 22;

/** projectNode returns the marker's {node, modules} of the nearest node_modules above dir, or undefined. */
function projectNode(dir) {
  for (let d = dir; ; d = path.dirname(d)) {
    const f = path.join(d, 'node_modules', '.sandnode-node.json');
    if (existsSync(f)) {
      try {
        const m = JSON.parse(readFileSync(f, 'utf8'));
        return typeof m.node === 'string' && existsSync(m.node) ? m : undefined;
      } catch {
        return undefined;
      }
    }
    if (path.dirname(d) === d) return undefined;
  }
}

function reexec(node) {
  const { spawn } = require('node:child_process');
  const child = spawn(node, [__filename, ...process.argv.slice(2)], { stdio: 'inherit' });
  // Ctrl-C reaches the child from the terminal itself (same process group): only wait for it
  process.on('SIGINT', () => undefined);
  for (const sig of ['SIGTERM', 'SIGHUP']) process.on(sig, () => child.kill(sig));
  child.on('error', (err) => {
    process.stderr.write(`sandnode: cannot run ${node}: ${err.message}\n`);
    process.exit(1);
  });
  child.on('exit', (code, signal) => {
    if (signal) {
      process.removeAllListeners(signal);
      process.kill(process.pid, signal);
    }
    process.exit(code ?? 1);
  });
}

const want = projectNode(__dirname);
if (want && String(want.modules) !== process.versions.modules && path.resolve(want.node) !== process.execPath) {
  reexec(want.node);
} else if (Number(process.versions.node.split('.')[0]) < MIN_NODE_MAJOR) {
  process.stderr.write(`sandnode: needs Node >= ${MIN_NODE_MAJOR}, this is ${process.version}; run: bash deploy/host-setup.sh (it provides Node 24 in .toolchain/)\n`);
  process.exit(1);
} else {
  // "not built" only when dist/main.js itself is absent: a module missing *below* it (npm deps
  // being reinstalled, a workspace package not built) names dist/main.js in its require stack
  // too, and must be reported as what it is.
  const main = path.join(__dirname, '..', 'dist', 'main.js');
  if (!existsSync(main)) {
    process.stderr.write('sandnode: not built yet; run: npm run build\n');
    process.exit(1);
  }
  try {
    require(main);
  } catch (err) {
    if (err && err.code === 'MODULE_NOT_FOUND') {
      const what = String(err.message).split('\n')[0];
      process.stderr.write(`sandnode: ${what}: dependencies missing or not built; run: bash deploy/host-setup.sh && npm run build\n`);
      process.exit(1);
    }
    throw err;
  }
}
