/**
 * Config files of a compat node (docs/config.md): every daemon of a cell starts with a config
 * file (`SANDNODE_<C>_CONFIG`) written by one of the two builds of the pair, so that each build
 * is run with the other build's config (`--swap-configs`, the default) or with its own
 * (`--own-configs`).
 *
 * "Written by" a build: a build that writes config slots (its common package exports
 * `writeConfigSlots`, 0.3.0 on) writes them with its own code and its own key lists (the v2
 * slot with every key of {@link NODE_SETTINGS}, the v1 slot with the keys 0.1.0 and 0.2.0 know);
 * an older build (0.2.0) has no writer: its config is what its operator wrote, a format-1 file
 * with only the keys that build knows (N's `V1_KEYS`, which the integration test
 * config-rollback.it.test.ts checks against 0.2.0's own schema).
 *
 * The settings are the node's (timeouts, drain times, limits), half of them keys only 0.3.0 on
 * knows, at values every build accepts; the dirs and listeners stay in the environment
 * (`startComponent` of node-stack), which a config file never overrides.
 */
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { sharedDirRel } from './layout';
import type { Build, Component } from './types';

/** A daemon component (as node.ts's Daemon). */
type Daemon = Exclude<Component, 'podd'>;

/** Which build's config a daemon of a cell starts with. */
export type ConfigMode = 'swapped' | 'own';

/**
 * NODE_SETTINGS: the keys of each daemon's config file with their values: a v1 part (keys
 * 0.1.0 and 0.2.0 know) and a part only 0.3.0 on knows.
 */
export const NODE_SETTINGS: Record<Daemon, Record<string, unknown>> = {
  'vmm-supervisor': { logLevel: 'info', stopTimeoutMs: 12_000, defaultVcpus: 1, defaultMemoryMib: 512, runcStartTimeoutMs: 45_000, killWaitMs: 6000, freezePortIdleMs: 50_000 },
  'ublk-manager': { logLevel: 'info', drainMs: 4000, releaseTimeoutMs: 25_000, mkfsTimeoutMs: 90_000, cloneTimeoutMs: 90_000 },
  server: { logLevel: 'info', drainMs: 4000, adoptConcurrency: 8, reaperIntervalMs: 900, peerCallTimeoutMs: 45_000, poddCallTimeoutMs: 25_000, poolHealthIntervalMs: 20_000 },
};

/** The part of a build's common package used to write slots (0.3.0 on). */
interface SlotWriter {
  writeConfigSlots(file: string, spec: { values: Record<string, unknown>; v1Keys: readonly string[] }): string[];
}

/** slotWriter is build b's writeConfigSlots, or undefined for a build that has none (0.2.0). */
export function slotWriter(b: Build): SlotWriter | undefined {
  const mod = path.join(b.dir, sharedDirRel(b.dir), 'dist', 'config.js');
  if (!existsSync(mod)) return undefined;
  const m = require(mod) as Partial<SlotWriter>;
  return typeof m.writeConfigSlots === 'function' ? (m as SlotWriter) : undefined;
}

/** v1KeysOf is N's list of the keys format-1 readers of daemon c know (`V1_KEYS` of its config module). */
export function v1KeysOf(n: Build, c: Daemon): readonly string[] {
  const m = require(path.join(n.dir, 'services', c, 'dist', 'config.js')) as { V1_KEYS?: readonly string[] };
  if (!m.V1_KEYS) throw new Error(`${c} of ${n.label} exports no V1_KEYS (services/${c}/src/config.ts)`);
  return m.V1_KEYS;
}

/** writerOf is the build whose config a daemon of build b starts with: b itself (own) or the other build of the pair (swapped). */
export function writerOf(mode: ConfigMode, b: Build, pair: readonly [Build, Build]): Build {
  if (mode === 'own') return b;
  return b.dir === pair[0].dir ? pair[1] : pair[0];
}

/**
 * writeNodeConfig writes daemon c's config as build `writer` writes it, into
 * `<root>/config/by-<writer label>/<c>.json` (and its slots beside it), and returns the path a
 * daemon is given (the format-1 name; a slot-aware reader takes the newest slot beside it).
 */
export function writeNodeConfig(root: string, c: Daemon, writer: Build, n: Build): string {
  const dir = path.join(root, 'config', `by-${writer.label.replace(/[^A-Za-z0-9.-]/g, '-')}`);
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const file = path.join(dir, `${c}.json`);
  const v1Keys = v1KeysOf(n, c);
  const w = slotWriter(writer);
  if (w) w.writeConfigSlots(file, { values: NODE_SETTINGS[c], v1Keys });
  else writeFileSync(file, `${JSON.stringify({ version: 1, ...Object.fromEntries(Object.entries(NODE_SETTINGS[c]).filter(([k]) => v1Keys.includes(k))) }, null, 2)}\n`, { mode: 0o600 });
  return file;
}

/** The node's settings file (node-stack upgrade.ts SERVER_SETTINGS_FILE) and its v2 slot. */
export function settingsSlots(runDir: string): { v1: string; v2: string } {
  return { v1: path.join(runDir, 'server-settings.json'), v2: path.join(runDir, 'server-settings.v2.json') };
}

/** environOf reads one variable of a live process's environment (/proc/<pid>/environ); undefined when unset. */
function environOf(pid: number, name: string): string | undefined {
  const env = readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0');
  const hit = env.find((e) => e.startsWith(`${name}=`));
  return hit === undefined ? undefined : hit.slice(name.length + 1);
}

/**
 * checkStandbyConfig says (for the step's detail) which config the server pid that `upgrade
 * server` started from build `to` runs with, and throws when it is not the node's settings file
 * although the active server had written it in both slots (hadSlots, looked at before the
 * upgrade): a slot-aware build must read the v2 slot, an older one (a rollback to 0.2.0) the v1
 * slot, which must hold only keys that build knows (N's V1_KEYS of the server).
 */
export function checkStandbyConfig(runDir: string, pid: number, to: Build, n: Build, hadSlots: boolean): string {
  const given = environOf(pid, 'SANDNODE_SERVER_CONFIG');
  const slots = settingsSlots(runDir);
  if (!hadSlots) return `config: ${given ?? 'none'} (the active server had written no settings slots)`;
  if (given !== slots.v1) throw new Error(`the new server (${to.label}, pid ${pid}) runs with config ${given ?? '(none)'}, not the node's settings file ${slots.v1}`);
  if (slotWriter(to)) {
    const v2 = JSON.parse(readFileSync(slots.v2, 'utf8')) as Record<string, unknown>;
    return `config: ${path.basename(slots.v2)} (format ${String(v2.version)}, ${Object.keys(v2).length - 1} keys) read by ${to.label}`;
  }
  const v1 = JSON.parse(readFileSync(slots.v1, 'utf8')) as Record<string, unknown>;
  const known = v1KeysOf(n, 'server');
  const foreign = Object.keys(v1).filter((k) => k !== 'version' && !known.includes(k));
  if (foreign.length) throw new Error(`the v1 slot ${slots.v1} read by ${to.label} holds keys it does not know: ${foreign.join(', ')}`);
  return `config: ${path.basename(slots.v1)} (v1 slot written by N, ${Object.keys(v1).length - 1} keys it knows) read by ${to.label}`;
}
