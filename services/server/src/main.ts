#!/usr/bin/env node
/**
 * sandnode-server: the sandbox lifecycle API of a node.
 *
 * Normal start: take the lease if free (then active: epoch+1, adopt, sweep orphans, serve),
 * else wait as standby and take over if the active server dies. With `takeover` set (what
 * `sandnode upgrade server` does), take the node over from the active server by handover:
 * same listening sockets, no refused connection. SIGTERM stops serving (after a drain when
 * `drainOnSigterm` is set); sandboxes are never touched by a server stop.
 */
import { ConfigError, createLogger, SUITE_VERSION } from '@sandnode/shared';
import { resolveServerConfig } from './config';
import { ServerNode } from './handover/server-node';


function parseArgs(argv: string[]): { config?: string } {
  const i = argv.indexOf('--config');
  return i >= 0 ? { config: argv[i + 1] } : {};
}

async function main(): Promise<void> {
  let cfg;
  try {
    cfg = resolveServerConfig(parseArgs(process.argv.slice(2)).config);
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`sandnode-server: ${err.message}\n`);
      process.exit(2);
    }
    throw err;
  }
  const log = createLogger('server', SUITE_VERSION, cfg.logLevel).child({ slot: cfg.slot || undefined });
  const node = new ServerNode(cfg, log);
  let stopping = false;
  const onSignal = (sig: NodeJS.Signals) => {
    if (stopping) process.exit(1);
    stopping = true;
    log.info({ sig }, 'signal received: stopping');
    // never hang on the way out: drain deadline + call drain + a margin
    setTimeout(() => {
      log.error('stop took too long: exiting');
      process.exit(1);
    }, (cfg.drainOnSigterm ? cfg.drainDeadlineMs : 0) + cfg.drainMs + 5000).unref();
    node.stop().then(
      () => process.exit(0),
      (err: unknown) => {
        log.error({ err }, 'stop failed');
        process.exit(1);
      },
    );
  };
  process.on('SIGTERM', onSignal);
  process.on('SIGINT', onSignal);
  if (cfg.takeover) {
    try {
      await node.takeover();
    } catch (err) {
      log.error({ err: (err as Error).message }, 'takeover failed; the old server stays active');
      process.stdout.write(`${JSON.stringify({ takeover: false, error: (err as Error).message })}\n`);
      process.exit(3);
    }
  } else {
    await node.start();
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`sandnode-server: ${(err as Error).stack ?? String(err)}\n`);
  process.exit(1);
});
