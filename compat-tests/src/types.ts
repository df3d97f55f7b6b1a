/**
 * The shared vocabulary of the compatibility matrix: builds, assignments of builds to
 * components, scenario and cell results, upgrade/rollback runs and report sections.
 *
 * This file is the contract between the process-mode runner (`matrix.ts`, `upgrade-run.ts`),
 * the container mode (`containers.ts`: `runContainerMode(ctx)`) and the wire tests
 * (`wire.ts`: `runWireCompat(ctx)`). Keep it stable: only add optional fields.
 */
import type { Build } from './releases';

export type { Build } from './releases';

/** The four components whose builds are assigned independently. */
export const COMPONENTS = ['server', 'vmm-supervisor', 'ublk-manager', 'podd'] as const;
/** One of the four sandnode components. */
export type Component = (typeof COMPONENTS)[number];

/**
 * Assignment maps every component to the label of the build it runs ("N", "0.1.0", ...).
 * In matrix.json the assignment is written with the build's *version* per component
 * (see `CellResult.assignment`); `labels` keeps the build labels.
 */
export type Assignment = Record<Component, string>;

/** Result of one scenario: `fallback` = the documented fallback was taken; `n/a` = not applicable (reason given). */
export type ScenarioOutcome = 'pass' | 'fallback' | 'fail' | 'n/a';

/** ScenarioResult is one scenario (create, exec, files, pause-resume, adoption, delete, status, fork, ...) in one cell or run. */
export interface ScenarioResult {
  /** scenario name, e.g. "exec" */
  name: string;
  result: ScenarioOutcome;
  /** wall time of the scenario in ms */
  ms: number;
  /** why n/a or fallback, or what failed */
  detail?: string;
  /** gRPC status name of the failing call (e.g. "UNAVAILABLE"), when the failure was a gRPC error */
  grpcStatus?: string;
  /** the component whose log is excerpted */
  component?: Component;
  /** last lines of the failing component's log */
  logExcerpt?: string;
}

/** CellResult is one combination of the matrix. */
export interface CellResult {
  /** component -> version of the build it ran (e.g. "0.1.0") */
  assignment: Record<Component, string>;
  /** component -> build label ("N" or a release version) */
  labels?: Record<Component, string>;
  /** pass when every scenario passed or was n/a; fallback when at least one took its fallback; else fail */
  result: 'pass' | 'fallback' | 'fail';
  scenarios: ScenarioResult[];
  ms?: number;
  /** daemon -> label of the build whose config file it started with (compat-tests node-config.ts); absent: none */
  configs?: Partial<Record<Exclude<Component, 'podd'>, string>>;
}

/** UpgradeStep is one step of an upgrade/rollback run (an upgrade of one component, a check, ...). */
export interface UpgradeStep {
  /** e.g. "upgrade ublk-manager", "check after upgrade", "rollback server" */
  name: string;
  result: 'pass' | 'fail' | 'n/a';
  /** wall time in ms */
  ms: number;
  /** when the step began, ms from the run's start (the Gantt in matrix.html); absent in reports written before it was kept */
  startMs?: number;
  /** component touched by the step, when it touches one */
  component?: Component;
  from?: string;
  to?: string;
  /** step-specific timings, e.g. { holdMs } for a server handover, { maxStallMs } for ublk */
  timings?: Record<string, number>;
  detail?: string;
  /** scenarios run as part of a check step */
  scenarios?: ScenarioResult[];
  logExcerpt?: string;
}

/** UpgradeRun is one upgrade-and-rollback run ("component" is "all" when every component moves). */
export interface UpgradeRun {
  component: Component | 'all';
  /** build label/version the run starts (and ends) at */
  from: string;
  /** build label/version it upgrades to */
  to: string;
  result: 'pass' | 'fail';
  steps: UpgradeStep[];
  ms?: number;
}

/** ReportSection is an extra part of the report contributed by another mode (containers, wire). */
export interface ReportSection {
  /** short title, e.g. "Container mode" */
  title: string;
  result: 'pass' | 'fail' | 'skipped';
  /** why skipped, or a one-line summary */
  summary?: string;
  /** cells run by this section, in the same shape as the process-mode cells */
  cells?: CellResult[];
  /** runs of this section */
  upgrades?: UpgradeRun[];
  /** free rows for a table: each row a record of column -> text */
  rows?: Array<Record<string, string>>;
  /** markdown body appended verbatim in matrix.md (and escaped into the HTML) */
  markdown?: string;
  ms?: number;
}

/** RunContext is what `runContainerMode(ctx)` and `runWireCompat(ctx)` receive. */
export interface RunContext {
  /** builds by label ("N", "0.1.0", ...) */
  builds: Record<string, Build>;
  /** the labels of N-1 and N (and N-2 with --skip), oldest first */
  order: string[];
  quick: boolean;
  /** a scratch directory the mode may use (removed by the caller at the end) */
  workDir: string;
  log: (line: string) => void;
}

/** Report is what main.ts writes: matrix.json has exactly {cells, upgrades, wallMs}; sections go to md/html. */
export interface Report {
  cells: CellResult[];
  upgrades: UpgradeRun[];
  wallMs: number;
}
