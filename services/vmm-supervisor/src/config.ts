/**
 * Config of the vmm-supervisor: JSON file (`--config FILE`, `version: 1`) overridden by env
 * `SANDNODE_VMM_SUPERVISOR_<KEY>`. Keys and defaults are listed in the README.
 */
import path from 'node:path';
import {
  defaultMetricsListen,
  ConfigError,
  type ConfigNote,
  DEFAULT_ALWAYS_DENIED,
  parseCidr,
  unixSocketAddress,
  DEFAULT_DRAIN_MS,
  DEFAULT_RUN_DIR,
  DEFAULT_STATE_DIR,
  LOG_LEVELS,
  loadConfig,
  socketPath,
  unixAddress,
  z,
  defaultNetworkTag,
} from '@sandnode/shared';
import { DEFAULT_KILL_WAIT_MS, DEFAULT_RUNC_START_TIMEOUT_MS } from './drivers/runc';
import { DEFAULT_SECCOMP_PROFILE } from './drivers/seccomp';
import { DEFAULT_CONSOLE_LOG_BYTES } from './drivers/console-log';
import { DEFAULT_GUEST_RUN_DIR_BYTES } from './drivers/vm-tmpfs';
import type { IoLimits } from './drivers/block-io';
import { DEFAULT_USERNS_RANGE, parseUsernsRange, type UsernsRange } from './drivers/userns';
import { DEFAULT_FREEZE_RATE_BURST, DEFAULT_FREEZE_RATE_PER_SECOND } from './core/freeze-gate';
import { FREEZE_PORT_HANDSHAKE_MS, FREEZE_PORT_IDLE_MS, FREEZE_PORT_MAX_CONNECTIONS, FREEZE_PORT_MAX_MESSAGE_BYTES } from './rpc/freeze-port-service';

/** Kernel command line of firecracker VMs unless `kernelArgs` says otherwise. */
export const DEFAULT_KERNEL_ARGS = 'console=ttyS0 reboot=k panic=1 pci=off';

/** SIGTERM -> SIGKILL wait of StopVm/DeleteVm when the request says 0, in ms (key `stopTimeoutMs`). */
export const DEFAULT_STOP_TIMEOUT_MS = 2000;
/** The service name used in env var names and logs. */
export const SERVICE = 'vmm-supervisor';

/** The config schema; every key has a default. */
/** fromJsonEnv: a list set in env is JSON text; it gives the parsed value (undefined when the text is not JSON), and anything else as it is. */
function fromJsonEnv(v: unknown): unknown {
  if (typeof v !== 'string') return v;
  try {
    return JSON.parse(v);
  } catch {
    return undefined;
  }
}

export const configSchema = z.object({
  /** State dir: the VM table lives in `<stateDir>/vmm-supervisor/vm-table.db`. */
  stateDir: z.string().min(1).default(DEFAULT_STATE_DIR),
  /** Runtime dir: the socket and the per-VM dirs `<runDir>/vms/<id>`. */
  runDir: z.string().min(1).default(DEFAULT_RUN_DIR),
  /**
   * gRPC address, a unix socket only ("unix:///abs.sock"); default `unix://<runDir>/vmm-supervisor.sock`.
   * No TCP: its callers are authenticated by peer credentials (root only), which TCP has not.
   */
  listen: unixSocketAddress().optional(),
  logLevel: z.enum(LOG_LEVELS).default('info'),
  /** VM backend: "runc" (embedded) or "firecracker" (needs /dev/kvm and kernelImage). */
  driver: z.enum(['runc', 'firecracker']).default('runc'),
  /** runc binary name or path. */
  runcBinary: z.string().min(1).default('runc'),
  /** runc state dir (`runc --root`); default `<runDir>/runc`. */
  runcRoot: z.string().min(1).optional(),
  /** firecracker binary name or path (driver "firecracker"). */
  firecrackerBinary: z.string().min(1).default('firecracker'),
  /** Guest kernel (uncompressed vmlinux) of firecracker VMs; required with driver "firecracker". */
  kernelImage: z.string().min(1).optional(),
  /** Kernel command line of firecracker VMs. */
  kernelArgs: z.string().min(1).default(DEFAULT_KERNEL_ARGS),
  /** vcpus of a VM whose spec says 0. */
  defaultVcpus: z.coerce.number().int().min(1).max(64).default(1),
  /** Memory limit in MiB of a VM whose spec says 0. */
  defaultMemoryMib: z.coerce.number().int().min(32).max(65536).default(512),
  /** SIGTERM -> SIGKILL wait of StopVm/DeleteVm when the request says 0, in ms. */
  stopTimeoutMs: z.coerce.number().int().min(0).max(600_000).default(DEFAULT_STOP_TIMEOUT_MS),
  /** Longest a `runc run -d` (container start) may take before it is killed, in ms. */
  runcStartTimeoutMs: z.coerce.number().int().min(1000).max(600_000).default(DEFAULT_RUNC_START_TIMEOUT_MS),
  /** Longest a VM may take to be gone after SIGKILL before StopVm/DeleteVm fail INTERNAL, in ms. */
  killWaitMs: z.coerce.number().int().min(100).max(600_000).default(DEFAULT_KILL_WAIT_MS),
  /** Time running calls get to finish at shutdown (SIGTERM), in ms. */
  drainMs: z.coerce.number().int().min(0).max(600_000).default(DEFAULT_DRAIN_MS),
  /** Seccomp profile of runc sandboxes (OCI JSON; default the shipped seccomp/sandbox.json); "unconfined" for none. */
  seccompProfile: z.string().min(1).default(DEFAULT_SECCOMP_PROFILE),
  /** Most processes (tasks) in a VM whose spec says 0 (cgroup pids.max). */
  defaultPids: z.coerce.number().int().min(16).max(1_000_000).default(1024),
  /** Size of each runc VM's guest run dir (/run/sandnode, a tmpfs of its own), in bytes: 64 KiB..1 GiB. */
  guestRunDirBytes: z.coerce
    .number()
    .int()
    .min(65_536)
    .max(1024 * 1024 * 1024)
    .default(DEFAULT_GUEST_RUN_DIR_BYTES),
  /** Most bytes of a runc VM's console output (init's stdout/stderr) the host keeps: 64 KiB..64 MiB. */
  consoleLogBytes: z.coerce
    .number()
    .int()
    .min(65_536)
    .max(64 * 1024 * 1024)
    .default(DEFAULT_CONSOLE_LOG_BYTES),
  /**
   * User namespace of runc sandboxes: "<hostId>:<size>" maps host ids hostId..hostId+size-1 to
   * 0..size-1 inside every sandbox (one node-wide range); "" = none (uid 0 inside is host root).
   */
  usernsRange: z.string().default(DEFAULT_USERNS_RANGE),
  /**
   * I/O limits of each runc VM drive (rootfs upper, workspace): blkio throttles in bytes/s and
   * operations/s per drive; 0 = no limit (the default: a limit slows every copy, fork and
   * template unpack on the node, so an operator sets one for its disks).
   */
  ioReadBps: z.coerce.number().int().min(0).max(Number.MAX_SAFE_INTEGER).default(0),
  ioWriteBps: z.coerce.number().int().min(0).max(Number.MAX_SAFE_INTEGER).default(0),
  ioReadIops: z.coerce.number().int().min(0).max(Number.MAX_SAFE_INTEGER).default(0),
  ioWriteIops: z.coerce.number().int().min(0).max(Number.MAX_SAFE_INTEGER).default(0),
  /** Proportional I/O weight of each runc VM, 10..1000 (0 = none); applied only where the blkio hierarchy has a weight file. */
  ioWeight: z.coerce
    .number()
    .int()
    .refine((v) => v === 0 || (v >= 10 && v <= 1000), { message: 'must be 0 (none) or 10..1000' })
    .default(0),
  /** Connections one VM's freeze port holds at once (the one above is closed at once). */
  freezePortMaxConnections: z.coerce.number().int().min(1).max(64).default(FREEZE_PORT_MAX_CONNECTIONS),
  /** Largest message the freeze port accepts, bytes (a larger one is RESOURCE_EXHAUSTED at its header). */
  freezePortMaxMessageBytes: z.coerce.number().int().min(256).max(65_536).default(FREEZE_PORT_MAX_MESSAGE_BYTES),
  /** A freeze-port connection that has sent no byte is closed after this, ms. */
  freezePortHandshakeMs: z.coerce.number().int().min(50).max(600_000).default(FREEZE_PORT_HANDSHAKE_MS),
  /** A freeze-port connection without a call is closed after this, ms. */
  freezePortIdleMs: z.coerce.number().int().min(100).max(600_000).default(FREEZE_PORT_IDLE_MS),
  /** Unarmed freezes one VM may make at once (while the lease holder does not arm freezes). */
  freezeRateBurst: z.coerce.number().int().min(1).max(100_000).default(DEFAULT_FREEZE_RATE_BURST),
  /** Unarmed freezes per second one VM gets back. */
  freezeRatePerSecond: z.coerce.number().min(0.001).max(100_000).default(DEFAULT_FREEZE_RATE_PER_SECOND),
  /** Sandbox networking (docs/network.md); false: every VM is loopback only and a networked CreateVm is FAILED_PRECONDITION. */
  network: z
    .union([z.boolean(), z.enum(['true', 'false'])])
    .transform((v) => v === true || v === 'true')
    .default(true),
  /** The sandboxes' address pool, an IPv4 CIDR of prefix 8..28; slot s is the /30 at pool + 4s. */
  networkPool: z.string().default('10.209.0.0/16'),
  /** Prefix of every name of the node's network (`sn<tag>v<slot>`, table `inet sandnode-<tag>`): 1..4 of [0-9a-z]; default the first 4 hex digits of sha256(stateDir). */
  networkTag: z
    .string()
    .regex(/^[0-9a-z]{1,4}$/, { message: 'must be 1..4 characters of [0-9a-z]' })
    .optional(),
  /** Network slots kept pre-made (netns, veth, addresses) so that a CreateVm does not wait for them. */
  networkSpareSlots: z.coerce.number().int().min(0).max(64).default(2),
  /** Host port the sandboxes' DNS (udp/tcp 53 to any address) is redirected to (the server's resolver). */
  dnsPort: z.coerce.number().int().min(1).max(65535).default(15053),
  /** Host port the sandboxes' TCP to egressProxiedPorts is redirected to, for policies with domain rules (the server's egress proxy). */
  egressProxyPort: z.coerce.number().int().min(1).max(65535).default(15080),
  /** Destination ports redirected to the egress proxy (JSON list in env, e.g. "[80,443]"). */
  egressProxiedPorts: z
    .union([z.array(z.number()), z.string()])
    .transform((v, ctx) => {
      const a = fromJsonEnv(v);
      if (!Array.isArray(a) || a.length > 64 || !a.every((p) => Number.isInteger(p) && p >= 1 && p <= 65535)) {
        ctx.addIssue({ code: 'custom', message: 'must be a list of at most 64 ports 1..65535' });
        return z.NEVER;
      }
      return [...new Set(a as number[])].sort((x, y) => x - y);
    })
    .default([80, 443]),
  /** Ranges every sandbox is refused (JSON list in env); default the shared DEFAULT_ALWAYS_DENIED. The pool is always added. */
  networkAlwaysDenied: z
    .union([z.array(z.string()), z.string()])
    .transform((v, ctx) => {
      const a = fromJsonEnv(v);
      if (!Array.isArray(a) || a.length > 1024 || !a.every((x) => typeof x === 'string')) {
        ctx.addIssue({ code: 'custom', message: 'must be a list of IPv4 CIDRs' });
        return z.NEVER;
      }
      return a as string[];
    })
    .default([...DEFAULT_ALWAYS_DENIED]),
  /** Prometheus `/metrics` on "host:port" (default 127.0.0.1:9465); "" disables. A port in use is logged and retried, never fatal. */
  metricsListen: z
    .string()
    .regex(/^$|^[^:]+:\d{1,5}$/, { message: 'must be "host:port" or ""' })
    .default(defaultMetricsListen('vmm-supervisor')),
});

/** VmmConfig is the validated config with every derived default filled in (absolute paths). */
export interface VmmConfig {
  stateDir: string;
  runDir: string;
  listen: string;
  logLevel: z.infer<typeof configSchema>['logLevel'];
  driver: 'runc' | 'firecracker';
  runcBinary: string;
  runcRoot: string;
  firecrackerBinary: string;
  /** Absolute path; undefined unless configured. */
  kernelImage: string | undefined;
  kernelArgs: string;
  defaultVcpus: number;
  defaultMemoryMib: number;
  stopTimeoutMs: number;
  runcStartTimeoutMs: number;
  killWaitMs: number;
  drainMs: number;
  /** "host:port" of /metrics; "" = not served. */
  metricsListen: string;
  /** Path of the seccomp profile, or "unconfined". */
  seccompProfile: string;
  /** Default pids limit of a VM. */
  defaultPids: number;
  /** Size of a VM's guest run dir tmpfs, bytes. */
  guestRunDirBytes: number;
  /** Cap of a VM's console log, bytes. */
  consoleLogBytes: number;
  /** The user namespace range of runc sandboxes; undefined = none (`usernsRange` ""). */
  usernsRange: UsernsRange | undefined;
  /** I/O limits of each runc VM's drives (keys ioReadBps, ioWriteBps, ioReadIops, ioWriteIops, ioWeight); 0 = none. */
  io: IoLimits;
  freezePortMaxConnections: number;
  freezePortMaxMessageBytes: number;
  freezePortIdleMs: number;
  freezePortHandshakeMs: number;
  freezeRateBurst: number;
  freezeRatePerSecond: number;
  /** Sandbox networking on (it may still be off on a host that fails the start-up check). */
  network: boolean;
  /** The pool, canonical CIDR text. */
  networkPool: string;
  /** The names' tag (resolved default). */
  networkTag: string;
  networkSpareSlots: number;
  dnsPort: number;
  egressProxyPort: number;
  /** Sorted, unique. */
  egressProxiedPorts: number[];
  /** Canonical CIDRs, the pool included. */
  networkAlwaysDenied: string[];
}

function cidrKey(key: string, text: string): string {
  try {
    return parseCidr(text, key).text;
  } catch (err) {
    throw new ConfigError(`key "${key}": ${(err as Error).message}`);
  }
}

function networkKeys(c: z.infer<typeof configSchema>, stateDir: string) {
  const pool = cidrKey('networkPool', c.networkPool);
  const prefix = Number(pool.split('/')[1]);
  if (prefix < 8 || prefix > 28) throw new ConfigError(`key "networkPool": ${pool} must have a prefix of 8..28 (at least 4 slots of /30)`);
  if (c.dnsPort === c.egressProxyPort) throw new ConfigError(`key "egressProxyPort": ${c.egressProxyPort} is dnsPort too; they must differ`);
  const denied = [...new Set([...c.networkAlwaysDenied.map((d, i) => cidrKey(`networkAlwaysDenied[${i}]`, d)), pool])];
  return {
    network: c.network,
    networkPool: pool,
    networkTag: c.networkTag ?? defaultNetworkTag(stateDir),
    networkSpareSlots: c.networkSpareSlots,
    dnsPort: c.dnsPort,
    egressProxyPort: c.egressProxyPort,
    egressProxiedPorts: c.egressProxiedPorts,
    networkAlwaysDenied: denied,
  };
}

/**
 * KEY_SINCE: the release that brought each key older than this release line (docs/config.md);
 * a key of the schema not listed here is since 0.3.0. V1_KEYS are the keys format-1 readers
 * (0.1.0 and 0.2.0, which refuse any key they do not know) read: the format-1 slot of a config
 * this build writes holds only these (writeConfigSlots, @sandnode/shared).
 */
export const KEY_SINCE: Readonly<Record<string, string>> = Object.fromEntries(
  ['stateDir', 'runDir', 'listen', 'logLevel', 'driver', 'runcBinary', 'runcRoot', 'firecrackerBinary', 'kernelImage', 'kernelArgs', 'defaultVcpus', 'defaultMemoryMib', 'stopTimeoutMs'].map((k) => [
    k,
    '0.1.0',
  ]),
);
/** The keys format-1 readers know (see KEY_SINCE). */
export const V1_KEYS: readonly string[] = Object.keys(KEY_SINCE);

/** loadVmmConfig reads and validates the config (keys of the file it ignored go to opts.notes); throws ConfigError naming a bad key. */
export function loadVmmConfig(opts: { file?: string; env?: NodeJS.ProcessEnv; notes?: ConfigNote[] } = {}): VmmConfig {
  const c = loadConfig(configSchema, { service: SERVICE, file: opts.file, env: opts.env, notes: opts.notes });
  const runDir = path.resolve(c.runDir);
  const stateDir = path.resolve(c.stateDir);
  return {
    ...c,
    ...networkKeys(c, stateDir),
    stateDir,
    runDir,
    listen: c.listen ?? unixAddress(socketPath(runDir, 'vmm-supervisor')),
    runcRoot: path.resolve(c.runcRoot ?? path.join(runDir, 'runc')),
    kernelImage: c.kernelImage === undefined ? undefined : path.resolve(c.kernelImage),
    usernsRange: parseUsernsRange(c.usernsRange),
    io: { readBps: c.ioReadBps, writeBps: c.ioWriteBps, readIops: c.ioReadIops, writeIops: c.ioWriteIops, weight: c.ioWeight },
  };
}
