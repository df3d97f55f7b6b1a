/**
 * The Prometheus /metrics endpoint of the active server. Its port moves with the lease: the
 * old server closes it when it hands over, the new one binds it, retrying for a moment
 * because the old server frees the port only when it releases the lease. Failing to serve
 * metrics is logged, never fatal.
 */
import type http from 'node:http';
import { serveMetrics, type Logger } from '@sandnode/shared';

/** How long a new server retries binding /metrics, ms. */
export const METRICS_BIND_WAIT_MS = 2000;

export class MetricsEndpoint {
  private server: http.Server | undefined;

  /** listen is "host:port"; "" disables the endpoint. */
  constructor(
    private readonly listen: string,
    private readonly log: Logger,
  ) {}

  /** start serves /metrics (a no-op when disabled or already serving). */
  async start(): Promise<void> {
    if (!this.listen || this.server) return;
    for (const t0 = Date.now(); ;) {
      try {
        this.server = await serveMetrics(this.listen);
        return;
      } catch (err) {
        if (Date.now() - t0 > METRICS_BIND_WAIT_MS) {
          this.log.error({ err, listen: this.listen }, 'cannot serve /metrics');
          return;
        }
        await new Promise((r) => setTimeout(r, 50));
      }
    }
  }

  /** close frees the port. */
  close(): void {
    this.server?.close();
    this.server = undefined;
  }
}
