/**
 * Prometheus metrics of the warm pools (pool.ts), read from the active pool at each scrape:
 * sandnode_pool_size / _ready / _filling (members), sandnode_pool_claimed / _missed (creates
 * answered from the pool / made cold since this server became active), labelled by pool key.
 */
import { Gauge, registry } from '@sandnode/shared';
import type { PoolStatusInfo } from './pool';

let source: (() => PoolStatusInfo[]) | undefined;

/** setPoolMetricsSource makes the metrics read status (the pool of the server that is active now); undefined: none. */
export function setPoolMetricsSource(status: (() => PoolStatusInfo[]) | undefined): void {
  source = status;
}

function gauge(name: string, help: string, pick: (s: PoolStatusInfo) => number): void {
  new Gauge({
    name,
    help,
    labelNames: ['pool'] as const,
    registers: [registry],
    collect() {
      this.reset();
      let pools: PoolStatusInfo[] = [];
      try {
        pools = source?.() ?? [];
      } catch {
        // records not readable now: no samples this scrape
      }
      for (const s of pools) this.set({ pool: s.key }, pick(s));
    },
  });
}

gauge('sandnode_pool_size', 'Configured size of each warm pool (members waiting unclaimed)', (s) => s.size);
gauge('sandnode_pool_ready', 'Warm pool members waiting now (RUNNING, unclaimed)', (s) => s.ready);
gauge('sandnode_pool_filling', 'Warm pool members being created now', (s) => s.filling);
gauge('sandnode_pool_claimed', 'Creates answered from the warm pool since this server became active', (s) => s.claimed);
gauge('sandnode_pool_missed', 'Creates of a pooled template made cold since this server became active', (s) => s.missed);
