/**
 * Config: one typed zod schema per service, named keys with defaults, read from an optional
 * JSON file (`version: 1`) and overridden by environment variables `SANDNODE_<SERVICE>_<KEY>`
 * (KEY is the camelCase key in UPPER_SNAKE_CASE). Validated at start: an invalid value throws
 * a {@link ConfigError} whose message names the key and where it came from.
 */
import { readFileSync } from 'node:fs';
import { z } from 'zod';

/** The config file format version this release reads. */
export const CONFIG_FILE_VERSION = 1;

/** A config that failed validation; the message names every bad key. */
export class ConfigError extends Error {
  override name = 'ConfigError';
}

/** envKey("vmm-supervisor", "stateDir") -> "SANDNODE_VMM_SUPERVISOR_STATE_DIR". */
export function envKey(service: string, key: string): string {
  const snake = key.replace(/([a-z0-9])([A-Z])/g, '$1_$2').toUpperCase();
  return `SANDNODE_${service.replace(/-/g, '_').toUpperCase()}_${snake}`;
}

export interface LoadConfigOptions {
  /** The service name used in env var names, e.g. "vmm-supervisor". */
  service: string;
  /** Path of a JSON config file; also taken from `SANDNODE_<SERVICE>_CONFIG`. Optional. */
  file?: string;
  /** The environment to read (default process.env). */
  env?: NodeJS.ProcessEnv;
  /** Values that override file and env (command-line flags). */
  overrides?: Record<string, unknown>;
}

/**
 * loadConfig validates file + env + overrides against schema (an object schema whose fields
 * have defaults). Env values are strings; zod's coerce in the schema turns them into numbers
 * or booleans. Throws ConfigError naming each bad key.
 */
export function loadConfig<S extends z.ZodObject<z.ZodRawShape>>(schema: S, opts: LoadConfigOptions): z.infer<S> {
  const env = opts.env ?? process.env;
  const raw: Record<string, unknown> = {};
  const file = opts.file ?? env[envKey(opts.service, 'config')];
  if (file) {
    let parsed: unknown;
    try {
      parsed = JSON.parse(readFileSync(file, 'utf8'));
    } catch (err) {
      throw new ConfigError(`config file ${file}: ${(err as Error).message}`);
    }
    if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) {
      throw new ConfigError(`config file ${file}: must be a JSON object`);
    }
    const { version, ...rest } = parsed as Record<string, unknown>;
    if (version !== undefined && version !== CONFIG_FILE_VERSION) {
      throw new ConfigError(`config file ${file}: key "version" is ${String(version)}, this release reads ${CONFIG_FILE_VERSION}`);
    }
    const known = new Set(Object.keys(schema.shape));
    for (const k of Object.keys(rest)) {
      if (!known.has(k)) throw new ConfigError(`config file ${file}: unknown key "${k}"`);
    }
    Object.assign(raw, rest);
  }
  for (const key of Object.keys(schema.shape)) {
    // An empty value counts: it is how a string key is set to "" (e.g. to disable a listener).
    const v = env[envKey(opts.service, key)];
    if (v !== undefined) raw[key] = v;
  }
  for (const [k, v] of Object.entries(opts.overrides ?? {})) if (v !== undefined) raw[k] = v;
  const result = schema.safeParse(raw);
  if (!result.success) {
    const msgs = result.error.issues.map((i) => {
      const key = i.path.join('.') || '(root)';
      return `key "${key}" (env ${envKey(opts.service, String(i.path[0] ?? ''))}): ${i.message}`;
    });
    throw new ConfigError(`invalid ${opts.service} config: ${msgs.join('; ')}`);
  }
  return result.data;
}

/**
 * configBool is the one boolean config type: JSON true/false, or from env "true"/"false",
 * "1"/"0", "yes"/"no", "on"/"off" (zod's stringbool); anything else ("ture") is an error that
 * names the key.
 */
export const configBool = (): z.ZodType<boolean, boolean | string> => z.union([z.boolean(), z.stringbool()], { error: 'must be a boolean (true/false, 1/0, yes/no, on/off)' });

/**
 * unixSocketAddress is the schema of a daemon's gRPC address that may only be a unix socket
 * ("unix:///abs/path.sock"): the vmm-supervisor and ublk-manager authenticate callers by peer
 * credentials (root only), which TCP has not, so a TCP address is refused at start.
 */
export const unixSocketAddress = (): z.ZodString =>
  z
    .string()
    .min(1)
    .refine(
      (a) => a.startsWith('unix:///'),
      'must be a unix socket address "unix:///abs/path.sock": this service takes calls from root on its unix socket only (peer credentials), it has no TCP authentication',
    );

export { z };
