/**
 * The node's recorded settings: the daemons' config variables (`SANDNODE_SERVER_*`,
 * `SANDNODE_VMM_SUPERVISOR_*`, `SANDNODE_UBLK_MANAGER_*`) given to the `up` that last gave any,
 * kept in `<stateDir>/node-settings.json` (mode 0600, replaced atomically) and given to every
 * daemon the tools start later when the caller gives none: a supervisor restarted with a bare
 * `sandnode up`, a ublk-manager started by `upgrade ublk-manager --from-build` or by `resume`.
 * Without it such a daemon came up on its defaults: the default pool (network off beside a
 * second node), other DNS / proxy / metrics ports than its node's (newcomer finding, stop 23).
 * The rule is whole-set, not per key: a caller who gives at least one such variable replaces the
 * record with exactly what it gives; a caller who gives none gets the record. Variables that
 * belong to one process (dirs, slot, listen address, takeover, failpoints) are never recorded.
 */
import { closeSync, constants, fstatSync, openSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import path from 'node:path';

/** The record's file name in the state dir. */
export const NODE_SETTINGS_FILE = 'node-settings.json';
/** Largest record read, bytes (a bigger file is not a record this tool wrote). */
const MAX_RECORD_BYTES = 64 * 1024;
/** A daemon config variable. */
const SETTING_RE = /^SANDNODE_(SERVER|VMM_SUPERVISOR|UBLK_MANAGER)_[A-Z0-9_]{1,64}$/;
/** The per-process variables of every daemon (suffixes after the daemon's prefix). */
const PER_PROCESS = new Set(['STATE_DIR', 'RUN_DIR', 'CONFIG', 'SLOT', 'LISTEN', 'TAKEOVER', 'FAILPOINTS']);

/** isNodeSetting says whether env var name is a daemon config variable the record keeps. */
export function isNodeSetting(name: string): boolean {
  const m = SETTING_RE.exec(name);
  if (!m) return false;
  return !PER_PROCESS.has(name.slice(`SANDNODE_${m[1]}_`.length));
}

/** settingsOf is the daemon config variables of env (sorted by name). */
export function settingsOf(env: NodeJS.ProcessEnv): Record<string, string> {
  const out: Record<string, string> = {};
  for (const k of Object.keys(env).sort()) {
    const v = env[k];
    if (v !== undefined && isNodeSetting(k)) out[k] = v;
  }
  return out;
}

/** nodeSettingsFile is the record's path for stateDir. */
export function nodeSettingsFile(stateDir: string): string {
  return path.join(path.resolve(stateDir), NODE_SETTINGS_FILE);
}

/**
 * readNodeSettings reads stateDir's record: {} when there is none. A record that is not a
 * regular file (a symlink is not followed), is too big, is not JSON of string values, or holds
 * a name that is not a daemon config variable is refused with Error naming the file and why:
 * a daemon must not start on settings nobody gave.
 */
export function readNodeSettings(stateDir: string): Record<string, string> {
  const file = nodeSettingsFile(stateDir);
  let fd: number;
  try {
    fd = openSync(file, constants.O_RDONLY | constants.O_NOFOLLOW);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return {};
    throw new Error(`${file}: cannot be read (${(err as Error).message}); remove it to start the daemons on their defaults`, { cause: err });
  }
  try {
    const st = fstatSync(fd);
    if (!st.isFile() || st.size > MAX_RECORD_BYTES) throw new Error(`${file}: not a settings record (a regular file of at most ${MAX_RECORD_BYTES} bytes); remove it`);
    let parsed: unknown;
    try {
      parsed = JSON.parse(readFileSync(fd, 'utf8'));
    } catch (err) {
      throw new Error(`${file}: not JSON (${(err as Error).message}); remove it or run up with the node's settings`, { cause: err });
    }
    const env = (parsed as { env?: unknown } | null)?.env;
    if (typeof env !== 'object' || env === null || Array.isArray(env)) throw new Error(`${file}: has no "env" object; remove it`);
    const out: Record<string, string> = {};
    for (const [k, v] of Object.entries(env)) {
      if (!isNodeSetting(k) || typeof v !== 'string') throw new Error(`${file}: "${k}" is not a daemon config variable with a string value; remove the file`);
      out[k] = v;
    }
    return out;
  } finally {
    closeSync(fd);
  }
}

/** writeNodeSettings replaces stateDir's record with settings (temp file 0600 + rename). Throws the fs error. */
export function writeNodeSettings(stateDir: string, settings: Record<string, string>): void {
  const file = nodeSettingsFile(stateDir);
  const tmp = `${file}.${process.pid}.tmp`;
  writeFileSync(tmp, `${JSON.stringify({ version: 1, env: settings }, null, 2)}\n`, { mode: 0o600, flag: 'w' });
  renameSync(tmp, file);
}

/** Where the settings a daemon starts with come from. */
export interface NodeSettings {
  /** the daemon config variables to start with */
  env: Record<string, string>;
  /** caller: its own (the record now holds them); recorded: the record's (the caller gave none); none: neither */
  source: 'caller' | 'recorded' | 'none';
  file: string;
}

/**
 * nodeSettings decides the settings of the daemons started now (see the file header): the
 * caller's when callerEnv has any (record: true writes them as the record first), else the
 * record's. Errors: readNodeSettings's, writeNodeSettings's.
 */
export function nodeSettings(stateDir: string, callerEnv: NodeJS.ProcessEnv, opts: { record?: boolean } = {}): NodeSettings {
  const file = nodeSettingsFile(stateDir);
  const own = settingsOf(callerEnv);
  if (Object.keys(own).length > 0) {
    if (opts.record) writeNodeSettings(stateDir, own);
    return { env: own, source: 'caller', file };
  }
  const recorded = readNodeSettings(stateDir);
  return { env: recorded, source: Object.keys(recorded).length > 0 ? 'recorded' : 'none', file };
}

/** recordedNote is the stderr line that says a start used the record ('' otherwise). */
export function recordedNote(s: NodeSettings): string {
  if (s.source !== 'recorded') return '';
  const list = Object.entries(s.env)
    .map(([k, v]) => `${k}=${v}`)
    .join(' ');
  return `sandnode: the daemons started with the node's recorded settings (${s.file}): ${list}; give any SANDNODE_<DAEMON>_* variable to up to replace them all\n`;
}
