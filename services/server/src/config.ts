/**
 * Server config: file (`--config`, JSON with `version: 1`) + env `SANDNODE_SERVER_<KEY>`,
 * validated with zod; an error names the bad key. Keys are listed in services/server/README.md.
 */
import path from 'node:path';
import { readFileSync } from 'node:fs';
import { DEFAULT_RUN_DIR, DEFAULT_STATE_DIR, LOG_LEVELS, loadConfig, socketPath, unixAddress, z } from '@sandnode/shared';

const GIB = 1024 * 1024 * 1024;

export const serverConfigSchema = z.object({
  /** state dir: records.db, templates/ */
  stateDir: z.string().min(1).default(DEFAULT_STATE_DIR),
  /** runtime dir: sockets, sandboxes/<id>/podd.sock */
  runDir: z.string().min(1).default(DEFAULT_RUN_DIR),
  /** public gRPC on TCP, "host:port"; empty disables it */
  listen: z.string().default('127.0.0.1:7070'),
  /** public gRPC on a unix socket; default <runDir>/server.sock */
  socket: z.string().default(''),
  /** vmm-supervisor address; default unix://<runDir>/vmm-supervisor.sock */
  vmmAddress: z.string().default(''),
  /** ublk-manager address; default unix://<runDir>/ublk-manager.sock */
  ublkAddress: z.string().default(''),
  logLevel: z.enum(LOG_LEVELS).default('info'),
  /** size of each sandbox's rootfs upper device, bytes (sparse) */
  upperBytes: z.coerce.number().int().min(16 * 1024 * 1024).default(GIB),
  /** default /workspace size, bytes (sparse) */
  defaultDiskBytes: z.coerce.number().int().min(16 * 1024 * 1024).default(GIB),
  defaultVcpus: z.coerce.number().int().min(1).max(64).default(1),
  defaultMemoryMib: z.coerce.number().int().min(32).max(65536).default(512),
  /** how long podd gets to answer after a VM starts, ms */
  poddReadyTimeoutMs: z.coerce.number().int().min(100).default(20_000),
  /** how often expired sandboxes are looked for, ms */
  reaperIntervalMs: z.coerce.number().int().min(100).default(1000),
  /** records checked at once during adoption */
  adoptConcurrency: z.coerce.number().int().min(1).max(256).default(16),
  /** podd bundle copied into templates; default: the built @sandnode/podd */
  poddBundle: z.string().default(''),
  /** Node binary copied into templates (>= 22); default: the Node this server runs on (the toolchain's, deploy/node-env.sh) */
  templateNode: z.string().default(''),
  /** Prometheus /metrics "host:port"; empty disables */
  metricsListen: z.string().default(''),
  /** time running calls get at shutdown, ms */
  drainMs: z.coerce.number().int().min(0).default(5000),
  /** A/B slot of this server ("a", "b" or ""); names its admin socket */
  slot: z.enum(['', 'a', 'b']).default(''),
  /** start as the standby that takes the node over from the active server (upgrade) */
  takeover: z.preprocess((v) => v === true || v === 'true' || v === '1', z.boolean()).default(false),
  /** how long a retiring server relays running streams before it exits, ms */
  retireDrainMs: z.coerce.number().int().min(0).default(600_000),
  /** SIGTERM drains the node first (pod deletion); off for local runs */
  drainOnSigterm: z.preprocess((v) => v === true || v === 'true' || v === '1', z.boolean()).default(false),
  /** deadline of the SIGTERM drain, ms (keep it below the pod's grace period) */
  drainDeadlineMs: z.coerce.number().int().min(1000).default(20_000),
});

export type ServerConfig = z.infer<typeof serverConfigSchema> & {
  socket: string;
  vmmAddress: string;
  ublkAddress: string;
  poddBundle: string;
  templateNode: string;
  poddVersion: string;
  templatesDir: string;
};

/** resolveServerConfig loads, validates and fills the derived defaults. */
export function resolveServerConfig(file?: string, overrides?: Record<string, unknown>): ServerConfig {
  const c = loadConfig(serverConfigSchema, { service: 'server', file, overrides });
  const stateDir = path.resolve(c.stateDir);
  const runDir = path.resolve(c.runDir);
  const poddPkgDir = path.dirname(require.resolve('@sandnode/podd/package.json'));
  const poddVersion = (JSON.parse(readFileSync(path.join(poddPkgDir, 'package.json'), 'utf8')) as { version: string }).version;
  return {
    ...c,
    stateDir,
    runDir,
    socket: c.socket || socketPath(runDir, 'server'),
    vmmAddress: c.vmmAddress || unixAddress(socketPath(runDir, 'vmm-supervisor')),
    ublkAddress: c.ublkAddress || unixAddress(socketPath(runDir, 'ublk-manager')),
    poddBundle: c.poddBundle || path.join(poddPkgDir, 'dist', 'podd.bundle.js'),
    templateNode: path.resolve(c.templateNode || process.execPath),
    poddVersion,
    templatesDir: path.join(stateDir, 'templates'),
  };
}
