/**
 * deploy/grafana/sandnode-node.json: valid dashboard JSON whose every query names only metrics
 * the code registers (with their real label names), and that shows every sandnode_* and grpc_*
 * metric the components register. The components' metric modules are loaded through their
 * packages, so a metric renamed in code and not in the dashboard (or the other way round) fails here.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { registry } from '@sandnode/shared';
import '@sandnode/server';
import '@sandnode/ublk-manager';
import '@sandnode/vmm-supervisor';

interface Target {
  expr: string;
  refId: string;
}
interface Panel {
  id: number;
  type: string;
  title: string;
  gridPos: { h: number; w: number; x: number; y: number };
  targets?: Target[];
}

const dashboard = JSON.parse(readFileSync(path.join(__dirname, 'grafana', 'sandnode-node.json'), 'utf8')) as { uid: string; title: string; panels: Panel[]; templating: { list: { name: string }[] } };
const PROMQL_WORDS = new Set(['sum', 'by', 'rate', 'increase', 'histogram_quantile', 'le', 'without', 'on', 'max', 'min', 'avg', 'count', 'instance', 'label_values']);
const SUFFIXES = ['_bucket', '_count', '_sum'];

/** registered: metric name -> label names, of the process registry after loading every component's metrics. */
async function registered(): Promise<Map<string, string[]>> {
  const out = new Map<string, string[]>();
  for (const m of await registry.getMetricsAsJSON()) {
    const labels = new Set<string>();
    const metric = registry.getSingleMetric(m.name) as unknown as { labelNames?: string[] };
    for (const l of metric?.labelNames ?? []) labels.add(l);
    for (const v of m.values) for (const l of Object.keys(v.labels)) labels.add(l);
    out.set(m.name, [...labels]);
  }
  return out;
}

/** metricsOf: the metric names an expr selects (identifiers outside {} and (...) label lists, histogram suffixes kept). */
function metricsOf(expr: string): string[] {
  const bare = expr
    .replace(/\{[^}]*\}/g, '')
    .replace(/\b(by|without|on)\s*\([^)]*\)/g, '')
    .replace(/\[[^\]]*\]/g, '')
    .replace(/"[^"]*"/g, '');
  return [...bare.matchAll(/[a-zA-Z_:][a-zA-Z0-9_:]*/g)].map((m) => m[0]).filter((w) => !PROMQL_WORDS.has(w) && !/^\d/.test(w));
}

function baseName(name: string, known: Map<string, string[]>): string {
  if (known.has(name)) return name;
  const s = SUFFIXES.find((x) => name.endsWith(x));
  return s ? name.slice(0, -s.length) : name;
}

describe('Grafana dashboard deploy/grafana/sandnode-node.json', () => {
  const panels = dashboard.panels.filter((p) => p.type !== 'row');

  it('is a dashboard: uid, title, unique panel ids, panels with a query each, a datasource variable', () => {
    expect(dashboard.uid).toBe('sandnode-node');
    expect(dashboard.title).toBeTruthy();
    const ids = dashboard.panels.map((p) => p.id);
    expect(new Set(ids).size).toBe(ids.length);
    expect(panels.length).toBeGreaterThan(10);
    for (const p of panels) {
      expect([p.title, (p.targets ?? []).length > 0]).toEqual([p.title, true]);
      expect(p.gridPos.x + p.gridPos.w).toBeLessThanOrEqual(24);
    }
    expect(dashboard.templating.list.map((v) => v.name)).toEqual(expect.arrayContaining(['datasource', 'instance']));
  });

  it('lays its panels out without overlap (gridPos cells of two panels, rows included, never meet)', () => {
    const taken = new Map<string, string>();
    const overlaps: string[] = [];
    for (const p of dashboard.panels) {
      const { x, y, w, h } = p.gridPos;
      const hit = new Set<string>();
      for (let i = x; i < x + w; i++)
        for (let j = y; j < y + h; j++) {
          const other = taken.get(`${i},${j}`);
          if (other) hit.add(other);
          taken.set(`${i},${j}`, `${p.id} "${p.title}"`);
        }
      for (const o of hit) overlaps.push(`${p.id} "${p.title}" overlaps ${o}`);
    }
    expect(overlaps).toEqual([]);
  });

  it('queries only metrics the code registers, grouping by labels they have', async () => {
    const known = await registered();
    const problems: string[] = [];
    for (const p of panels) {
      for (const t of p.targets ?? []) {
        const names = metricsOf(t.expr).map((n) => baseName(n, known));
        if (names.length === 0) problems.push(`${p.title}: ${t.expr} names no metric`);
        for (const n of names) if (!known.has(n)) problems.push(`${p.title}: ${n} is not registered`);
        const labels = new Set(names.flatMap((n) => known.get(n) ?? []));
        for (const m of t.expr.matchAll(/\bby\s*\(([^)]*)\)/g)) {
          for (const l of m[1]!
            .split(',')
            .map((x) => x.trim())
            .filter((x) => x && x !== 'le'))
            if (!labels.has(l)) problems.push(`${p.title}: by (${l}): no such label on ${names.join(', ')}`);
        }
      }
    }
    expect(problems).toEqual([]);
  });

  it('shows every sandnode_* and grpc_* metric the components register', async () => {
    const known = await registered();
    const shown = new Set(panels.flatMap((p) => (p.targets ?? []).flatMap((t) => metricsOf(t.expr).map((n) => baseName(n, known)))));
    const ours = [...known.keys()].filter((n) => /^(sandnode|grpc)_/.test(n));
    expect(ours.length).toBeGreaterThan(15);
    expect(ours.filter((n) => !shown.has(n))).toEqual([]);
  });
});
