/**
 * Metrics of the vmm-supervisor, in shared's process registry (served on /metrics, metricsListen
 * default 127.0.0.1:9465).
 *
 * prom-client is the copy shared depends on (same pinned version, one copy in the tree).
 */
import { registry } from '@sandnode/shared';
import { Gauge, Histogram } from 'prom-client';

/**
 * quarantinedRows: rows in the VM table's `quarantine` table (rows that could not be read and
 * are not served; see SqliteVmStore), set at start and raised by every row moved later.
 */
export const quarantinedRows = new Gauge({
  name: 'sandnode_vmm_quarantined_rows',
  help: 'VM-table rows of the vmm-supervisor set aside in its quarantine table (unreadable, not served)',
  registers: [registry],
});

/**
 * freezeWindow: per freeze of a VM's filesystems through its freeze port (fork's quiesce), the
 * time they were frozen, seconds; label `ended_by` says what thawed them (thaw, watchdog ...).
 */
export const freezeWindow = new Histogram({
  name: 'sandnode_vmm_freeze_window_seconds',
  help: "Time a VM's filesystems were frozen by one freeze-port freeze, seconds",
  labelNames: ['ended_by'] as const,
  buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
  registers: [registry],
});

/** observeFreezeWindow records an ended freeze (frozenMs in ms). */
export function observeFreezeWindow(r: { endedBy?: string; frozenMs?: number }): void {
  if (r.endedBy !== undefined && r.frozenMs !== undefined) freezeWindow.observe({ ended_by: r.endedBy }, r.frozenMs / 1000);
}
