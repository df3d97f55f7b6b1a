/**
 * Config: one typed zod schema per service, named keys with defaults, read from an optional
 * JSON file and overridden by environment variables `SANDNODE_<SERVICE>_<KEY>` (KEY is the
 * camelCase key in UPPER_SNAKE_CASE). Validated at start: an invalid value throws a
 * {@link ConfigError} whose message names the key and where it came from.
 *
 * Config files that roll back (docs/config.md):
 *   - Every file carries `version`, its format: 1 (releases 0.1.0 and 0.2.0: every key must be
 *     known, a v1 file may omit `version`) or 2 (from 0.3.0: `version` is mandatory, keys the
 *     reader does not know are logged once and ignored, unless the file lists them in
 *     `required`: then the reader refuses to start, naming them).
 *   - Per-format slots: the config named `dir/server.json` has its format-k copy (k >= 2) in
 *     `dir/server.v<k>.json`, and the format-1 copy is `dir/server.json` itself. A reader
 *     takes the newest slot whose format it reads ({@link pickConfigSlot}); a release that
 *     only reads format 1 (0.2.0) reads the file it was given, the format-1 slot. Writers
 *     ({@link writeConfigSlots}) write every slot: a new key goes into the v2 slot, the v1 slot
 *     keeps the keys format-1 readers know, so a rollback never meets a key it refuses.
 */
import { existsSync, readdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { z } from 'zod';
import { readTrustedFile } from './config-trust';

/** The newest config file format this release reads and writes (the `version` key). */
export const CONFIG_FILE_VERSION = 2;
/** The oldest config file format this release reads. */
export const OLDEST_CONFIG_FILE_VERSION = 1;
/** The file key that lists keys a reader must know (format 2 on); not a config key. */
export const REQUIRED_KEY = 'required';

/** A config that failed validation; the message names every bad key. */
export class ConfigError extends Error {
  override name = 'ConfigError';
}

/**
 * A ConfigNote is something about the config file a daemon logs once at its start (warn) and
 * goes on: keys it ignored. kind "unknown": keys this build does not know (a newer build's key,
 * or a typo); kind "retired": keys an older release read that this build no longer uses.
 */
export interface ConfigNote {
  /** the file the keys are in (the slot that was read) */
  file: string;
  kind: 'unknown' | 'retired';
  /** the keys, in file order */
  keys: string[];
  /** one line for the log, naming the file and the keys */
  message: string;
}

/** envKey("vmm-supervisor", "stateDir") -> "SANDNODE_VMM_SUPERVISOR_STATE_DIR". */
export function envKey(service: string, key: string): string {
  const snake = key.replace(/([a-z0-9])([A-Z])/g, '$1_$2').toUpperCase();
  return `SANDNODE_${service.replace(/-/g, '_').toUpperCase()}_${snake}`;
}

export interface LoadConfigOptions {
  /** The service name used in env var names, e.g. "vmm-supervisor". */
  service: string;
  /**
   * Path of a JSON config file (its format-1 slot); also taken from `SANDNODE_<SERVICE>_CONFIG`.
   * Optional. The newest slot beside it this build reads is used ({@link pickConfigSlot}).
   */
  file?: string;
  /** The environment to read (default process.env). */
  env?: NodeJS.ProcessEnv;
  /** Values that override file and env (command-line flags). */
  overrides?: Record<string, unknown>;
  /**
   * Keys older releases read that this build no longer has, each with a line on what became
   * of it: in a file they are ignored with a "retired" note (never an error), so the config of
   * a rollback target still starts this build.
   */
  retired?: Readonly<Record<string, string>>;
  /** Where the notes about ignored keys go (the daemon logs them once at its start); default: dropped. */
  notes?: ConfigNote[];
}

/**
 * configSlotPath is the path of the format-`version` slot of the config named file:
 * version 1 is file itself, version k >= 2 is file with `.v<k>` before its `.json` extension
 * (`/etc/sandnode/server.json` -> `/etc/sandnode/server.v2.json`; a name without `.json` gets
 * `.v<k>` appended).
 */
export function configSlotPath(file: string, version: number): string {
  if (version <= 1) return file;
  return file.endsWith('.json') ? `${file.slice(0, -'.json'.length)}.v${version}.json` : `${file}.v${version}`;
}

/**
 * pickConfigSlot is the slot of file a reader of formats up to maxVersion (default
 * {@link CONFIG_FILE_VERSION}) reads: the newest existing `configSlotPath(file, k)` for k =
 * maxVersion down to 2, else file itself (which may not exist: reading it then fails naming it).
 */
export function pickConfigSlot(file: string, maxVersion = CONFIG_FILE_VERSION): string {
  for (let k = maxVersion; k >= 2; k--) {
    const slot = configSlotPath(file, k);
    if (slot !== file && existsSync(slot)) return slot;
  }
  return file;
}

/** A config file as read: its format and its keys (`version` and `required` taken out). */
export interface ConfigFileContent {
  /** the slot that was read */
  file: string;
  version: number;
  /** the keys the writer says a reader must know ([] when none) */
  required: string[];
  keys: Record<string, unknown>;
}

/**
 * readConfigFile reads and checks the envelope of one config file, read only when it and every
 * dir above it are root's or this daemon's ({@link readTrustedFile}, config-trust.ts: else a
 * ConfigError naming the path, its owner and mode): a JSON object whose
 * `version` is an integer 1..CONFIG_FILE_VERSION (absent: 1, only a format-1 file may omit it)
 * and whose `required`, when present, is a list of key names. Throws ConfigError naming the
 * file and what is wrong (unreadable, not JSON, a newer format, a bad `required`).
 */
export function readConfigFile(file: string): ConfigFileContent {
  let parsed: unknown;
  try {
    parsed = JSON.parse(readTrustedFile(file));
  } catch (err) {
    if (err instanceof ConfigError) throw err;
    throw new ConfigError(`config file ${file}: ${(err as Error).message}`);
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) throw new ConfigError(`config file ${file}: must be a JSON object`);
  const { version = OLDEST_CONFIG_FILE_VERSION, [REQUIRED_KEY]: required = [], ...keys } = parsed as Record<string, unknown>;
  if (typeof version !== 'number' || !Number.isInteger(version) || version < OLDEST_CONFIG_FILE_VERSION)
    throw new ConfigError(`config file ${file}: key "version" is ${JSON.stringify(version)}, must be a config format ${OLDEST_CONFIG_FILE_VERSION}..${CONFIG_FILE_VERSION}`);
  if (version > CONFIG_FILE_VERSION)
    throw new ConfigError(
      `config file ${file}: key "version" is ${version}, this build reads config formats ${OLDEST_CONFIG_FILE_VERSION}..${CONFIG_FILE_VERSION}: give it the slot of a format it reads (${path.basename(configSlotPath(file, CONFIG_FILE_VERSION))}, written beside it by every writer of a newer format; docs/config.md)`,
    );
  if (!Array.isArray(required) || !required.every((k): k is string => typeof k === 'string' && /^[A-Za-z][A-Za-z0-9]*$/.test(k)))
    throw new ConfigError(`config file ${file}: key "${REQUIRED_KEY}" must be a list of key names (e.g. ["networkPool"])`);
  return { file, version, required, keys };
}

/**
 * loadConfig validates file + env + overrides against schema (an object schema whose fields
 * have defaults). The file is the newest slot of opts.file this build reads (pickConfigSlot).
 * Keys of the file that the schema lacks are ignored and reported once in opts.notes ("retired"
 * for opts.retired keys, else "unknown") unless the file lists them in `required`: then
 * ConfigError naming them. Env values are strings; zod's coerce in the schema turns them into
 * numbers or booleans. Throws ConfigError naming each bad key.
 */
export function loadConfig<S extends z.ZodObject<z.ZodRawShape>>(schema: S, opts: LoadConfigOptions): z.infer<S> {
  const env = opts.env ?? process.env;
  const raw: Record<string, unknown> = {};
  const given = opts.file ?? env[envKey(opts.service, 'config')];
  if (given) {
    const f = readConfigFile(pickConfigSlot(given));
    const known = new Set(Object.keys(schema.shape));
    const missing = f.required.filter((k) => !known.has(k));
    if (missing.length)
      throw new ConfigError(
        `config file ${f.file}: its "${REQUIRED_KEY}" lists keys this build of ${opts.service} does not know: ${missing.join(', ')} (run a build that knows them with this file, or take them out of "${REQUIRED_KEY}")`,
      );
    const ignored = Object.keys(f.keys).filter((k) => !known.has(k));
    const retired = ignored.filter((k) => opts.retired?.[k] !== undefined);
    const unknown = ignored.filter((k) => opts.retired?.[k] === undefined);
    if (unknown.length)
      opts.notes?.push({
        file: f.file,
        kind: 'unknown',
        keys: unknown,
        message: `config file ${f.file}: ignoring keys this build of ${opts.service} does not know: ${unknown.join(', ')} (a newer build's keys, or a typo)`,
      });
    if (retired.length)
      opts.notes?.push({
        file: f.file,
        kind: 'retired',
        keys: retired,
        message: `config file ${f.file}: ignoring keys this build of ${opts.service} no longer uses: ${retired.map((k) => `${k} (${opts.retired?.[k]})`).join(', ')}`,
      });
    for (const [k, v] of Object.entries(f.keys)) if (known.has(k)) raw[k] = v;
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
 * logConfigNotes logs each note once at warn, with the file, its kind and keys as fields (a
 * daemon calls it right after its logger exists: the config is read before).
 */
export function logConfigNotes(log: { warn(obj: object, msg: string): void }, notes: readonly ConfigNote[]): void {
  for (const n of notes) log.warn({ configFile: n.file, ignoredKeys: n.keys, kind: n.kind }, n.message);
}

/** What {@link writeConfigSlots} writes: the config's keys and which of them each format's readers know. */
export interface ConfigSlotsSpec {
  /** the keys and their values (JSON values; `version` and `required` are not keys) */
  values: Record<string, unknown>;
  /**
   * The keys format-1 readers know (releases 0.1.0 and 0.2.0 refuse any other key): the
   * component's `V1_KEYS`. Only these go into the format-1 slot.
   */
  v1Keys: readonly string[];
  /**
   * Keys a reader must know to run with this config (it refuses to start otherwise): listed in
   * the v2 slot's `required`, and put into the v1 slot too, so that a format-1 reader refuses
   * naming the key instead of running without it. Default none.
   */
  required?: readonly string[];
  /** file mode (default 0600: settings may name key files) */
  mode?: number;
}

/**
 * writeConfigSlots writes the config named file in every format this build writes: the
 * format-2 slot (`configSlotPath(file, 2)`: `version: 2`, every key, `required`) and the
 * format-1 slot (file itself: `version: 1`, the v1 keys plus the required ones), each replaced
 * atomically (temp file + rename, v2 first). Slots of a newer format beside it (a newer build
 * wrote them; they no longer say what the node runs with) are removed, so a later upgrade
 * reads this config, not a stale one. Returns the paths written. Throws the fs error, or
 * ConfigError when a value is not JSON-representable.
 */
export function writeConfigSlots(file: string, spec: ConfigSlotsSpec): string[] {
  const required = [...new Set(spec.required ?? [])];
  for (const k of required) if (!(k in spec.values)) throw new ConfigError(`writeConfigSlots ${file}: required key "${k}" has no value`);
  const v1 = new Set([...spec.v1Keys, ...required]);
  const mode = spec.mode ?? 0o600;
  const v2Body: Record<string, unknown> = { version: 2, ...(required.length ? { [REQUIRED_KEY]: required } : {}) };
  const v1Body: Record<string, unknown> = { version: 1 };
  for (const [k, v] of Object.entries(spec.values)) {
    if (k === 'version' || k === REQUIRED_KEY) continue;
    if (v === undefined || typeof v === 'function' || typeof v === 'symbol' || typeof v === 'bigint') throw new ConfigError(`writeConfigSlots ${file}: key "${k}" has no JSON value`);
    v2Body[k] = v;
    if (v1.has(k)) v1Body[k] = v;
  }
  const out: string[] = [];
  const put = (p: string, body: Record<string, unknown>) => {
    const tmp = `${p}.${process.pid}.tmp`;
    writeFileSync(tmp, `${JSON.stringify(body, null, 2)}\n`, { mode });
    renameSync(tmp, p);
    out.push(p);
  };
  put(configSlotPath(file, 2), v2Body);
  put(file, v1Body);
  for (const stale of newerSlots(file)) rmSync(stale, { force: true });
  return out;
}

/** newerSlots lists the slots of file beside it whose format is newer than CONFIG_FILE_VERSION. */
function newerSlots(file: string): string[] {
  const dir = path.dirname(file);
  const base = path.basename(file);
  const json = base.endsWith('.json');
  const stem = json ? base.slice(0, -'.json'.length) : base;
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch {
    return [];
  }
  return names
    .filter((n) => {
      if (!n.startsWith(`${stem}.v`) || (json && !n.endsWith('.json'))) return false;
      const mid = n.slice(stem.length + 2, json ? -'.json'.length : undefined);
      return /^\d+$/.test(mid) && Number(mid) > CONFIG_FILE_VERSION;
    })
    .map((n) => path.join(dir, n));
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
