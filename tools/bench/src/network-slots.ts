/**
 * Slot setup of the network section (network.ts): the vmm-supervisor's own NetworkManager (the
 * code CreateVm runs for a networked VM), in this process on a test pool of its own (a /24,
 * tag and ports: @sandnode/testkit takeTestPool), timed around acquire: the slot in use with
 * its egress rules in force. "fresh": no spare (netns + veth + addresses + one nft
 * transaction); "pool": from a spare made in the background beforehand (one nft transaction).
 * Every acquire is released before the next; everything made is removed at the end. path:
 * "netlink" (in-process: the network worker) or "spawn" (ip/nsenter/unshare and `nft -i`), as
 * SANDNODE_SLOT_SETUP picks it on a node.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import nodePath from 'node:path';
import Database from 'better-sqlite3';
import { createLogger, DEFAULT_ALWAYS_DENIED, makeLayout, parseCidrList } from '@sandnode/shared';
import { takeTestPool } from '@sandnode/testkit';
import { NetworkManager } from '@sandnode/vmm-supervisor/dist/network/manager';
import { SlotStore } from '@sandnode/vmm-supervisor/dist/network/slot-store';
import { deleteTable, destroySlot, removeDockerAllow } from '@sandnode/vmm-supervisor/dist/network/net-host';
import { closeCommands } from '@sandnode/vmm-supervisor/dist/drivers/command-runner';
import type { SlotSetupPath } from '@sandnode/vmm-supervisor/dist/network/net-worker';

/** slotSetupMs acquires and releases a slot n times with spareTarget spares (0: fresh every time) through path and gives each acquire's ms. Needs root, nft, ip. */
export async function slotSetupMs(n: number, spareTarget: number, path: SlotSetupPath = 'netlink'): Promise<number[]> {
  const pool = takeTestPool();
  const dir = mkdtempSync(nodePath.join(os.tmpdir(), 'sandnode-bench-slots-'));
  const layout = makeLayout(pool.settings.pool!, pool.settings.tag!, dir);
  const db = new Database(nodePath.join(dir, 'vm-table.db'));
  // as the supervisor opens its VM table (sqlite-vm-store.ts): WAL, synchronous=FULL
  db.pragma('journal_mode = WAL');
  db.pragma('synchronous = FULL');
  const m = new NetworkManager({
    layout,
    store: new SlotStore(db),
    spareTarget,
    slotSetup: path,
    log: createLogger('bench-slots', '0', 'silent'),
    nft: {
      layout,
      dnsPort: pool.settings.dnsPort!,
      egressProxyPort: pool.settings.egressProxyPort!,
      proxiedPorts: [80, 443],
      alwaysDenied: parseCidrList([...DEFAULT_ALWAYS_DENIED, pool.settings.pool!], 'alwaysDenied'),
    },
  });
  const times: number[] = [];
  try {
    await m.start(new Map());
    if (!m.status().enabled) throw new Error(`slot setup: the network is off: ${m.status().disabledReason}`);
    for (let i = 0; i < n; i++) {
      await m.idle(); // the spare (if any) is made: not timed, as on a node between creates
      const t0 = performance.now();
      await m.acquire(`vm-${i}`, { owner: `sb-bench-${i}`, slot: -1, egress: { allowOut: ['198.51.100.0/24', 'allowed.test'], denyOut: [], blockAll: true } });
      times.push(performance.now() - t0);
      await m.release(`vm-${i}`, false);
    }
  } finally {
    await m.close();
    await m.idle().catch(() => undefined);
    for (const r of m.slots()) await destroySlot(m.addresses(r.slot)).catch(() => undefined);
    await deleteTable(layout).catch(() => undefined);
    await removeDockerAllow(layout).catch(() => undefined);
    db.close();
    rmSync(dir, { recursive: true, force: true });
    pool.release();
    closeCommands(); // the manager's command helpers (made again on the next use)
  }
  return times;
}
