/**
 * Metrics of the ublk-manager, in shared's process registry: the handover stall and the clone
 * copy time histograms.
 *
 * prom-client is imported directly: it is the copy shared depends on (hoisted, one copy in
 * the tree). It is not yet listed in this package's dependencies (see README "Not yet").
 */
import { registry } from '@sandnode/shared';
import { Histogram } from 'prom-client';

/**
 * handoverStall: per device, the time it did not serve I/O during a handover (quiesce start to
 * recover end), in seconds; label `mode` is the HandoverAll mode ("ownership-only" for loop).
 */
export const handoverStall = new Histogram({
  name: 'sandnode_ublk_handover_stall_seconds',
  help: 'Per-device stall of a ublk-manager slot handover (quiesce start to recover end), seconds',
  labelNames: ['mode'] as const,
  buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
  registers: [registry],
});

/**
 * cloneCopy: per CloneDevice that made a clone, the time the image copy took (cp(1), the window
 * in which the source is read), in seconds; label `reflinked` is "true" when the extents were
 * shared (FICLONE) rather than copied.
 */
export const cloneCopy = new Histogram({
  name: 'sandnode_ublk_clone_seconds',
  help: 'Image copy time of a ublk-manager CloneDevice (cp of the source image), seconds',
  labelNames: ['reflinked'] as const,
  buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
  registers: [registry],
});
