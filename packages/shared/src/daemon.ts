/**
 * runDaemon: the one shutdown order for every sandnode daemon. On SIGTERM or SIGINT: health
 * NOT_SERVING, stop taking new calls, drain running calls (GOAWAY, up to drainMs), run the
 * component's own stop hook (which must never touch running sandboxes), exit 0. A second
 * signal forces exit 1.
 */
import type { Logger } from 'pino';
import type { ServiceServer } from './server';

export interface DaemonOptions {
  server: ServiceServer;
  log: Logger;
  drainMs?: number;
  /** Runs after the server is closed: close DBs, stop timers. */
  onStop?: () => Promise<void> | void;
}

/** runDaemon installs the signal handlers; returns a function that runs the same stop. */
export function runDaemon(opts: DaemonOptions): () => Promise<void> {
  let stopping: Promise<void> | undefined;
  const stop = (): Promise<void> => {
    if (!stopping) {
      stopping = (async () => {
        opts.log.info('stopping: health NOT_SERVING, draining calls');
        await opts.server.shutdown(opts.drainMs);
        await opts.onStop?.();
        opts.log.info('stopped');
      })();
    }
    return stopping;
  };
  const onSignal = (sig: NodeJS.Signals) => {
    if (stopping) {
      opts.log.warn({ sig }, 'second signal: exiting now');
      process.exit(1);
    }
    opts.log.info({ sig }, 'signal received');
    stop().then(
      () => process.exit(0),
      (err: unknown) => {
        opts.log.error({ err }, 'stop failed');
        process.exit(1);
      },
    );
  };
  process.on('SIGTERM', onSignal);
  process.on('SIGINT', onSignal);
  return stop;
}
