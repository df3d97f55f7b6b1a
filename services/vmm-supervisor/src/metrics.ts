/**
 * Metrics of the vmm-supervisor, in shared's process registry (served on /metrics when
 * `metricsListen` is set).
 *
 * prom-client is the copy shared depends on (same pinned version, one copy in the tree).
 */
import { registry } from '@sandnode/shared';
import { Gauge } from 'prom-client';

/**
 * quarantinedRows: rows in the VM table's `quarantine` table (rows that could not be read and
 * are not served; see SqliteVmStore), set at start and raised by every row moved later.
 */
export const quarantinedRows = new Gauge({
  name: 'sandnode_vmm_quarantined_rows',
  help: 'VM-table rows of the vmm-supervisor set aside in its quarantine table (unreadable, not served)',
  registers: [registry],
});
