/**
 * Config of the server: one zod schema, read from an optional JSON file (`--config FILE`,
 * `version: 1`) and env `SANDNODE_SERVER_<KEY>` (KEY in UPPER_SNAKE_CASE). Keys and defaults
 * are listed in services/server/README.md. Invalid values fail the start with an error that
 * names the key (main.ts: exit 2). Same loader shape as `loadUblkConfig` / `loadVmmConfig`.
 */
import { DEFAULT_AUTO_RESUME_TIMEOUT_MS, DEFAULT_IDLE_ACTIVITY_FLUSH_MS } from './core/idle';
import path from 'node:path';
import { readFileSync } from 'node:fs';
import {
  defaultMetricsListen,
  ConfigError,
  type ConfigNote,
  DEFAULT_DRAIN_CONCURRENCY,
  DEFAULT_DRAIN_DEADLINE_MS,
  DEFAULT_RUN_DIR,
  DEFAULT_STATE_DIR,
  LOG_LEVELS,
  configBool,
  loadConfig,
  socketPath,
  unixAddress,
  z,
} from '@sandnode/shared';
import { DEFAULT_ADOPT_CONCURRENCY } from './core/adoption';
import { DEFAULT_PODD_READY_TIMEOUT_MS, DEFAULT_UPPER_BYTES } from './core/provision';
import { DEFAULT_MAX_EXEC_STREAMS } from './core/guest-io';
import { DEFAULT_POOL_FILL_CONCURRENCY, DEFAULT_POOL_HEALTH_INTERVAL_MS } from './core/pool-config';
import { DEFAULT_INGRESS_LIMITS, INGRESS_ENGINES, type IngressEngine as IngressEngineName } from './network/ingress';

/** The service name used in env var names and logs. */
export const SERVICE = 'server';

const GIB = 1024 * 1024 * 1024;

/** Deadline of a unary call to the vmm-supervisor or the ublk-manager, ms (key `peerCallTimeoutMs`). */
export const DEFAULT_PEER_CALL_TIMEOUT_MS = 60_000;
/** Retries of an idempotent call to the vmm-supervisor or the ublk-manager on UNAVAILABLE (key `peerRetryAttempts`). */
export const DEFAULT_PEER_RETRY_ATTEMPTS = 8;
/** How long a call to the vmm-supervisor or the ublk-manager waits for it to be reachable (a restart), ms; 0: no wait (key `peerConnectWaitMs`). */
export const DEFAULT_PEER_CONNECT_WAIT_MS = 3000;
/** Deadline of a unary call to a sandbox's podd, ms (key `poddCallTimeoutMs`). */
export const DEFAULT_PODD_CALL_TIMEOUT_MS = 30_000;
/** Retries of an idempotent call to a podd on UNAVAILABLE (key `poddRetryAttempts`). */
export const DEFAULT_PODD_RETRY_ATTEMPTS = 3;
/** How long a server that becomes active waits for the vmm-supervisor and ublk-manager to answer, ms (key `peerStartTimeoutMs`). */
export const DEFAULT_PEER_START_TIMEOUT_MS = 30_000;
/** Deadline of the standby's calls to the active server's AdminService during a takeover, ms (key `handoverCallTimeoutMs`). */
export const DEFAULT_HANDOVER_CALL_TIMEOUT_MS = 60_000;
/** How long the standby waits for the active server's listening sockets, ms (key `handoverFdTimeoutMs`). */
export const DEFAULT_HANDOVER_FD_TIMEOUT_MS = 30_000;
/** How long the standby waits for the old server to release the lease after Handover, ms (key `leaseAcquireTimeoutMs`). */
export const DEFAULT_LEASE_ACQUIRE_TIMEOUT_MS = 10_000;
/** Drain defaults (key `drainDeadlineMs` / `drainConcurrency` for SIGTERM; AdminService.Drain with 0 uses them): one pair in @sandnode/shared. */
export { DEFAULT_DRAIN_CONCURRENCY, DEFAULT_DRAIN_DEADLINE_MS };

/** Default of key `ingressListen` (loopback: curl and browsers on the node reach `http://8080-sb-….localhost:8480/`). */
export const DEFAULT_INGRESS_LISTEN = '127.0.0.1:8480';
/** Default of key `ingressDomain`. */
export const DEFAULT_INGRESS_DOMAIN = 'localhost';

const ms = (min: number) => z.coerce.number().int().min(min).max(86_400_000);

/** The config schema; every key has a default. */
export const configSchema = z.object({
  /** state dir: records.db, templates/ */
  stateDir: z.string().min(1).default(DEFAULT_STATE_DIR),
  /** runtime dir: sockets, sandboxes/<id>/podd.sock */
  runDir: z.string().min(1).default(DEFAULT_RUN_DIR),
  /** public gRPC on TCP, "host:port"; empty (the default) disables it: the unix socket is the API. Needs TLS (tlsCa/tlsCert/tlsKey) unless the host is loopback, then bearer tokens */
  listen: z.string().default(''),
  /** PEM file of the CA whose client certificates the TCP listener accepts (mutual TLS); with tlsCert and tlsKey */
  tlsCa: z.string().default(''),
  /** PEM file of the TCP listener's certificate */
  tlsCert: z.string().default(''),
  /** PEM file of the TCP listener's private key */
  tlsKey: z.string().default(''),
  /** public gRPC on a unix socket; default <runDir>/server.sock */
  socket: z.string().default(''),
  /** group (name or gid) whose members may call the public unix socket besides root (socket chgrp'ed, 0660); empty: root only */
  socketGroup: z.string().default(''),
  /** vmm-supervisor address; default unix://<runDir>/vmm-supervisor.sock */
  vmmAddress: z.string().default(''),
  /** ublk-manager address; default unix://<runDir>/ublk-manager.sock */
  ublkAddress: z.string().default(''),
  logLevel: z.enum(LOG_LEVELS).default('info'),
  /** size of each sandbox's rootfs upper device, bytes (sparse) */
  upperBytes: z.coerce
    .number()
    .int()
    .min(16 * 1024 * 1024)
    .default(DEFAULT_UPPER_BYTES),
  /** default /workspace size, bytes (sparse) */
  defaultDiskBytes: z.coerce
    .number()
    .int()
    .min(16 * 1024 * 1024)
    .default(GIB),
  defaultVcpus: z.coerce.number().int().min(1).max(64).default(1),
  defaultMemoryMib: z.coerce.number().int().min(32).max(65536).default(512),
  /** how long podd gets to answer after a VM starts, ms */
  poddReadyTimeoutMs: z.coerce.number().int().min(100).default(DEFAULT_PODD_READY_TIMEOUT_MS),
  /** most Exec streams one sandbox may have running at once; one more is RESOURCE_EXHAUSTED */
  maxExecStreamsPerSandbox: z.coerce.number().int().min(1).max(10_000).default(DEFAULT_MAX_EXEC_STREAMS),
  /** how long an Exec, file call or ingress request waits for the auto-resume of a paused or hibernated sandbox, ms (then UNAVAILABLE / 503) */
  autoResumeTimeoutMs: z.coerce.number().int().min(100).max(600_000).default(DEFAULT_AUTO_RESUME_TIMEOUT_MS),
  /** the in-memory activity of a sandbox with idle settings is written to its record at most this often, ms (and at a handover or drain) */
  idleActivityFlushMs: z.coerce.number().int().min(100).max(600_000).default(DEFAULT_IDLE_ACTIVITY_FLUSH_MS),
  /** how often expired sandboxes are looked for, ms */
  reaperIntervalMs: z.coerce.number().int().min(100).default(1000),
  /** warm-pool members created at once, node-wide (core/pool.ts); user creates go first */
  poolFillConcurrency: z.coerce.number().int().min(1).max(64).default(DEFAULT_POOL_FILL_CONCURRENCY),
  /** how often each waiting warm-pool member's podd is asked for health, ms; one that fails is replaced */
  poolHealthIntervalMs: z.coerce.number().int().min(100).max(3_600_000).default(DEFAULT_POOL_HEALTH_INTERVAL_MS),
  /** records checked at once during adoption */
  adoptConcurrency: z.coerce.number().int().min(1).max(256).default(DEFAULT_ADOPT_CONCURRENCY),
  /** podd bundle copied into templates; default: the built @sandnode/podd */
  poddBundle: z.string().default(''),
  /** Node binary copied into templates (>= 22); default: the Node this server runs on (the toolchain's, deploy/node-env.sh) */
  templateNode: z.string().default(''),
  /** Prometheus /metrics "host:port" (default 127.0.0.1:9464); empty disables. Moves with the lease at a handover; a port in use is logged and retried, never fatal */
  metricsListen: z
    .string()
    .regex(/^$|^[^:]+:\d{1,5}$/, 'must be "host:port" or empty')
    .default(defaultMetricsListen('server')),
  /** the HTTP ingress to sandboxes' ports, "host:port" (docs/network.md); empty disables. Handed over like the gRPC listeners */
  ingressListen: z
    .string()
    .regex(/^$|^(\[[0-9a-fA-F:.]+\]|[^:\s]+):[0-9]{1,5}$/, 'must be host:port or empty')
    .default(DEFAULT_INGRESS_LISTEN),
  /** ingress hosts are <port>-<sandbox_id>.<ingressDomain> */
  ingressDomain: z
    .string()
    .regex(/^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$/i, 'must be a DNS name')
    .default(DEFAULT_INGRESS_DOMAIN),
  /** the sandboxes' resolver forwards to these, "a.b.c.d[:port]" comma-separated; "" = the nameservers of /etc/resolv.conf */
  dnsUpstreams: z
    .string()
    .regex(/^$|^\d{1,3}(\.\d{1,3}){3}(:\d{1,5})?(\s*,\s*\d{1,3}(\.\d{1,3}){3}(:\d{1,5})?)*$/, 'comma-separated IPv4 address[:port] list, or empty')
    .default(''),
  /** which ingress engine serves: "raw" (own HTTP/1.1 head parser, bodies passed through as they came) or "node-http" (node:http); same behaviour, raw is faster */
  ingressEngine: z.enum(INGRESS_ENGINES as [IngressEngineName, ...IngressEngineName[]]).default('raw'),
  /** client connections the ingress holds at once */
  ingressMaxConnections: z.coerce.number().int().min(1).max(1_000_000).default(DEFAULT_INGRESS_LIMITS.maxConnections),
  /** forwarded requests, WebSockets and tunnels per sandbox at once; one more answers 429 */
  ingressMaxConnectionsPerSandbox: z.coerce.number().int().min(1).max(1_000_000).default(DEFAULT_INGRESS_LIMITS.maxPerSandbox),
  /** time a client gets to send a request head, ms (slowloris) */
  ingressHeadersTimeoutMs: ms(100).default(DEFAULT_INGRESS_LIMITS.headersTimeoutMs),
  /** an ingress connection or tunnel without traffic is closed after this, ms */
  ingressIdleTimeoutMs: ms(100).default(DEFAULT_INGRESS_LIMITS.idleTimeoutMs),
  /** time running calls get at shutdown, ms */
  drainMs: z.coerce.number().int().min(0).default(5000),
  /** A/B slot of this server ("a", "b" or ""); names its admin socket */
  slot: z.enum(['', 'a', 'b']).default(''),
  /** start as the standby that takes the node over from the active server (upgrade) */
  takeover: configBool().default(false),
  /** how long a retiring server relays running streams before it exits, ms */
  retireDrainMs: z.coerce.number().int().min(0).default(600_000),
  /** SIGTERM drains the node first (pod deletion); off for local runs */
  drainOnSigterm: configBool().default(false),
  /** deadline of the SIGTERM drain, ms (keep it below the pod's grace period) */
  drainDeadlineMs: ms(1000).default(DEFAULT_DRAIN_DEADLINE_MS),
  /** sandboxes drained at once on SIGTERM */
  drainConcurrency: z.coerce.number().int().min(1).max(256).default(DEFAULT_DRAIN_CONCURRENCY),
  /** deadline of a unary call to the vmm-supervisor / ublk-manager, ms */
  peerCallTimeoutMs: ms(100).default(DEFAULT_PEER_CALL_TIMEOUT_MS),
  /** retries of an idempotent call to the vmm-supervisor / ublk-manager on UNAVAILABLE */
  peerRetryAttempts: z.coerce.number().int().min(0).max(100).default(DEFAULT_PEER_RETRY_ATTEMPTS),
  /** how long a call to the vmm-supervisor / ublk-manager waits for it to be reachable (a restart); past it UNAVAILABLE names the peer, ms */
  peerConnectWaitMs: z.coerce.number().int().min(0).max(600_000).default(DEFAULT_PEER_CONNECT_WAIT_MS),
  /** deadline of a unary call to a podd, ms */
  poddCallTimeoutMs: ms(100).default(DEFAULT_PODD_CALL_TIMEOUT_MS),
  /** retries of an idempotent call to a podd on UNAVAILABLE */
  poddRetryAttempts: z.coerce.number().int().min(0).max(100).default(DEFAULT_PODD_RETRY_ATTEMPTS),
  /** how long a server that becomes active waits for the vmm-supervisor and ublk-manager, ms */
  peerStartTimeoutMs: ms(100).default(DEFAULT_PEER_START_TIMEOUT_MS),
  /** deadline of the standby's AdminService calls during a takeover, ms */
  handoverCallTimeoutMs: ms(100).default(DEFAULT_HANDOVER_CALL_TIMEOUT_MS),
  /** how long the standby waits for the listening sockets, ms */
  handoverFdTimeoutMs: ms(100).default(DEFAULT_HANDOVER_FD_TIMEOUT_MS),
  /** how long the standby waits for the old server to release the lease, ms */
  leaseAcquireTimeoutMs: ms(100).default(DEFAULT_LEASE_ACQUIRE_TIMEOUT_MS),
});

/**
 * KEY_SINCE: the release that brought each key older than this release line (docs/config.md);
 * a key of the schema not listed here is since 0.3.0. V1_KEYS are the keys format-1 readers
 * (0.1.0 and 0.2.0, which refuse any key they do not know) read: the format-1 slot of a config
 * this build writes holds only these (writeConfigSlots, @sandnode/shared).
 */
export const KEY_SINCE: Readonly<Record<string, string>> = Object.fromEntries(
  [
    'stateDir',
    'runDir',
    'listen',
    'socket',
    'vmmAddress',
    'ublkAddress',
    'logLevel',
    'upperBytes',
    'defaultDiskBytes',
    'defaultVcpus',
    'defaultMemoryMib',
    'poddReadyTimeoutMs',
    'reaperIntervalMs',
    'adoptConcurrency',
    'poddBundle',
    'metricsListen',
    'drainMs',
    'slot',
    'takeover',
    'retireDrainMs',
    'drainOnSigterm',
    'drainDeadlineMs',
  ].map((k) => [k, '0.1.0']),
);
/** The keys format-1 readers know (see KEY_SINCE). */
export const V1_KEYS: readonly string[] = Object.keys(KEY_SINCE);

/** isLoopback: whether a listen host only takes connections from this machine (127.0.0.0/8, ::1, localhost). */
export function isLoopback(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, '');
  return h === 'localhost' || h === '::1' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(h);
}

/**
 * checkTcpAuth refuses a TCP listener that could be called without credentials (issue 10 §4):
 * the TLS keys go together (ConfigError naming the missing one), and without them `listen`
 * must be a loopback host (plaintext, bearer tokens only). ConfigError naming the key.
 */
export function checkTcpAuth(c: { listen: string; tlsCa: string; tlsCert: string; tlsKey: string }): void {
  const tls = { tlsCa: c.tlsCa, tlsCert: c.tlsCert, tlsKey: c.tlsKey };
  const set = Object.entries(tls).filter(([, v]) => v);
  if (set.length > 0 && set.length < 3) {
    const missing = Object.keys(tls).filter((k) => !tls[k as keyof typeof tls]);
    throw new ConfigError(`${missing[0]}: the TCP listener's TLS needs tlsCa, tlsCert and tlsKey together (missing: ${missing.join(', ')})`);
  }
  if (!c.listen || set.length === 3) return;
  const idx = c.listen.lastIndexOf(':');
  const host = idx > 0 ? c.listen.slice(0, idx) : '';
  if (!isLoopback(host))
    throw new ConfigError(`listen: ${c.listen} is not a loopback address: a TCP listener on another host needs mutual TLS (set tlsCa, tlsCert and tlsKey; sandnode certs init makes a pair)`);
}

/** The config with every derived default filled in (absolute paths, addresses). */
export type ServerConfig = z.infer<typeof configSchema> & {
  socket: string;
  vmmAddress: string;
  ublkAddress: string;
  poddBundle: string;
  /** the Node binary copied into templates (absolute) */
  templateNode: string;
  /** the version of the podd bundle (its package.json) */
  poddVersion: string;
  /** <stateDir>/templates */
  templatesDir: string;
};

/**
 * loadServerConfig reads file + env (+ overrides, e.g. flags), validates, and resolves the
 * defaults that depend on other keys (socket, peer addresses, podd bundle). Keys of the file
 * it ignored go to opts.notes (the daemon logs them once). Throws ConfigError naming the bad key.
 */
export function loadServerConfig(opts: { file?: string; env?: NodeJS.ProcessEnv; overrides?: Record<string, unknown>; notes?: ConfigNote[] } = {}): ServerConfig {
  const c = loadConfig(configSchema, { service: SERVICE, ...opts });
  checkTcpAuth(c);
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
