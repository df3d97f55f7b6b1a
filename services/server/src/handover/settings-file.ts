/**
 * The settings file: the config an active server runs with, written to
 * `<runDir>/server-settings.json` each time a server becomes active, in both config slots
 * (writeConfigSlots, @sandnode/shared; docs/config.md): `server-settings.v2.json` (format 2,
 * every key) and `server-settings.json` (format 1, only the keys 0.1.0 and 0.2.0 know), mode
 * 0600, each replaced atomically. `sandnode upgrade server` (node-stack upgrade.ts, which names
 * the same file) starts the standby with `SANDNODE_SERVER_CONFIG=<runDir>/server-settings.json`:
 * a build of this line reads the v2 slot beside it, a rollback to 0.2.0 reads the v1 slot, so
 * the standby runs with the node's settings (its /metrics listener, timeouts ...), not with the
 * environment of whoever ran the CLI, and a new key never stops a rollback from starting.
 */
import path from 'node:path';
import { writeConfigSlots } from '@sandnode/shared';
import { V1_KEYS } from '../config';

/** The file name in the run dir (its format-1 slot; the format-2 slot is `server-settings.v2.json`). */
export const SETTINGS_FILE = 'server-settings.json';

/** Keys that belong to one process, not to the node: never written. */
const PER_PROCESS_KEYS = ['slot', 'takeover'];

/** settingsFile is the path of the settings file of runDir. */
export function settingsFile(runDir: string): string {
  return path.join(runDir, SETTINGS_FILE);
}

/**
 * writeSettingsFile writes settings (config keys as loaded, before derived defaults) to
 * runDir's settings file, both slots; returns the paths written. Throws the fs error.
 */
export function writeSettingsFile(runDir: string, settings: Record<string, unknown>): string[] {
  const values = Object.fromEntries(Object.entries(settings).filter(([k]) => !PER_PROCESS_KEYS.includes(k)));
  return writeConfigSlots(settingsFile(runDir), { values, v1Keys: V1_KEYS });
}
