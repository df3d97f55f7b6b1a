/**
 * podd config: one typed schema, defaults for a sandbox, env overrides `SANDNODE_PODD_<KEY>`
 * (e.g. `SANDNODE_PODD_DEFAULT_CWD`), flags override env. See the table in the README.
 */
import { loadConfig, LOG_LEVELS, z, type ConfigNote } from '@sandnode/shared';
import { DEFAULT_SYNC_TIMEOUT_MS } from './core/quiesce';
import { DEFAULT_MAX_EXECS } from './core/limits';

/** Default unix socket podd listens on inside the sandbox (bind-mounted from the host). */
export const DEFAULT_SOCKET = '/run/sandnode/podd.sock';
/** Default working directory of Exec when the request leaves cwd empty. */
export const DEFAULT_CWD = '/workspace';
/** Largest stdout/stderr chunk of one ExecResponse, in bytes (the contract says 64 KiB). */
export const MAX_CHUNK_BYTES = 64 * 1024;
/** Where the host's freeze port (vmm FreezePortService of this VM) appears in the sandbox. */
export const DEFAULT_FREEZE_SOCKET = '/run/sandnode-freeze/freeze.sock';
/** Default deadline of a call to the freeze port, in ms (a FIFREEZE writes dirty data back first). */
export const DEFAULT_FREEZE_PORT_TIMEOUT_MS = 10_000;
/** Default time running calls get to finish at shutdown, in ms. */
export const DEFAULT_PODD_DRAIN_MS = 3000;

/** The podd config schema; every key has a default. */
export const poddConfigSchema = z.object({
  /** socket is the absolute path of the unix socket to listen on. */
  socket: z
    .string()
    .min(1)
    .refine((s) => s.startsWith('/'), 'must be an absolute path')
    .default(DEFAULT_SOCKET),
  /**
   * listenFd is an inherited listening unix socket to serve on instead of binding `socket`
   * (-1: none). The vmm-supervisor binds podd's socket on the host, outside the sandbox, and
   * hands it in as fd 3 (env SANDNODE_PODD_LISTEN_FD=3), so the sandbox cannot redirect it.
   */
  listenFd: z.coerce.number().int().min(-1).default(-1),
  /** logLevel is the pino level of the stderr log. */
  logLevel: z.enum(LOG_LEVELS).default('info'),
  /** defaultCwd is the Exec working directory when a request leaves cwd empty (absolute). */
  defaultCwd: z
    .string()
    .min(1)
    .refine((s) => s.startsWith('/'), 'must be an absolute path')
    .default(DEFAULT_CWD),
  /** maxChunkBytes caps one stdout/stderr chunk, 1..65536 bytes. */
  maxChunkBytes: z.coerce.number().int().min(1).max(MAX_CHUNK_BYTES).default(MAX_CHUNK_BYTES),
  /**
   * freezeSocket is the host's freeze port socket (absolute). podd advertises "podd.quiesce"
   * only when it exists when podd starts (runc driver of a vmm-supervisor with
   * "vmm.freeze-port.v1"); without it Quiesce/Thaw/GetFreezeStatus answer UNAVAILABLE.
   */
  freezeSocket: z
    .string()
    .min(1)
    .refine((s) => s.startsWith('/'), 'must be an absolute path')
    .default(DEFAULT_FREEZE_SOCKET),
  /** freezePortTimeoutMs is the deadline of each call to the freeze port, ms (100..60000). */
  freezePortTimeoutMs: z.coerce.number().int().min(100).max(60_000).default(DEFAULT_FREEZE_PORT_TIMEOUT_MS),
  /** syncTimeoutMs is the longest Quiesce's `sync` / `sync -f` may take, in ms (1000..600000). */
  syncTimeoutMs: z.coerce.number().int().min(1000).max(600_000).default(DEFAULT_SYNC_TIMEOUT_MS),
  /**
   * maxExecs is how many commands podd runs at once, 1..100000; one more Exec is
   * RESOURCE_EXHAUSTED. Fewer when podd's open-file limit leaves room for fewer (4 fds each).
   */
  maxExecs: z.coerce.number().int().min(1).max(100_000).default(DEFAULT_MAX_EXECS),
  /** drainMs is how long running calls get at shutdown before they are cut, in ms. */
  drainMs: z.coerce.number().int().min(0).default(DEFAULT_PODD_DRAIN_MS),
});

/** PoddConfig is the validated config. */
export type PoddConfig = z.infer<typeof poddConfigSchema>;

/** LoadPoddConfigOptions say where podd's config comes from. */
export interface LoadPoddConfigOptions {
  /** JSON config file (`--config FILE`); default env SANDNODE_PODD_CONFIG, else none. */
  file?: string;
  /** Environment to read `SANDNODE_PODD_*` from (default process.env). */
  env?: NodeJS.ProcessEnv;
  /** Command-line flags; they override file and env. */
  overrides?: Partial<Record<keyof PoddConfig, unknown>>;
  /** Where the notes about keys of the file it ignored go (logged once at the start). */
  notes?: ConfigNote[];
}

/**
 * KEY_SINCE: the release that brought each key older than this release line (docs/config.md);
 * a key of the schema not listed here is since 0.3.0. V1_KEYS are the keys format-1 readers
 * (0.2.0, which refuses any key it does not know; 0.1.0 also lacks the two of 0.2.0) read.
 */
export const KEY_SINCE: Readonly<Record<string, string>> = {
  socket: '0.1.0',
  listenFd: '0.1.0',
  logLevel: '0.1.0',
  defaultCwd: '0.1.0',
  maxChunkBytes: '0.1.0',
  drainMs: '0.1.0',
  freezeSocket: '0.2.0',
  freezePortTimeoutMs: '0.2.0',
};
/** The keys format-1 readers know (see KEY_SINCE; 0.1.0 lacks freezeSocket and freezePortTimeoutMs). */
export const V1_KEYS: readonly string[] = Object.keys(KEY_SINCE);

/**
 * loadPoddConfig validates file + env (`SANDNODE_PODD_*`) + flag overrides. Throws ConfigError
 * naming the bad key.
 */
export function loadPoddConfig(opts: LoadPoddConfigOptions = {}): PoddConfig {
  return loadConfig(poddConfigSchema, { service: 'podd', file: opts.file, env: opts.env ?? process.env, overrides: opts.overrides, notes: opts.notes });
}
