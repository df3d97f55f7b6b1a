/**
 * matrix.html's upgrade-run timeline (report.ts: upgradeGantt) in headless chromium, from a
 * real run's report (compat-tests/fixtures/upgrade-run.json: one upgrade and rollback run on
 * this machine, written by toJson): one Gantt per run with a bar per step in its component's
 * row, sized, with no NaN, no script error and nothing loaded from the network. A report
 * without step start times (written before startMs) still draws its steps, one after another.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { PARTS_BROWSER, describeWith, pageProblems, renderPage } from '@sandnode/testkit';
import { NODE_LANE, toHtml } from './report';
import { COMPONENTS, type Report, type UpgradeRun } from './types';

jest.setTimeout(120_000);

const fixture = JSON.parse(readFileSync(path.join(__dirname, '..', 'fixtures', 'upgrade-run.json'), 'utf8')) as Report;

describeWith('compat report upgrade-run timeline in headless chromium', [PARTS_BROWSER], () => {
  const run = fixture.upgrades[0] as UpgradeRun;

  it('draws one Gantt with a bar per step, in rows per component', async () => {
    expect(run.steps.length).toBeGreaterThan(5);
    expect(run.steps.every((s) => typeof s.startMs === 'number')).toBe(true);
    const page = await renderPage(toHtml(fixture));
    expect(pageProblems(page, 1)).toEqual([]);
    const gantts = page.plots.filter((p) => p.kind === 'gantt');
    expect(gantts).toHaveLength(1);
    expect(gantts[0]!.marks).toBe(run.steps.length);
    for (const lane of [...COMPONENTS.filter((c) => run.steps.some((s) => s.component === c)), NODE_LANE]) expect(page.text).toContain(lane);
  });

  it('draws a report without step start times (steps one after another)', async () => {
    const old: Report = { ...fixture, upgrades: [{ ...run, steps: run.steps.map(({ startMs: _s, ...s }) => s) }] };
    const page = await renderPage(toHtml(old));
    expect(pageProblems(page, 1)).toEqual([]);
    expect(page.plots[0]!.marks).toBe(run.steps.length);
  });
});
