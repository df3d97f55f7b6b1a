/**
 * Metrics of the vmm-supervisor, in shared's process registry (served on /metrics, metricsListen
 * default 127.0.0.1:9465).
 *
 * prom-client is the copy shared depends on (same pinned version, one copy in the tree).
 */
import { registry } from '@sandnode/shared';
import path from 'node:path';
import { Counter, Gauge, Histogram } from 'prom-client';

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
 * hostCommands: host processes the supervisor started (through its command helpers or itself),
 * by command: the program's base name, and for runc its subcommand ("runc state", "umount").
 * Each one is a process start, the bulk of a VM stop's CPU time; the bench divides its rise
 * during a drain by the sandboxes drained.
 */
export const hostCommands = new Counter({
  name: 'sandnode_vmm_host_commands_total',
  help: 'Host processes started by the vmm-supervisor (runc, mount, umount, ip, nsenter), by command',
  labelNames: ['command'],
  registers: [registry],
});

/** commandLabel is hostCommands' label of `cmd args`: base name, plus the subcommand for runc (its first argument that is not an option or an option's value). Pure. */
export function commandLabel(cmd: string, args: readonly string[]): string {
  const name = path.basename(cmd);
  if (!name.startsWith('runc')) return name;
  for (let i = 0; i < args.length; i++) {
    const a = args[i]!;
    if (a === '--root' || a === '--log' || a === '--log-format') i++;
    else if (!a.startsWith('-')) return `runc ${a}`;
  }
  return 'runc';
}

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

/**
 * slotSetups: network slots made (a fresh acquire, a spare, a repair that made one anew), by
 * path: `netlink` (in-process: the network worker's rtnetlink and libc calls) or `spawn` (the
 * `unshare`/`ip`/`nsenter` processes: SANDNODE_SLOT_SETUP=spawn, tap mode, or a broken worker).
 */
export const slotSetups = new Counter({
  name: 'sandnode_vmm_slot_setups_total',
  help: 'Network slots the vmm-supervisor made, by path (netlink: in-process; spawn: ip/nsenter/unshare processes)',
  labelNames: ['path'] as const,
  registers: [registry],
});
