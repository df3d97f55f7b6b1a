/**
 * The settings file: the config an active server runs with, written to
 * `<runDir>/server-settings.json` (a config file, `version: 1`, mode 0600, replaced atomically)
 * each time a server becomes active. `sandnode upgrade server` (node-stack upgrade.ts, which
 * names the same file) starts the standby with it as its `SANDNODE_SERVER_CONFIG`, so the
 * standby runs with the node's settings (its /metrics listener, timeouts ...), not with the
 * environment of whoever ran the CLI.
 */
import { renameSync, writeFileSync } from 'node:fs';
import path from 'node:path';

/** The file name in the run dir. */
export const SETTINGS_FILE = 'server-settings.json';

/** Keys that belong to one process, not to the node: never written. */
const PER_PROCESS_KEYS = ['slot', 'takeover'];

/** settingsFile is the path of the settings file of runDir. */
export function settingsFile(runDir: string): string {
  return path.join(runDir, SETTINGS_FILE);
}

/** writeSettingsFile writes settings (config keys as loaded, before derived defaults) to runDir's settings file. Throws the fs error. */
export function writeSettingsFile(runDir: string, settings: Record<string, unknown>): void {
  const out: Record<string, unknown> = { version: 1 };
  for (const [k, v] of Object.entries(settings)) if (!PER_PROCESS_KEYS.includes(k)) out[k] = v;
  const file = settingsFile(runDir);
  const tmp = `${file}.${process.pid}.tmp`;
  writeFileSync(tmp, `${JSON.stringify(out, null, 2)}\n`, { mode: 0o600 });
  renameSync(tmp, file);
}
