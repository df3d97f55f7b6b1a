/**
 * Metrics of the server, in shared's process registry (served on /metrics by the active
 * server; MetricsEndpoint in server-node.ts):
 *
 *   sandnode_sandboxes{state}                       gauge, records by lifecycle state (read at scrape)
 *   sandnode_handover_hold_window_seconds           histogram, lifecycle calls held during a takeover (new server)
 *   sandnode_adoption_seconds{how}                  histogram, adoption of the node's records when a server becomes active
 *   sandnode_fork_seconds{method}                   histogram, ForkSandbox end to end
 *   sandnode_fork_freeze_window_seconds{method}     histogram, time the parent was held (frozen or paused) by a fork
 *   sandnode_drain_seconds                          histogram, one node drain
 *   sandnode_drain_sandbox_seconds{outcome}         histogram, one sandbox of a drain
 *   sandnode_pool_*                                 warm-pool gauges by pool (core/pool-metrics.ts)
 *
 * prom-client is the copy shared depends on (same pinned version, one copy in the tree).
 */
import { registry } from '@sandnode/shared';
import { Gauge, Histogram } from 'prom-client';
import type { SandboxState } from './core/types';

const SECONDS_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];
/** Every state a gauge series is kept for (0 when no record is in it). */
const STATES: SandboxState[] = ['CREATING', 'RUNNING', 'PAUSED', 'DELETING', 'ERROR', 'DRAINED', 'UNKNOWN'];

let stateSource: (() => Iterable<{ state: string }>) | undefined;

/** sandboxesByState: records by state, counted from the source set with {@link setSandboxSource} at each scrape. */
export const sandboxesByState = new Gauge({
  name: 'sandnode_sandboxes',
  help: 'Sandbox records of the active server by lifecycle state',
  labelNames: ['state'] as const,
  registers: [registry],
  collect() {
    this.reset();
    if (!stateSource) return;
    const n = new Map<string, number>(STATES.map((s) => [s, 0]));
    for (const r of stateSource()) n.set(r.state, (n.get(r.state) ?? 0) + 1);
    for (const [state, count] of n) this.set({ state }, count);
  },
});

/** setSandboxSource names what sandnode_sandboxes counts (the active server's records); undefined: nothing (not active). */
export function setSandboxSource(source: (() => Iterable<{ state: string }>) | undefined): void {
  stateSource = source;
}

export const handoverHoldWindow = new Histogram({
  name: 'sandnode_handover_hold_window_seconds',
  help: 'Takeover: from the moment the old server held lifecycle calls to the moment the new one served them, seconds',
  buckets: SECONDS_BUCKETS,
  registers: [registry],
});

export const adoption = new Histogram({
  name: 'sandnode_adoption_seconds',
  help: "Adoption of the node's sandbox records when a server becomes active, seconds; how: start | takeover",
  labelNames: ['how'] as const,
  buckets: SECONDS_BUCKETS,
  registers: [registry],
});

export const forkDuration = new Histogram({
  name: 'sandnode_fork_seconds',
  help: 'ForkSandbox end to end, seconds; method: quiesce | pause | paused-parent',
  labelNames: ['method'] as const,
  buckets: SECONDS_BUCKETS,
  registers: [registry],
});

export const forkFreezeWindow = new Histogram({
  name: 'sandnode_fork_freeze_window_seconds',
  help: 'Time a fork held its parent (filesystems frozen or VM paused), seconds',
  labelNames: ['method'] as const,
  buckets: SECONDS_BUCKETS,
  registers: [registry],
});

export const drainDuration = new Histogram({
  name: 'sandnode_drain_seconds',
  help: 'One node drain (AdminService.Drain or SIGTERM drain), seconds',
  buckets: SECONDS_BUCKETS,
  registers: [registry],
});

export const drainSandbox = new Histogram({
  name: 'sandnode_drain_sandbox_seconds',
  help: 'One sandbox of a drain, seconds; outcome: preserved | failed',
  labelNames: ['outcome'] as const,
  buckets: SECONDS_BUCKETS,
  registers: [registry],
});

/** observeFork records a fork that ran (ForkResult's method, forkMs and parentHeldMs, ms). */
export function observeFork(r: { method: string; forkMs: number; parentHeldMs: number }): void {
  if (r.method === 'existing') return; // a replayed request_id: no fork ran
  forkDuration.observe({ method: r.method }, r.forkMs / 1000);
  forkFreezeWindow.observe({ method: r.method }, r.parentHeldMs / 1000);
}

/** observeDrain records a drain report (durations in ms). */
export function observeDrain(r: { durationMs: number; sandboxes: { outcome: string; ms: number }[] }): void {
  drainDuration.observe(r.durationMs / 1000);
  for (const s of r.sandboxes) drainSandbox.observe({ outcome: s.outcome }, s.ms / 1000);
}
