/**
 * Prometheus metrics (prom-client). One registry per process; components add their own
 * metrics to it. Default process metrics are unprefixed (`process_*`, `nodejs_*`), as every
 * Prometheus client names them. `serveMetrics` exposes the registry over HTTP;
 * {@link MetricsEndpoint} (metrics-endpoint.ts) is what daemons use.
 */
import http from 'node:http';
import { collectDefaultMetrics, Gauge, Registry } from 'prom-client';
import type { ComponentInfo } from './version';
import { runtimeName } from './version';

/** Gauge, for components' own metrics on {@link registry} (prom-client's). */
export { Gauge } from 'prom-client';

/** The process-wide registry. */
export const registry = new Registry();
collectDefaultMetrics({ register: registry });

/** Default /metrics port of each daemon on 127.0.0.1 (metricsListen default). */
export const DEFAULT_METRICS_PORTS = { server: 9464, 'vmm-supervisor': 9465, 'ublk-manager': 9466 } as const;

/** defaultMetricsListen is "127.0.0.1:<port>" of a daemon's default /metrics port. */
export function defaultMetricsListen(component: keyof typeof DEFAULT_METRICS_PORTS): string {
  return `127.0.0.1:${DEFAULT_METRICS_PORTS[component]}`;
}

/**
 * buildInfo: `sandnode_build_info{component,version,commit,node_id,runtime} 1` per component
 * server of this process (set by createServiceServer).
 */
export const buildInfo = new Gauge({
  name: 'sandnode_build_info',
  help: 'A 1 per component build this process runs: version, git commit, node id and runtime',
  labelNames: ['component', 'version', 'commit', 'node_id', 'runtime'] as const,
  registers: [registry],
});

/** setBuildInfo sets sandnode_build_info of info to 1 (node_id: info.nodeId when a component has one, else ""). */
export function setBuildInfo(info: ComponentInfo & { nodeId?: string }): void {
  buildInfo.set({ component: info.component, version: info.version, commit: info.commit, node_id: info.nodeId ?? '', runtime: runtimeName() }, 1);
}

/** serveMetrics serves GET /metrics on host:port ("127.0.0.1:9464"); resolves with the listening server, rejects with the listen error (EADDRINUSE ...). */
export function serveMetrics(listen: string): Promise<http.Server> {
  const idx = listen.lastIndexOf(':');
  const host = listen.slice(0, idx).replace(/^\[|\]$/g, '');
  const port = Number(listen.slice(idx + 1));
  const srv = http.createServer((req, res) => {
    if (req.url !== '/metrics') {
      res.writeHead(404).end();
      return;
    }
    registry.metrics().then(
      (body) => res.writeHead(200, { 'content-type': registry.contentType }).end(body),
      (err: Error) => res.writeHead(500).end(err.message),
    );
  });
  return new Promise((resolve, reject) => {
    srv.once('error', reject);
    srv.listen(port, host, () => {
      srv.removeListener('error', reject);
      resolve(srv);
    });
  });
}
