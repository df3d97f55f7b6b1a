#!/usr/bin/env node
/**
 * sandnode-ublk-manager: the daemon that owns block devices. Order at start: config ->
 * driver check (fails naming what is missing) -> device table -> adoption of the devices the
 * table knows -> serve DeviceService (+ VersionService, health, reflection). SIGTERM/SIGINT
 * run the shared shutdown order and close the table; devices stay attached (sandboxes use
 * them, they outlive the manager).
 *
 * Usage: sandnode-ublk-manager [--config FILE]
 */
import { mkdirSync } from 'node:fs';
import path from 'node:path';
import { buildCommit, createLogger, createServiceServer, runDaemon, SUITE_VERSION, type Logger } from '@sandnode/shared';
import { DeviceServiceDefinition } from '@sandnode/shared/proto/ublk/v1/ublk';
import { loadUblkConfig, SERVICE_NAME, type UblkManagerConfig } from './config';
import { DeviceManager } from './core/device-manager';
import type { BlockDriver } from './core/driver';
import { FileImages } from './drivers/images';
import { LoopDriver } from './drivers/loop';
import { UblkDriver } from './drivers/ublk';
import { deviceService } from './rpc/device-service';
import { deviceDbPath, SqliteDeviceStore } from './store/sqlite-device-store';

/** Feature strings reported by GetVersion. */
export const FEATURES: readonly string[] = ['ublk.loop', 'ublk.adoption.v1'];

/** Exit code for a bad command line or config. */
const EXIT_USAGE = 2;

/** parseArgs accepts `--config FILE`, `--config=FILE` and `--help`. */
export function parseArgs(argv: string[]): { config?: string; help: boolean } {
  const out: { config?: string; help: boolean } = { help: false };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] ?? '';
    if (a === '--help' || a === '-h') out.help = true;
    else if (a === '--config') {
      const v = argv[++i];
      if (!v) throw new Error('--config needs a file path');
      out.config = v;
    } else if (a.startsWith('--config=')) out.config = a.slice('--config='.length);
    else throw new Error(`unknown argument ${JSON.stringify(a)} (usage: sandnode-ublk-manager [--config FILE])`);
  }
  return out;
}

function makeDriver(cfg: UblkManagerConfig, log: Logger): BlockDriver {
  return cfg.driver === 'loop' ? new LoopDriver({ directIo: cfg.directIo, log: log.child({ driver: 'loop' }) }) : new UblkDriver();
}

/** start runs the daemon until a signal stops it. */
async function start(argv: string[]): Promise<void> {
  let log = createLogger(SERVICE_NAME, SUITE_VERSION);
  let cfg: UblkManagerConfig;
  try {
    const args = parseArgs(argv);
    if (args.help) {
      log.info('usage: sandnode-ublk-manager [--config FILE]; config keys: see services/ublk-manager/README.md');
      return;
    }
    cfg = loadUblkConfig({ file: args.config });
  } catch (err) {
    log.fatal({ err: (err as Error).message }, 'cannot start: bad command line or config');
    process.exit(EXIT_USAGE);
  }
  log = createLogger(SERVICE_NAME, SUITE_VERSION, cfg.logLevel);
  log.info({ config: cfg }, 'starting');

  const driver = makeDriver(cfg, log);
  await driver.checkAvailable();
  mkdirSync(cfg.stateDir, { recursive: true });
  mkdirSync(cfg.runDir, { recursive: true });
  if (cfg.listen.startsWith('unix://')) mkdirSync(path.dirname(cfg.listen.slice('unix://'.length)), { recursive: true });

  const images = new FileImages(cfg.imagesDir);
  const store = new SqliteDeviceStore(deviceDbPath(cfg.stateDir));
  const manager = new DeviceManager({ store, driver, images, log, limits: { maxDeviceSizeBytes: cfg.maxDeviceSizeBytes } });
  await manager.adopt();

  const server = createServiceServer({
    info: { component: SERVICE_NAME, version: SUITE_VERSION, commit: buildCommit(), features: [...FEATURES] },
    log,
  });
  server.add(DeviceServiceDefinition, deviceService(manager));
  runDaemon({
    server,
    log,
    drainMs: cfg.drainMs,
    // Devices are left attached on purpose: sandboxes use them and they outlive the manager.
    onStop: () => store.close(),
  });
  await server.listen([cfg.listen]);
  log.info({ listen: cfg.listen, driver: driver.name, images_dir: images.dir }, 'serving');
}

if (require.main === module) {
  start(process.argv.slice(2)).catch((err: unknown) => {
    createLogger(SERVICE_NAME, SUITE_VERSION).fatal({ err: (err as Error).message ?? String(err) }, 'cannot start');
    process.exit(1);
  });
}
