/**
 * Config of the ublk-manager (the same shape as the vmm-supervisor's: `SERVICE`, one zod
 * `configSchema`, `loadUblkConfig({ file, env })` returning the resolved `UblkConfig`): read
 * from an optional JSON file (`version: 1`; `--config FILE` on the command line, see
 * parseArgs in main.ts) and env `SANDNODE_UBLK_MANAGER_<KEY>`. Keys and defaults are listed
 * in the service README. Invalid values fail the start with an error that names the key.
 */
import path from 'node:path';
import {
  unixSocketAddress,
  defaultMetricsListen,
  DEFAULT_DRAIN_MS,
  DEFAULT_RUN_DIR,
  DEFAULT_STATE_DIR,
  LOG_LEVELS,
  configBool,
  loadConfig,
  type ConfigNote,
  socketPath,
  unixAddress,
  z,
} from '@sandnode/shared';
import { DEFAULT_RELEASE_TIMEOUT_MS } from './core/device-core';
import { DEFAULT_MAX_DEVICE_SIZE_BYTES, MIN_DEVICE_SIZE_BYTES, SECTOR_BYTES } from './core/types';
import { DEFAULT_CLONE_TIMEOUT_MS, DEFAULT_MKFS_TIMEOUT_MS } from './drivers/images';
import { DEFAULT_POOL_CHECK_MS, DEFAULT_POOL_INITIAL_BYTES, DEFAULT_POOL_MAX_BYTES, DEFAULT_POOL_MIN_FREE_BYTES, DEFAULT_POOL_HOST_MIN_FREE_BYTES, MIN_POOL_BYTES } from './drivers/image-pool';

/** The service name used in env var names and logs. */
export const SERVICE = 'ublk-manager';

/**
 * How long the start waits for the slot lock, in ms: another slot holds it for a moment while
 * it checks that this slot is not running (takeover).
 */
export const DEFAULT_SLOT_LOCK_WAIT_MS = 2000;

/** A duration key in ms: 0..max. */
const ms = (max: number) => z.coerce.number().int().min(0).max(max);

/** A boolean from JSON (true/false) or env ("true"/"false"/"1"/"0"/"yes"/"no"/"on"/"off"). */
const boolish = configBool();

/** The config schema; every key has a default. */
export const configSchema = z.object({
  /** A/B slot: "a", "b" or "" (no slot). The table is `<stateDir>/ublk-manager/<slot or default>/devices.db`. */
  slot: z.enum(['a', 'b', '']).default(''),
  /** State dir, shared by both slots. */
  stateDir: z.string().min(1).default(DEFAULT_STATE_DIR),
  /** Runtime dir: the default socket is `<runDir>/ublk-manager.sock`. */
  runDir: z.string().min(1).default(DEFAULT_RUN_DIR),
  /**
   * gRPC address, a unix socket only ("unix:///abs.sock"); default `unix://<runDir>/ublk-manager.sock`.
   * No TCP: its callers are authenticated by peer credentials (root only), which TCP has not.
   */
  listen: unixSocketAddress().optional(),
  logLevel: z.enum(LOG_LEVELS).default('info'),
  /** Backend: "loop" (embedded) or "ublk" (not in this release; fails at start). */
  driver: z.enum(['loop', 'ublk']).default('loop'),
  /** Where image files live; default `<stateDir>/images`. */
  imagesDir: z.string().min(1).optional(),
  /** Largest device CreateDevice accepts, in bytes (a multiple of 512, >= 1 MiB). */
  maxDeviceSizeBytes: z.coerce
    .number()
    .int()
    .min(MIN_DEVICE_SIZE_BYTES)
    .max(Number.MAX_SAFE_INTEGER)
    .refine((n) => n % SECTOR_BYTES === 0, { message: `must be a multiple of ${SECTOR_BYTES}` })
    .default(DEFAULT_MAX_DEVICE_SIZE_BYTES),
  /** Attach loop devices with direct I/O; falls back to buffered I/O when losetup refuses. */
  directIo: boolish.default(true),
  /** Time running calls get to finish at shutdown, in ms. */
  drainMs: ms(600_000).default(DEFAULT_DRAIN_MS),
  /** How long the start waits for the slot lock (held briefly by the other slot's takeover check), in ms. */
  slotLockWaitMs: ms(600_000).default(DEFAULT_SLOT_LOCK_WAIT_MS),
  /** A released device no other slot took over after this long is owned here again, in ms (>= 1000). */
  releaseTimeoutMs: z.coerce.number().int().min(1000).max(3_600_000).default(DEFAULT_RELEASE_TIMEOUT_MS),
  /** Longest `cp` of one CloneDevice / CreateDevice from source_image, in ms (>= 1000). */
  cloneTimeoutMs: z.coerce.number().int().min(1000).max(86_400_000).default(DEFAULT_CLONE_TIMEOUT_MS),
  /** Longest `mkfs.ext4` of one CreateDevice, in ms (>= 1000). */
  mkfsTimeoutMs: z.coerce.number().int().min(1000).max(86_400_000).default(DEFAULT_MKFS_TIMEOUT_MS),
  /**
   * Make an image pool (an XFS reflink file system in `<stateDir>/ublk-manager/pool/images.xfs`,
   * mounted on the images dir) when the images dir's file system has no reflink; false: clones copy.
   */
  imagePool: boolish.default(true),
  /** Size of a new image pool file (sparse), bytes (>= 512 MiB). */
  imagePoolInitialBytes: z.coerce.number().int().min(MIN_POOL_BYTES).max(Number.MAX_SAFE_INTEGER).default(DEFAULT_POOL_INITIAL_BYTES),
  /** Largest the image pool grows to, bytes (>= 512 MiB; below imagePoolInitialBytes means no growth). */
  imagePoolMaxBytes: z.coerce.number().int().min(MIN_POOL_BYTES).max(Number.MAX_SAFE_INTEGER).default(DEFAULT_POOL_MAX_BYTES),
  /** The image pool grows when less than this is free in it, bytes. */
  imagePoolMinFreeBytes: z.coerce.number().int().min(0).max(Number.MAX_SAFE_INTEGER).default(DEFAULT_POOL_MIN_FREE_BYTES),
  /**
   * The least free space the host file system under the image pool file keeps, bytes: the pool
   * (a sparse file) never grows past what the host can back, and no image is made below it.
   */
  imagePoolHostMinFreeBytes: z.coerce.number().int().min(0).max(Number.MAX_SAFE_INTEGER).default(DEFAULT_POOL_HOST_MIN_FREE_BYTES),
  /** How often the image pool's free space is checked, ms (0: only before an image is made). */
  imagePoolCheckMs: ms(3_600_000).default(DEFAULT_POOL_CHECK_MS),
  /** Make empty ext4 devices by FICLONE of a pre-formatted empty image per size (where reflink works) instead of mkfs.ext4. */
  emptyImageTemplates: boolish.default(true),
  /** Prometheus `/metrics` on "host:port" (default 127.0.0.1:9466); "" disables. A port in use is logged and retried, never fatal. */
  metricsListen: z
    .string()
    .regex(/^$|^[^:]+:\d{1,5}$/, { message: 'must be "host:port" or ""' })
    .default(defaultMetricsListen('ublk-manager')),
  /** The ublk server program of driver "ublk" (ublksrv's `ublk`, or a path). */
  ublkServer: z.string().min(1).default('ublk'),
});

/** UblkConfig is the validated config with every derived default filled in (absolute paths, listen address). */
export interface UblkConfig {
  slot: 'a' | 'b' | '';
  stateDir: string;
  runDir: string;
  listen: string;
  logLevel: (typeof LOG_LEVELS)[number];
  driver: 'loop' | 'ublk';
  imagesDir: string;
  maxDeviceSizeBytes: number;
  directIo: boolean;
  drainMs: number;
  slotLockWaitMs: number;
  releaseTimeoutMs: number;
  cloneTimeoutMs: number;
  mkfsTimeoutMs: number;
  imagePool: boolean;
  imagePoolInitialBytes: number;
  imagePoolMaxBytes: number;
  imagePoolMinFreeBytes: number;
  imagePoolHostMinFreeBytes: number;
  imagePoolCheckMs: number;
  emptyImageTemplates: boolean;
  metricsListen: string;
  ublkServer: string;
}

/**
 * KEY_SINCE: the release that brought each key older than this release line (docs/config.md);
 * a key of the schema not listed here is since 0.3.0. V1_KEYS are the keys format-1 readers
 * (0.1.0 and 0.2.0, which refuse any key they do not know) read: the format-1 slot of a config
 * this build writes holds only these (writeConfigSlots, @sandnode/shared).
 */
export const KEY_SINCE: Readonly<Record<string, string>> = Object.fromEntries(
  ['slot', 'stateDir', 'runDir', 'listen', 'logLevel', 'driver', 'imagesDir', 'maxDeviceSizeBytes', 'directIo', 'drainMs', 'metricsListen', 'ublkServer'].map((k) => [k, '0.1.0']),
);
/** The keys format-1 readers know (see KEY_SINCE). */
export const V1_KEYS: readonly string[] = Object.keys(KEY_SINCE);

/**
 * loadUblkConfig reads file + env, validates, and resolves the defaults that depend on other
 * keys (listen, imagesDir). Keys of the file it ignored go to opts.notes. Throws ConfigError
 * naming the bad key.
 */
export function loadUblkConfig(opts: { file?: string; env?: NodeJS.ProcessEnv; notes?: ConfigNote[] } = {}): UblkConfig {
  const c = loadConfig(configSchema, { service: SERVICE, file: opts.file, env: opts.env, notes: opts.notes });
  const stateDir = path.resolve(c.stateDir);
  const runDir = path.resolve(c.runDir);
  return {
    ...c,
    stateDir,
    runDir,
    listen: c.listen ?? unixAddress(c.slot === '' ? socketPath(runDir, SERVICE) : path.join(runDir, `${SERVICE}-${c.slot}.sock`)),
    imagesDir: path.resolve(c.imagesDir ?? path.join(stateDir, 'images')),
  };
}
