/**
 * Where each daemon of a node serves /metrics: read from the status files the daemons write
 * (`<runDir>/metrics/<component>.json`, @sandnode/shared MetricsEndpoint), for `sandnode up`
 * and `sandnode status`, and kept for the daemon's next start (a restarted or upgraded daemon
 * listens where its predecessor did unless its environment says otherwise).
 */
import { readMetricsStatus, type MetricsStatus } from '@sandnode/shared';
import { COMPONENTS, type Component } from './components';

/** The environment variable of each component's metricsListen. */
export const METRICS_LISTEN_ENV: Record<Component, string> = {
  'vmm-supervisor': 'SANDNODE_VMM_SUPERVISOR_METRICS_LISTEN',
  'ublk-manager': 'SANDNODE_UBLK_MANAGER_METRICS_LISTEN',
  server: 'SANDNODE_SERVER_METRICS_LISTEN',
};

/** One component's /metrics as its status file says: url null while not served (error says why), or no file at all (undefined). */
export type ComponentMetrics = Pick<MetricsStatus, 'listen' | 'url' | 'error' | 'pid'>;

/** metricsOf reads every component's metrics status (undefined for one that wrote none: metrics off, or a build without them). */
export function metricsOf(runDir: string): Record<Component, ComponentMetrics | undefined> {
  return Object.fromEntries(COMPONENTS.map((c) => [c, readMetricsStatus(runDir, c)])) as Record<Component, ComponentMetrics | undefined>;
}

/** metricsText is one line for a component's metrics: the URL, or why it is not served. */
export function metricsText(m: ComponentMetrics | undefined): string {
  if (!m) return 'not served';
  return m.url ?? `not served (${m.error ?? 'not bound yet'})`;
}
