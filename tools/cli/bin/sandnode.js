#!/usr/bin/env node
// The `sandnode` CLI entry point. A committed file (not dist/) so that `npm ci` links the bin
// even before the first build; the CLI itself is built into dist/ by `npm run build`.
try {
  require('../dist/main.js');
} catch (err) {
  if (err && err.code === 'MODULE_NOT_FOUND' && String(err.message).includes('dist/main.js')) {
    process.stderr.write('sandnode: not built yet; run: npm run build\n');
    process.exit(1);
  }
  throw err;
}
