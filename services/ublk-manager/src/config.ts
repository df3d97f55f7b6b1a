/**
 * Config of the ublk-manager: one zod schema, read from an optional JSON file (`version: 1`)
 * and env `SANDNODE_UBLK_MANAGER_<KEY>`; `--config FILE` on the command line. Keys and
 * defaults are listed in the service README. Invalid values fail the start with an error
 * that names the key.
 */
import path from 'node:path';
import { DEFAULT_RUN_DIR, DEFAULT_STATE_DIR, LOG_LEVELS, configBool, loadConfig, socketPath, unixAddress, z } from '@sandnode/shared';
import { DEFAULT_MAX_DEVICE_SIZE_BYTES, MIN_DEVICE_SIZE_BYTES, SECTOR_BYTES } from './core/types';

/** The service name used in env var names and logs. */
export const SERVICE_NAME = 'ublk-manager';

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
  /** gRPC address: "unix:///abs.sock" or "host:port"; default `unix://<runDir>/ublk-manager.sock`. */
  listen: z.string().min(1).optional(),
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
  drainMs: z.coerce.number().int().min(0).max(600_000).default(5000),
  /** Prometheus `/metrics` on "host:port"; "" disables. */
  metricsListen: z
    .string()
    .regex(/^$|^[^:]+:\d{1,5}$/, { message: 'must be "host:port" or ""' })
    .default(''),
  /** The ublk server program of driver "ublk" (ublksrv's `ublk`, or a path). */
  ublkServer: z.string().min(1).default('ublk'),
});

/** The config with every default resolved to an absolute path or address. */
export interface UblkManagerConfig {
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
  metricsListen: string;
  ublkServer: string;
}

/**
 * loadUblkConfig reads file + env (+ overrides), validates, and resolves the defaults that
 * depend on other keys (listen, imagesDir). Throws ConfigError naming the bad key.
 */
export function loadUblkConfig(opts: { file?: string; env?: NodeJS.ProcessEnv; overrides?: Record<string, unknown> } = {}): UblkManagerConfig {
  const c = loadConfig(configSchema, { service: SERVICE_NAME, ...opts });
  const stateDir = path.resolve(c.stateDir);
  const runDir = path.resolve(c.runDir);
  return {
    stateDir,
    runDir,
    slot: c.slot,
    listen: c.listen ?? unixAddress(c.slot === '' ? socketPath(runDir, 'ublk-manager') : path.join(runDir, `ublk-manager-${c.slot}.sock`)),
    logLevel: c.logLevel,
    driver: c.driver,
    imagesDir: path.resolve(c.imagesDir ?? path.join(stateDir, 'images')),
    maxDeviceSizeBytes: c.maxDeviceSizeBytes,
    directIo: c.directIo,
    drainMs: c.drainMs,
    metricsListen: c.metricsListen,
    ublkServer: c.ublkServer,
  };
}
