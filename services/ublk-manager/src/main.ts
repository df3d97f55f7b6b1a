#!/usr/bin/env node
/**
 * sandnode-ublk-manager: the daemon that owns block devices. Order at start: config ->
 * failpoints -> driver check (fails naming what is missing) -> slot lock (exit 3 when another
 * process of the slot holds it) -> image pool (found, adopted or made: drivers/image-pool.ts) -> device table of the slot -> takeover of the devices of a
 * slot that is not running -> crash convergence of released rows -> adoption of the devices
 * the table knows -> epoch fence -> serve DeviceService
 * (+ VersionService, health, reflection) and /metrics when configured. SIGTERM/SIGINT run the
 * shared shutdown order and close the table; devices stay attached (sandboxes use them, they
 * outlive the manager).
 *
 * Usage: sandnode-ublk-manager [--config FILE]
 */
import { mkdirSync, realpathSync } from 'node:fs';
import path from 'node:path';
import {
  buildCommit,
  createLogger,
  logConfigNotes,
  type ConfigNote,
  gateWritesWhileBusy,
  parseDaemonArgs,
  UsageError,
  createServiceServer,
  runDaemon,
  MetricsEndpoint,
  serverLeasePath,
  SUITE_VERSION,
  UBLK_FEATURES,
  waitWhileBusy,
  prepareTrustedDirs,
  type Logger,
  resolveNodeId,
} from '@sandnode/shared';
import { DeviceServiceDefinition } from '@sandnode/shared/proto/ublk/v1/ublk';
import { loadUblkConfig, SERVICE, type UblkConfig } from './config';
import { DeviceManager } from './core/device-manager';
import type { BlockDriver } from './core/driver';
import { activeFailpoints, FAILPOINTS_ENV, setFailpoints } from './core/failpoints';
import { ImagePool } from './drivers/image-pool';
import { FileImages } from './drivers/images';
import { LoopDriver } from './drivers/loop';
import { UblkDriver } from './drivers/ublk';
import { cloneCopy, handoverStall } from './metrics';
import { deviceService } from './rpc/device-service';
import { managerDir, migrateLegacyTable, slotLockPath, slotName } from './store/layout';
import { lockSlot, type HeldLock } from './store/locks';
import { SharedEpochFence } from './store/shared-epoch-fence';
import { FileSlotPeers } from './store/slot-peers';
import { deviceDbPath, SqliteDeviceStore } from './store/sqlite-device-store';

/** The driver's feature string (UBLK_FEATURES.loop / .ublk) and those of its capabilities. */
const DRIVER_FEATURES = { loop: UBLK_FEATURES.loop, ublk: UBLK_FEATURES.ublk } as const;
const CAPABILITY_FEATURES = { quiesce: UBLK_FEATURES.quiesce, 'user-recovery': UBLK_FEATURES.userRecovery, reissue: UBLK_FEATURES.reissue } as const;

/**
 * Feature strings reported by GetVersion (the registry UBLK_FEATURES of @sandnode/shared):
 * `ublk.loop` / `ublk.ublk` (driver), `ublk.adoption.v1`, `ublk.slots.v1` (A/B slots on one
 * state dir), `ublk.handover.v1` (Quiesce/Resume/Release/Recover/AbortHandover/HandoverAll),
 * `ublk.epoch-fence.v1`, `ublk.fence-epoch.v1` (FenceEpoch), `ublk.foreign-mountns.v1`,
 * `ublk.clone`, `ublk.reflink-clone.v1` (CloneDevice says clone_method; FICLONE on a reflink images fs or the image pool), `ublk.clone-snapshot.v1` (SnapshotDevices), plus `ublk.quiesce`, `ublk.user-recovery`, `ublk.reissue` when the driver has
 * them on this kernel.
 */
export function features(driver: BlockDriver): string[] {
  return [
    DRIVER_FEATURES[driver.name],
    UBLK_FEATURES.adoption,
    UBLK_FEATURES.slots,
    UBLK_FEATURES.handover,
    UBLK_FEATURES.epochFence,
    UBLK_FEATURES.fenceEpoch,
    UBLK_FEATURES.foreignMountns,
    UBLK_FEATURES.clone,
    UBLK_FEATURES.reflinkClone,
    UBLK_FEATURES.cloneSnapshot,
    UBLK_FEATURES.quarantineReport,
    ...driver.capabilities().map((c) => CAPABILITY_FEATURES[c]),
  ];
}

/** The gRPC path of FenceEpoch, which the fence middleware lets through (its handler fences). */
export const FENCE_EPOCH_PATH = `/${DeviceServiceDefinition.fullName}/${DeviceServiceDefinition.methods.fenceEpoch.name}`;

/** Exit code for a bad command line or config. */
export const EXIT_USAGE = 2;
/**
 * DEVICE_WRITES: the DeviceService methods that write devices.db. Each waits (asynchronously,
 * inside its deadline) while another process holds the table locked, then answers UNAVAILABLE
 * with retry-after-ms without running; reads, Quiesce/Resume and FenceEpoch never wait for it.
 */
export const DEVICE_WRITES = ['createDevice', 'deleteDevice', 'releaseDevice', 'recoverDevice', 'abortHandover', 'handoverAll', 'cloneDevice'] as const;
/** Longest the start waits for a devices.db another process holds locked, in ms. */
const DEVICE_DB_OPEN_WAIT_MS = 10_000;
/** Exit code when another process of the same slot holds the slot lock. */
export const EXIT_LOCKED = 3;

const USAGE = 'usage: sandnode-ublk-manager [--config FILE]';

/** A bad command line: the daemon exits EXIT_USAGE with this message (it names the argument). */
export { UsageError };

/**
 * parseArgs accepts `--config FILE`, `--config=FILE` and `--help`. Throws UsageError naming
 * the argument for `--config` without a value and for any other argument.
 */
export function parseArgs(argv: string[]): { config?: string; help: boolean } {
  const { config, help } = parseDaemonArgs(argv, USAGE);
  return { config, help };
}

/** resolvedImagesDir is the images dir as the kernel names it (created, symlinks resolved). */
function resolvedImagesDir(dir: string): string {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  return realpathSync(dir);
}

function makeDriver(cfg: UblkConfig, log: Logger): BlockDriver {
  return cfg.driver === 'loop'
    ? new LoopDriver({ directIo: cfg.directIo, log: log.child({ driver: 'loop' }), imagesDir: resolvedImagesDir(cfg.imagesDir) })
    : new UblkDriver({ server: cfg.ublkServer, log: log.child({ driver: 'ublk' }) });
}

/** start runs the daemon until a signal stops it. */
async function start(argv: string[]): Promise<void> {
  let log = createLogger(SERVICE, SUITE_VERSION);
  let cfg: UblkConfig;
  const notes: ConfigNote[] = [];
  try {
    const args = parseArgs(argv);
    if (args.help) {
      log.info(`${USAGE}; config keys: see services/ublk-manager/README.md`);
      return;
    }
    cfg = loadUblkConfig({ file: args.config, notes });
    setFailpoints(process.env[FAILPOINTS_ENV]);
  } catch (err) {
    log.fatal({ err }, `cannot start: bad command line or config: ${(err as Error).message}`);
    process.exit(EXIT_USAGE);
  }
  log = createLogger(SERVICE, SUITE_VERSION, cfg.logLevel).child({ slot: slotName(cfg.slot) });
  logConfigNotes(log, notes);
  log.info({ config: cfg, failpoints: activeFailpoints() }, 'starting');
  try {
    // nothing goes into the dirs before they are known to be root's alone (trusted-dir.ts)
    prepareTrustedDirs(cfg);
  } catch (err) {
    log.fatal({ err }, `cannot start: ${(err as Error).message}`);
    process.exit(EXIT_USAGE);
  }

  const driver = makeDriver(cfg, log);
  await driver.checkAvailable();
  mkdirSync(cfg.stateDir, { recursive: true });
  mkdirSync(cfg.runDir, { recursive: true });
  if (cfg.listen.startsWith('unix://')) mkdirSync(path.dirname(cfg.listen.slice('unix://'.length)), { recursive: true });

  let slotLock: HeldLock;
  try {
    slotLock = lockSlot(slotLockPath(cfg.stateDir, cfg.slot), `ublk-manager slot "${slotName(cfg.slot)}" on state dir ${cfg.stateDir}`, cfg.slotLockWaitMs);
  } catch (err) {
    log.fatal({ err }, `cannot start: the slot is taken: ${(err as Error).message}`);
    process.exit(EXIT_LOCKED);
  }
  const dbFile = deviceDbPath(cfg.stateDir, cfg.slot);
  if (cfg.slot === '' && migrateLegacyTable(cfg.stateDir, dbFile)) log.warn({ to: dbFile }, 'moved the device table of release 0.0.1 (<stateDir>/ublk/devices.db) to the slot layout');

  // The image pool comes before anything reads the images dir: it may be mounted on it.
  const pool = new ImagePool({
    imagesDir: cfg.imagesDir,
    poolDir: path.join(managerDir(cfg.stateDir), 'pool'),
    enabled: cfg.imagePool,
    initialBytes: cfg.imagePoolInitialBytes,
    maxBytes: cfg.imagePoolMaxBytes,
    minFreeBytes: cfg.imagePoolMinFreeBytes,
    hostMinFreeBytes: cfg.imagePoolHostMinFreeBytes,
    log: log.child({ component_part: 'image-pool' }),
  });
  const poolStatus = await pool.setup();
  const images = new FileImages(cfg.imagesDir, {
    mkfsTimeoutMs: cfg.mkfsTimeoutMs,
    cloneTimeoutMs: cfg.cloneTimeoutMs,
    pool,
    noReflink: poolStatus.mode === 'none' ? poolStatus.reason : undefined,
    templates: cfg.emptyImageTemplates,
    log,
  });
  await images.templates?.removeStaleTemps();
  pool.watch(cfg.imagePoolCheckMs);
  // another process holding devices.db locked is waited for asynchronously (never on the event loop)
  const store = await waitWhileBusy(() => new SqliteDeviceStore(dbFile, { log, imagesDir: images.dir }), { what: `${dbFile}: open`, maxWaitMs: DEVICE_DB_OPEN_WAIT_MS });
  const peers = new FileSlotPeers(cfg.stateDir, cfg.slot, images.dir);
  const manager = new DeviceManager({ store, driver, images, log, peers, limits: { maxDeviceSizeBytes: cfg.maxDeviceSizeBytes }, releaseTimeoutMs: cfg.releaseTimeoutMs });
  // Takeover first: the devices of a slot that is not running are owned here (exactly one
  // running owner per device). Then crash convergence: released rows are dropped (another
  // slot owns the device) or taken back.
  await manager.takeOverStoppedPeers();
  await manager.converge({ takeBackAfterMs: 0 });
  await manager.adopt();

  // FenceEpoch fences itself with the request's epoch (after validating it); every other mutating call is fenced by the middleware.
  // No epoch above the one the node's server lease names is accepted (a forged huge epoch would fence the real server out).
  const fence = new SharedEpochFence(managerDir(cfg.stateDir), { handlerFenced: [FENCE_EPOCH_PATH], leaseFile: serverLeasePath(cfg.stateDir) });
  const server = createServiceServer({
    info: { component: SERVICE, version: SUITE_VERSION, commit: buildCommit(), features: features(driver), nodeId: resolveNodeId(cfg.stateDir) },
    log,
    fence,
    // root only on its unix socket (peer credentials): the server is its only caller
    auth: {},
  });
  server.add(
    DeviceServiceDefinition,
    gateWritesWhileBusy(
      deviceService(manager, {
        selfAddress: cfg.listen,
        observeStall: (s, mode) => handoverStall.observe({ mode }, s),
        observeClone: (s, reflinked) => cloneCopy.observe({ reflinked: String(reflinked) }, s),
        fence,
        quarantined: () => store.quarantined(),
      }),
      DEVICE_WRITES,
      store,
      { what: 'devices.db' },
    ),
  );
  // a port in use (the slot this one takes over from frees it when it exits) is logged, written to <runDir>/metrics/ublk-manager.json and retried
  const metrics = new MetricsEndpoint({ listen: cfg.metricsListen, component: SERVICE, runDir: cfg.runDir, log });
  runDaemon({
    server,
    log,
    drainMs: cfg.drainMs,
    // Devices are left attached on purpose: sandboxes use them and they outlive the manager.
    onStop: async () => {
      manager.stop();
      pool.stop();
      await metrics.close();
      store.close();
      slotLock.release();
    },
  });
  await metrics.start();
  await server.listen([cfg.listen]);
  log.info({ listen: cfg.listen, slot: slotName(cfg.slot), driver: driver.name, images_dir: images.dir, images: poolStatus.mode, metrics: metrics.url }, 'serving');
}

if (require.main === module) {
  start(process.argv.slice(2)).catch((err: unknown) => {
    createLogger(SERVICE, SUITE_VERSION).fatal({ err }, `cannot start: ${err instanceof Error ? err.message : String(err)}`);
    process.exit(1);
  });
}
