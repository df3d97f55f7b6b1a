/** makeNetworkManager wires the node's NetworkManager from the config and the VM table's SQLite file. */
import type Database from 'better-sqlite3';
import { parseCidr, type Logger } from '@sandnode/shared';
import type { VmmConfig } from '../config';
import { makeLayout } from '@sandnode/shared';
import { NetworkManager } from './manager';
import { SlotStore } from './slot-store';

/** makeNetworkManager: config keys network, networkPool, networkTag, networkSpareSlots, dnsPort, egressProxyPort, egressProxiedPorts, networkAlwaysDenied. */
export function makeNetworkManager(cfg: VmmConfig, db: Database.Database, log: Logger): NetworkManager {
  const layout = makeLayout(cfg.networkPool, cfg.networkTag, cfg.runDir);
  const store = new SlotStore(db, (q) => log.warn({ slot: q.slot, reason: q.reason }, `network slot table: row of slot ${q.slot} cannot be read (${q.reason}); quarantined, slot not handed out`));
  return new NetworkManager({
    layout,
    store,
    spareTarget: cfg.networkSpareSlots,
    mode: cfg.driver === 'firecracker' ? 'tap' : 'veth',
    log,
    off: cfg.network ? undefined : 'network is off in the config (key "network")',
    nft: {
      layout,
      dnsPort: cfg.dnsPort,
      egressProxyPort: cfg.egressProxyPort,
      proxiedPorts: cfg.egressProxiedPorts,
      alwaysDenied: cfg.networkAlwaysDenied.map((c) => parseCidr(c)),
    },
  });
}
