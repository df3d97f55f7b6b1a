/**
 * `sandnode version`: what the CLI and each daemon of the node are (version, commit, runtime).
 * Pure shaping and formatting; main.ts asks the daemons.
 */
import type { GetVersionResponse } from '@sandnode/shared/proto/common/v1/version';
import { table } from './api';

/** What `runtime` reads for a component that answers but predates GetVersion's runtime field (0.2.0 and older). */
export const UNKNOWN_RUNTIME = 'unknown';

/** VersionRow is one line of `sandnode version --json` ("cli" or a daemon). */
export interface VersionRow {
  name: string;
  /** false: the daemon does not answer GetVersion (version, commit, runtime and pid are null) */
  up: boolean;
  version: string | null;
  commit: string | null;
  /** e.g. "node 24.22.3"; UNKNOWN_RUNTIME when the component predates the field */
  runtime: string | null;
  pid: number | null;
}

/** versionRow turns a daemon's GetVersion answer (undefined: no answer) into its row. */
export function versionRow(name: string, v: GetVersionResponse | undefined): VersionRow {
  if (!v) return { name, up: false, version: null, commit: null, runtime: null, pid: null };
  return { name, up: true, version: v.version, commit: v.commit, runtime: v.runtime || UNKNOWN_RUNTIME, pid: v.pid };
}

/** versionTable is the human form: one line per row, "-" for what a down daemon cannot say. */
export function versionTable(rows: VersionRow[]): string {
  return table(
    ['COMPONENT', 'STATUS', 'VERSION', 'COMMIT', 'RUNTIME', 'PID'],
    rows.map((r) => [r.name, r.name === 'cli' || r.up ? 'up' : 'down', r.version ?? '-', r.commit ? r.commit.slice(0, 12) : '-', r.runtime ?? '-', r.pid ?? '-']),
  );
}
