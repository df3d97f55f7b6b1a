/**
 * `sandnode version [--json]`: the CLI's own version, commit and Node version, and those of
 * each component that answers GetVersion at its socket in the runtime dir.
 *
 *   --json: { "cli": VersionEntry, "components": VersionEntry[] } (every component, in start
 *   order; one that does not answer has up: false and null fields)
 */
import type { Command } from 'commander';
import { COMPONENTS, getVersion, table } from '@sandnode/node-stack';
import { SUITE_VERSION, buildCommit, runtimeName } from '@sandnode/shared';
import type { GetVersionResponse } from '@sandnode/shared/proto/common/v1/version';
import { dirsOf } from '../options';
import { action, print } from '../output';

/** One line of `sandnode version`. */
export interface VersionEntry {
  /** "cli", "vmm-supervisor", "ublk-manager" or "server" */
  component: string;
  /** whether it answered (the CLI always has) */
  up: boolean;
  /** its semver; null when it did not answer */
  version: string | null;
  /** the git commit it was built from ("unknown" outside a checkout); null when it did not answer */
  commit: string | null;
  /** the runtime it runs on, "node 24.1.0"; "unknown" for a build that does not say; null when it did not answer */
  runtime: string | null;
  /** its host pid; null when it did not answer */
  pid: number | null;
  /** the node's stable id it reports (GetVersion node_id); null for the CLI, a build that does not say, or one that did not answer */
  nodeId: string | null;
}

/** What `sandnode version --json` prints. */
export interface VersionReport {
  cli: VersionEntry;
  components: VersionEntry[];
}

/** Characters of a commit the table shows. */
const SHORT_COMMIT = 12;

/** runtimeOf reads GetVersionResponse.runtime ("node 24.x.y"), which older builds do not send. */
export function runtimeOf(v: GetVersionResponse): string {
  return v.runtime || 'unknown';
}

/** cliVersion is the CLI's own entry. */
export function cliVersion(): VersionEntry {
  return { component: 'cli', up: true, version: SUITE_VERSION, commit: buildCommit(), runtime: runtimeName(), pid: process.pid, nodeId: null };
}

/** componentVersion is a component's entry from its GetVersion answer (undefined: it did not answer). */
export function componentVersion(component: string, v: GetVersionResponse | undefined): VersionEntry {
  if (!v) return { component, up: false, version: null, commit: null, runtime: null, pid: null, nodeId: null };
  return { component, up: true, version: v.version, commit: v.commit, runtime: runtimeOf(v), pid: v.pid, nodeId: v.nodeId || null };
}

/** versionTable renders a report for people: one row per entry, the CLI first. */
export function versionTable(r: VersionReport): string {
  return table(
    ['COMPONENT', 'VERSION', 'COMMIT', 'RUNTIME', 'NODE'],
    [r.cli, ...r.components].map((e) => (e.up ? [e.component, e.version ?? '-', (e.commit ?? '-').slice(0, SHORT_COMMIT), e.runtime ?? '-', e.nodeId ?? '-'] : [e.component, 'down', '-', '-', '-'])),
  );
}

/** registerVersionCommand adds version to program. */
export function registerVersionCommand(program: Command): void {
  program
    .command('version')
    .description("print the CLI's and each running component's version, commit and Node version")
    .option('--json', 'print JSON')
    .action(
      action(async (o: { json?: boolean }, cmd: Command) => {
        const d = dirsOf(cmd);
        const answers = await Promise.all(COMPONENTS.map((c) => getVersion(d, c)));
        const report: VersionReport = { cli: cliVersion(), components: COMPONENTS.map((c, i) => componentVersion(c, answers[i])) };
        print(!!o.json, report, () => versionTable(report));
      }),
    );
}
