/**
 * `sandnode up` on a node that runs already keeps the running server as it is: a --listen (or
 * SANDNODE_LISTEN) or SANDNODE_SERVER_* setting that differs from what it runs with (its
 * settings file, `<runDir>/server-settings.json`) is not applied, and up says so on stderr.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { envKey, pickConfigSlot } from '@sandnode/shared';

/** The running server's settings file in the run dir (node-stack upgrade.ts SERVER_SETTINGS_FILE, not exported). */
const SERVER_SETTINGS_FILE = 'server-settings.json';
/** Server env vars that are not node settings (set per process by the stack, or test hooks). */
const NOT_SETTINGS = ['STATE_DIR', 'RUN_DIR', 'CONFIG', 'FAILPOINTS', 'SLOT', 'TAKEOVER', 'LISTEN'].map((k) => `SANDNODE_SERVER_${k}`);

/** One setting asked for that the running server does not have. */
export interface Drift {
  /** what was asked: "--listen" or the env var */
  what: string;
  asked: string;
  /** what the server runs with ("" when the file has no value: its default) */
  running: string;
}

const show = (v: string) => (v === '' ? '(none / default)' : v);

/**
 * settingsDrift compares what up was asked for (listen: --listen / SANDNODE_LISTEN when given,
 * undefined when left at its default; env: the caller's SANDNODE_SERVER_* variables) with the
 * running server's settings (the parsed settings file). Pure.
 */
export function settingsDrift(settings: Record<string, unknown>, listen: string | undefined, env: NodeJS.ProcessEnv): Drift[] {
  const text = (v: unknown) => (v === undefined || v === null ? '' : typeof v === 'string' ? v : JSON.stringify(v));
  const out: Drift[] = [];
  if (listen !== undefined && listen !== text(settings.listen)) out.push({ what: '--listen', asked: listen, running: text(settings.listen) });
  const byEnv = new Map(Object.keys(settings).map((k) => [envKey('server', k), k]));
  for (const [name, value] of Object.entries(env)) {
    if (!name.startsWith('SANDNODE_SERVER_') || NOT_SETTINGS.includes(name) || value === undefined) continue;
    const key = byEnv.get(name);
    const running = key === undefined ? '' : text(settings[key]);
    if (value !== running) out.push({ what: name, asked: value, running });
  }
  return out;
}

/** driftWarning: the stderr lines for drifts (empty string when none). */
export function driftWarning(drifts: Drift[]): string {
  if (drifts.length === 0) return '';
  return [
    'sandnode: warning: the server runs already and keeps its settings; not applied:',
    ...drifts.map((d) => `sandnode:   ${d.what}=${show(d.asked)} (the running server has ${show(d.running)})`),
    'sandnode: to apply them: sandnode down && sandnode up ... (sandboxes keep running and are adopted; sandnode upgrade server keeps the running settings)',
    '',
  ].join('\n');
}

/** runningDrift reads runDir's settings file and compares (see {@link settingsDrift}); no file or an unreadable one: no drift known (empty). */
export function runningDrift(runDir: string, listen: string | undefined, env: NodeJS.ProcessEnv): Drift[] {
  let settings: unknown;
  try {
    settings = JSON.parse(readFileSync(pickConfigSlot(path.join(runDir, SERVER_SETTINGS_FILE)), 'utf8')); // its newest slot: every key (docs/config.md)
  } catch {
    return [];
  }
  return typeof settings === 'object' && settings !== null ? settingsDrift(settings as Record<string, unknown>, listen, env) : [];
}
