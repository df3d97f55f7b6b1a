/**
 * Prometheus metrics (prom-client). One registry per process; components add their own
 * metrics to it. `serveMetrics` exposes it over HTTP when a component is configured to.
 */
import http from 'node:http';
import { collectDefaultMetrics, Histogram, Registry } from 'prom-client';

/** Gauge, for components' own metrics on {@link registry} (prom-client's). */
export { Gauge } from 'prom-client';

/** The process-wide registry. */
export const registry = new Registry();
collectDefaultMetrics({ register: registry, prefix: 'sandnode_' });

/** rpc duration in seconds, labelled by component, rpc path and status code name. */
export const rpcDuration = new Histogram({
  name: 'sandnode_rpc_duration_seconds',
  help: 'Duration of served gRPC calls in seconds',
  labelNames: ['component', 'rpc', 'code'] as const,
  buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
  registers: [registry],
});

/** serveMetrics serves GET /metrics on host:port ("127.0.0.1:9464"); returns the server. */
export function serveMetrics(listen: string): Promise<http.Server> {
  const idx = listen.lastIndexOf(':');
  const host = listen.slice(0, idx);
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
    srv.listen(port, host, () => resolve(srv));
  });
}
