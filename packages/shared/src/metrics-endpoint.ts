/**
 * MetricsEndpoint: a daemon's Prometheus /metrics listener, and the file that tells
 * `sandnode up` and `sandnode status` where it is.
 *
 * A port that cannot be bound (EADDRINUSE: another process, or the server or ublk-manager slot
 * this one takes over from, which frees it when it retires) never stops the daemon: it is
 * logged once, written to the status file, and tried again every {@link METRICS_RETRY_MS}
 * until it binds or the endpoint is closed.
 *
 * Status file: `<runDir>/metrics/<component>.json`, mode 0644, replaced atomically:
 * `{ listen: "127.0.0.1:9464", url: "http://127.0.0.1:9464/metrics" | null, pid, error: string | null }`.
 */
import { mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import type http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import type { Logger } from 'pino';
import { serveMetrics } from './metrics';

/** How often a listen address that could not be bound is tried again, ms. */
export const METRICS_RETRY_MS = 250;

/** What a daemon's metrics status file says. */
export interface MetricsStatus {
  /** the configured "host:port" */
  listen: string;
  /** the URL that answers, null while not served */
  url: string | null;
  /** the daemon's pid */
  pid: number;
  /** why it is not served (e.g. "127.0.0.1:9464 is in use (EADDRINUSE); retrying every 250 ms"), null when served */
  error: string | null;
}

/** metricsStatusFile is the status file of component under runDir. */
export function metricsStatusFile(runDir: string, component: string): string {
  return path.join(runDir, 'metrics', `${component}.json`);
}

/** readMetricsStatus reads component's status file; undefined when missing or unreadable. */
export function readMetricsStatus(runDir: string, component: string): MetricsStatus | undefined {
  try {
    return JSON.parse(readFileSync(metricsStatusFile(runDir, component), 'utf8')) as MetricsStatus;
  } catch {
    return undefined;
  }
}

export interface MetricsEndpointOptions {
  /** "host:port"; "" disables the endpoint */
  listen: string;
  component: string;
  /** where the status file goes; "" writes none */
  runDir: string;
  log: Logger;
}

export class MetricsEndpoint {
  private server: http.Server | undefined;
  private timer: NodeJS.Timeout | undefined;
  private running = false;
  private reported = false;

  constructor(private readonly o: MetricsEndpointOptions) {}

  /** url is the URL served now (undefined while not served). */
  get url(): string | undefined {
    const a = this.server?.address() as AddressInfo | null | undefined;
    if (!a) return undefined;
    const host = a.family === 'IPv6' ? `[${a.address}]` : a.address;
    return `http://${host}:${a.port}/metrics`;
  }

  /**
   * start serves /metrics; resolves after the first bind attempt (served or not: a failed one
   * keeps retrying in the background). A no-op when already started; when disabled it removes
   * the component's status file.
   */
  async start(): Promise<void> {
    if (!this.o.listen) {
      // off: a status file an earlier process of this component left must not name a URL
      if (this.o.runDir) rmSync(metricsStatusFile(this.o.runDir, this.o.component), { force: true });
      return;
    }
    if (this.running) return;
    this.running = true;
    this.reported = false;
    await this.attempt();
  }

  private async attempt(): Promise<void> {
    this.timer = undefined;
    if (!this.running || this.server) return;
    try {
      const srv = await serveMetrics(this.o.listen);
      if (!this.running) {
        srv.close();
        return;
      }
      this.server = srv;
      srv.unref();
      this.write(null);
      if (this.reported) this.o.log.info({ listen: this.o.listen, url: this.url }, 'serving /metrics now');
    } catch (err) {
      const e = err as NodeJS.ErrnoException;
      const why = e.code === 'EADDRINUSE' ? `${this.o.listen} is in use (EADDRINUSE)` : `${this.o.listen}: ${e.message}`;
      if (!this.reported) {
        this.reported = true;
        this.o.log.error({ err, listen: this.o.listen }, `cannot serve /metrics: ${why}; gRPC is served all the same; retrying every ${METRICS_RETRY_MS} ms`);
        this.write(`${why}; retrying every ${METRICS_RETRY_MS} ms`);
      }
      this.timer = setTimeout(() => void this.attempt(), METRICS_RETRY_MS);
      this.timer.unref();
    }
  }

  private write(error: string | null): void {
    if (!this.o.runDir) return;
    const file = metricsStatusFile(this.o.runDir, this.o.component);
    const status: MetricsStatus = { listen: this.o.listen, url: this.url ?? null, pid: process.pid, error };
    try {
      mkdirSync(path.dirname(file), { recursive: true, mode: 0o755 });
      const tmp = `${file}.${process.pid}.tmp`;
      writeFileSync(tmp, `${JSON.stringify(status)}\n`, { mode: 0o644 });
      renameSync(tmp, file);
    } catch (err) {
      this.o.log.warn({ err, file }, 'cannot write the metrics status file');
    }
  }

  /** close stops serving and retrying and frees the port; resolves when the listener is closed. */
  close(): Promise<void> {
    this.running = false;
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    const srv = this.server;
    this.server = undefined;
    if (!srv) return Promise.resolve();
    return new Promise((r) => {
      srv.close(() => r());
      srv.closeAllConnections();
    });
  }
}
