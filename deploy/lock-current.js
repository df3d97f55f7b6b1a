#!/usr/bin/env node
/**
 * lock-current.js: whether node_modules was installed from this package-lock.json, by content
 * (host-setup.sh runs `npm ci` only when it was not). npm writes what it installed to
 * node_modules/.package-lock.json (its "hidden lockfile"); node_modules is current when every
 * package there has the version, resolved URL and integrity package-lock.json gives it, and
 * every package of package-lock.json missing there is an optional one (another platform's
 * binary). A comparison of mtimes, which this replaces, ran `npm ci` in every fresh checkout
 * or worktree (git gives the lock a new mtime) even when its content had not changed.
 *
 *   node deploy/lock-current.js [DIR]   # DIR: the repo root (default: cwd)
 *
 * Exit 0 and nothing printed: current. Exit 1 with one line on stdout saying why: not current
 * (no node_modules, no hidden lockfile, or the first package that differs).
 */
'use strict';
const fs = require('node:fs');
const path = require('node:path');

/**
 * staleReason: why node_modules in dir was not installed from its package-lock.json, or ''
 * when it was. Never throws: an unreadable or malformed file is a reason.
 * @param {string} dir the directory holding package-lock.json and node_modules
 * @returns {string}
 */
function staleReason(dir) {
  /** @returns {{ json?: any, err?: string }} */
  const read = (f) => {
    try {
      return { json: JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8')) };
    } catch (err) {
      return { err: err && err.code === 'ENOENT' ? 'missing' : String(err && err.message) };
    }
  };
  const lock = read('package-lock.json');
  if (lock.err !== undefined) return `package-lock.json: ${lock.err}`;
  const hidden = read('node_modules/.package-lock.json');
  if (hidden.err !== undefined) return `node_modules/.package-lock.json: ${hidden.err}`;
  const want = lock.json.packages ?? {};
  const have = hidden.json.packages ?? {};
  for (const [key, got] of Object.entries(have)) {
    const w = want[key];
    if (!w) return `${key} is installed but not in package-lock.json`;
    for (const field of ['version', 'resolved', 'integrity', 'link']) {
      if ((w[field] ?? null) !== (got[field] ?? null)) return `${key}: ${field} ${JSON.stringify(got[field] ?? null)} installed, ${JSON.stringify(w[field] ?? null)} locked`;
    }
  }
  for (const [key, w] of Object.entries(want)) {
    if (key !== '' && !(key in have) && !w.optional) return `${key} is locked but not installed`;
  }
  return '';
}

module.exports = { staleReason };

if (require.main === module) {
  const why = staleReason(path.resolve(process.argv[2] ?? '.'));
  if (why) {
    process.stdout.write(`${why}\n`);
    process.exit(1);
  }
}
