#!/usr/bin/env node
/**
 * sandnode-ublk-manager: the daemon that owns block devices. Order at start: config ->
 * failpoints -> driver check (fails naming what is missing) -> slot lock (exit 3 when another
 * process of the slot holds it) -> device table of the slot -> takeover of the devices of a
 * slot that is not running -> crash convergence of released rows -> adoption of the devices
 * the table knows -> epoch fence -> serve DeviceService
 * (+ VersionService, health, reflection) and /metrics when configured. SIGTERM/SIGINT run the
 * shared shutdown order and close the table; devices stay attached (sandboxes use them, they
 * outlive the manager).
 *
 * Usage: sandnode-ublk-manager [--config FILE]
 */
import { mkdirSync, realpathSync } from 'node:fs';
import type http from 'node:http';
import path from 'node:path';
import { buildCommit, createLogger, createServiceServer, runDaemon, serveMetrics, SUITE_VERSION, type Logger } from '@sandnode/shared';
import { DeviceServiceDefinition } from '@sandnode/shared/proto/ublk/v1/ublk';
import { loadUblkConfig, SERVICE_NAME, type UblkManagerConfig } from './config';
import { DeviceManager } from './core/device-manager';
import type { BlockDriver } from './core/driver';
import { activeFailpoints, FAILPOINTS_ENV, setFailpoints } from './core/failpoints';
import { FileImages } from './drivers/images';
import { LoopDriver } from './drivers/loop';
import { UblkDriver } from './drivers/ublk';
import { cloneCopy, handoverStall } from './metrics';
import { deviceService } from './rpc/device-service';
import { HANDOVER_FEATURE } from './rpc/old-slot-client';
import { managerDir, migrateLegacyTable, slotLockPath, slotName } from './store/layout';
import { lockSlot, type HeldLock } from './store/locks';
import { SharedEpochFence } from './store/shared-epoch-fence';
import { FileSlotPeers } from './store/slot-peers';
import { deviceDbPath, SqliteDeviceStore } from './store/sqlite-device-store';

/**
 * Feature strings reported by GetVersion: `ublk.loop` / `ublk.ublk` (driver), `ublk.adoption.v1`,
 * `ublk.slots.v1` (A/B slots on one state dir), `ublk.handover.v1` (Quiesce/Resume/Release/
 * Recover/AbortHandover/HandoverAll), `ublk.epoch-fence.v1`, plus `ublk.quiesce`,
 * `ublk.user-recovery`, `ublk.reissue` when the driver has them on this kernel.
 */
export function features(driver: BlockDriver): string[] {
  return [`ublk.${driver.name}`, 'ublk.adoption.v1', 'ublk.slots.v1', HANDOVER_FEATURE, 'ublk.epoch-fence.v1', 'ublk.foreign-mountns.v1', 'ublk.clone', ...driver.capabilities().map((c) => `ublk.${c}`)];
}

/** Exit code for a bad command line or config. */
const EXIT_USAGE = 2;
/** Exit code when another process of the same slot holds the slot lock. */
const EXIT_LOCKED = 3;
/**
 * How long the start waits for the slot lock: another slot holds it for a moment while it
 * checks that this slot is not running (takeover), in ms.
 */
const SLOT_LOCK_WAIT_MS = 2000;

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

/** resolvedImagesDir is the images dir as the kernel names it (created, symlinks resolved). */
function resolvedImagesDir(dir: string): string {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  return realpathSync(dir);
}

function makeDriver(cfg: UblkManagerConfig, log: Logger): BlockDriver {
  return cfg.driver === 'loop'
    ? new LoopDriver({ directIo: cfg.directIo, log: log.child({ driver: 'loop' }), imagesDir: resolvedImagesDir(cfg.imagesDir) })
    : new UblkDriver({ server: cfg.ublkServer, log: log.child({ driver: 'ublk' }) });
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
    setFailpoints(process.env[FAILPOINTS_ENV]);
  } catch (err) {
    log.fatal({ err: (err as Error).message }, 'cannot start: bad command line or config');
    process.exit(EXIT_USAGE);
  }
  log = createLogger(SERVICE_NAME, SUITE_VERSION, cfg.logLevel).child({ slot: slotName(cfg.slot) });
  log.info({ config: cfg, failpoints: activeFailpoints() }, 'starting');

  const driver = makeDriver(cfg, log);
  await driver.checkAvailable();
  mkdirSync(cfg.stateDir, { recursive: true });
  mkdirSync(cfg.runDir, { recursive: true });
  if (cfg.listen.startsWith('unix://')) mkdirSync(path.dirname(cfg.listen.slice('unix://'.length)), { recursive: true });

  let slotLock: HeldLock;
  try {
    slotLock = lockSlot(slotLockPath(cfg.stateDir, cfg.slot), `ublk-manager slot "${slotName(cfg.slot)}" on state dir ${cfg.stateDir}`, SLOT_LOCK_WAIT_MS);
  } catch (err) {
    log.fatal({ err: (err as Error).message }, 'cannot start: the slot is taken');
    process.exit(EXIT_LOCKED);
  }
  const dbFile = deviceDbPath(cfg.stateDir, cfg.slot);
  if (cfg.slot === '' && migrateLegacyTable(cfg.stateDir, dbFile)) log.warn({ to: dbFile }, 'moved the device table of release 0.0.1 (<stateDir>/ublk/devices.db) to the slot layout');

  const images = new FileImages(cfg.imagesDir);
  const store = new SqliteDeviceStore(dbFile);
  const peers = new FileSlotPeers(cfg.stateDir, cfg.slot);
  const manager = new DeviceManager({ store, driver, images, log, peers, limits: { maxDeviceSizeBytes: cfg.maxDeviceSizeBytes } });
  // Takeover first: the devices of a slot that is not running are owned here (exactly one
  // running owner per device). Then crash convergence: released rows are dropped (another
  // slot owns the device) or taken back.
  await manager.takeOverStoppedPeers();
  await manager.converge({ takeBackAfterMs: 0 });
  await manager.adopt();

  const server = createServiceServer({
    info: { component: SERVICE_NAME, version: SUITE_VERSION, commit: buildCommit(), features: features(driver) },
    log,
    fence: new SharedEpochFence(managerDir(cfg.stateDir)),
  });
  server.add(
    DeviceServiceDefinition,
    deviceService(manager, {
      selfAddress: cfg.listen,
      observeStall: (s, mode) => handoverStall.observe({ mode }, s),
      observeClone: (s, reflinked) => cloneCopy.observe({ reflinked: String(reflinked) }, s),
    }),
  );
  let metrics: http.Server | undefined;
  runDaemon({
    server,
    log,
    drainMs: cfg.drainMs,
    // Devices are left attached on purpose: sandboxes use them and they outlive the manager.
    onStop: async () => {
      manager.stop();
      if (metrics) await new Promise<void>((r) => metrics?.close(() => r()));
      store.close();
      slotLock.release();
    },
  });
  if (cfg.metricsListen !== '') metrics = await serveMetrics(cfg.metricsListen);
  await server.listen([cfg.listen]);
  log.info({ listen: cfg.listen, slot: slotName(cfg.slot), driver: driver.name, images_dir: images.dir, metrics: cfg.metricsListen || undefined }, 'serving');
}

if (require.main === module) {
  start(process.argv.slice(2)).catch((err: unknown) => {
    createLogger(SERVICE_NAME, SUITE_VERSION).fatal({ err: (err as Error).message ?? String(err) }, 'cannot start');
    process.exit(1);
  });
}
