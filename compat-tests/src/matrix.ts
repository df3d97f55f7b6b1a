/**
 * The N/N-1 matrix: every assignment of two builds to the four components, each run as real
 * processes on a fresh temp node through the scenario suite.
 */
import { TempNode } from './node';
import type { ConfigMode } from './node-config';
import { cellOutcome, runSuite } from './scenarios';
import { COMPONENTS, type Assignment, type Build, type CellResult, type Component } from './types';

/**
 * assignments lists every assignment of {older, newer} to the four components (16), or with
 * quick the four that matter most: all older, all newer, server newer with the rest older,
 * server older with the rest newer.
 */
export function assignments(older: string, newer: string, quick = false): Assignment[] {
  const mk = (f: (c: Component) => string): Assignment => Object.fromEntries(COMPONENTS.map((c) => [c, f(c)])) as Assignment;
  if (quick) {
    return [mk(() => older), mk(() => newer), mk((c) => (c === 'server' ? newer : older)), mk((c) => (c === 'server' ? older : newer))];
  }
  const out: Assignment[] = [];
  for (let bits = 0; bits < 16; bits++) out.push(mk((c) => ((bits >> COMPONENTS.indexOf(c)) & 1 ? newer : older)));
  return out;
}

/** describeAssignment gives "server=N vmm-supervisor=0.1.0 ..." */
export function describeAssignment(a: Assignment): string {
  return COMPONENTS.map((c) => `${c}=${a[c]}`).join(' ');
}

/**
 * runCell starts a node with the assigned builds (template `podd-<label>` built with the podd
 * build's template builder), runs the scenario suite, and removes the node. Never throws: a
 * start failure is a failed `start` scenario. configs: each daemon starts with a config file
 * of its own build or of the other build of the pair (node-config.ts; cell.configs says whose).
 */
export async function runCell(
  a: Assignment,
  builds: Record<string, Build>,
  n: Build,
  log: (l: string) => void = () => undefined,
  configs?: { mode: ConfigMode; pair: readonly [Build, Build] },
): Promise<CellResult> {
  const t0 = Date.now();
  const b = (c: Component): Build => {
    const x = builds[a[c]];
    if (!x) throw new Error(`no build labelled ${a[c]}`);
    return x;
  };
  const node = new TempNode(n, undefined, configs);
  const cell: CellResult = { assignment: { ...a }, labels: { ...a }, result: 'fail', scenarios: [] };
  try {
    const start = Date.now();
    let stage: Component = 'podd';
    try {
      const tname = `podd-${b('podd')
        .label.toLowerCase()
        .replace(/[^a-z0-9]/g, '-')}`;
      await node.buildTemplate(tname, b('podd'));
      for (const c of ['vmm-supervisor', 'ublk-manager', 'server'] as const) {
        stage = c;
        await node.start(c, b(c));
      }
      cell.scenarios = await runSuite({
        node,
        daemons: { server: b('server'), 'vmm-supervisor': b('vmm-supervisor'), 'ublk-manager': b('ublk-manager') },
        templates: [{ name: tname, podd: b('podd') }],
      });
    } catch (err) {
      cell.scenarios.push({ name: 'start', result: 'fail', ms: Date.now() - start, detail: (err as Error).message, component: stage, logExcerpt: node.logTail(stage) });
    }
    cell.result = cellOutcome(cell.scenarios);
    if (configs) cell.configs = { ...node.configOf };
  } finally {
    const notes = await node.down();
    if (notes) log(`cleanup: ${notes}`);
  }
  cell.ms = Date.now() - t0;
  log(
    `cell ${describeAssignment(a)}${
      cell.configs
        ? ` configs ${Object.entries(cell.configs)
            .map(([c, w]) => `${c}<-${w}`)
            .join(' ')}`
        : ''
    }: ${cell.result} (${cell.ms} ms)${
      cell.result === 'fail'
        ? ` ${cell.scenarios
            .filter((s) => s.result === 'fail')
            .map((s) => `${s.name}: ${s.grpcStatus ?? ''} ${s.detail}`)
            .join('; ')}`
        : ''
    }`,
  );
  return cell;
}
