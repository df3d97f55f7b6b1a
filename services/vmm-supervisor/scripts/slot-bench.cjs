#!/usr/bin/env node
/**
 * Slot setup timing of the vmm-supervisor's network (issue 12 §6; the bench proper is in
 * tools/bench): `node services/vmm-supervisor/scripts/slot-bench.cjs [N]` (root; build first).
 * Measures NetworkManager.acquire (slot in use with its rules applied) N times fresh (no spare:
 * netns + veth + addresses + one nft transaction) and N times from a spare (one nft
 * transaction), releasing each; prints p50/p99 in ms. Uses its own tag, a /24 of
 * 10.209.128.0/17 and a temp dir; removes everything it made.
 */
const { mkdtempSync, rmSync } = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { performance } = require('node:perf_hooks');
const Database = require('better-sqlite3');
const dist = path.resolve(__dirname, '..', 'dist');
const { createLogger, parseCidrList, DEFAULT_ALWAYS_DENIED } = require('@sandnode/shared');
const { makeLayout } = require(path.join(dist, 'network/layout'));
const { NetworkManager } = require(path.join(dist, 'network/manager'));
const { SlotStore } = require(path.join(dist, 'network/slot-store'));
const host = require(path.join(dist, 'network/net-host'));
const { closeCommands } = require(path.join(dist, 'drivers/command-runner'));

const N = Number(process.argv[2] ?? 50);
const pct = (xs, p) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.ceil((p / 100) * xs.length) - 1)];

async function run(tag, spares) {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'slot-bench-'));
  const pool = `10.209.${128 + Math.floor(Math.random() * 128)}.0/24`;
  const layout = makeLayout(pool, tag, dir);
  const log = createLogger('slot-bench', '0', 'silent');
  const db = new Database(path.join(dir, 'db'));
  const m = new NetworkManager({
    layout,
    store: new SlotStore(db),
    spareTarget: spares,
    log,
    nft: { layout, dnsPort: 15053, egressProxyPort: 15080, proxiedPorts: [80, 443], alwaysDenied: parseCidrList([...DEFAULT_ALWAYS_DENIED, pool], 'd') },
  });
  const times = [];
  try {
    await m.start(new Map());
    if (!m.status().enabled) throw new Error(m.status().disabledReason);
    for (let i = 0; i < N; i++) {
      await m.idle();
      const t = performance.now();
      await m.acquire(`vm-${i}`, { owner: `sb-${i}`, slot: -1, egress: { allowOut: ['198.51.100.0/24'], denyOut: [], blockAll: true } });
      times.push(performance.now() - t);
      await m.release(`vm-${i}`, false);
    }
  } finally {
    await m.close();
    for (const r of m.slots()) await host.destroySlot(layout && m.addresses(r.slot)).catch(() => undefined);
    await host.deleteTable(layout);
    await host.removeDockerAllow(layout);
    db.close();
    rmSync(dir, { recursive: true, force: true });
  }
  return times;
}

(async () => {
  const fresh = await run(`b${Math.random().toString(36).slice(2, 5)}`, 0);
  const spare = await run(`c${Math.random().toString(36).slice(2, 5)}`, 1);
  const fmt = (t) => `p50 ${pct(t, 50).toFixed(2)} ms, p99 ${pct(t, 99).toFixed(2)} ms, n=${t.length}`;
  process.stdout.write(`slot setup fresh: ${fmt(fresh)}\nslot setup from a spare: ${fmt(spare)}\n`);
  closeCommands();
})().catch((err) => {
  process.stderr.write(`${err.stack ?? err}\n`);
  closeCommands();
  process.exit(1);
});
