/**
 * The bench's HTML report (report.ts) rendered in headless chromium from a real results file
 * (bench/results/foundation-create+exec+getsandbox+fork+device+live-upgrade.json, a short run of
 * those sections): every plot is there, has a size and draws the raw samples of the JSON, the
 * page shows no NaN, runs no failing script and loads nothing from the network. A results file
 * written before the samples were kept renders too, saying so instead of plotting.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { PARTS_BROWSER, describeWith, pageProblems, renderPage, type RenderedPage } from '@sandnode/testkit';
import { benchReportHtml } from './report';

jest.setTimeout(180_000);

const RESULTS = path.resolve(__dirname, '..', '..', '..', 'bench', 'results');
const FIXTURE = 'foundation-create+exec+getsandbox+fork+device+live-upgrade.json';
type Obj = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any
const load = (f: string) => JSON.parse(readFileSync(path.join(RESULTS, f), 'utf8')) as Obj;

describeWith('bench HTML report in headless chromium', [PARTS_BROWSER], () => {
  const r = load(FIXTURE);
  let page: RenderedPage;
  beforeAll(async () => {
    page = await renderPage(benchReportHtml(r, FIXTURE));
  });

  it('is a sound page: plots with a size and marks, no NaN, no script error, no request', () => {
    expect(pageProblems(page, 11)).toEqual([]);
  });

  it('has the plots of issue 15 §2: latency histograms, handover timeline beside the naive restart, stalls per device, freeze windows vs the goal', () => {
    const byTitle = (re: RegExp) => page.plots.filter((p) => re.test(p.title));
    expect(byTitle(/^sandbox create$/).map((p) => p.kind)).toEqual(['histogram']);
    expect(byTitle(/^exec round trip/).map((p) => p.kind)).toEqual(['histogram']);
    expect(byTitle(/^server handover x\d+/).map((p) => p.kind)).toEqual(['lanes']);
    expect(byTitle(/^naive restart x\d+ \(baseline\)/).map((p) => p.kind)).toEqual(['lanes']);
    expect(byTitle(/^stall per device/).map((p) => p.kind)).toEqual(['bars']);
    expect(byTitle(/freeze window per fork/).map((p) => p.kind)).toEqual(['bars']);
    expect(page.text).toMatch(/goal: p99 <= 50 ms/);
    expect(page.text).toMatch(/goal: p99 <= 20 ms/);
  });

  it('draws the raw samples of the JSON: one bar per fork and per device, one lane per switch', () => {
    const plot = (re: RegExp) => page.plots.find((p) => re.test(p.title))!;
    expect(plot(/freeze window per fork/).marks).toBe(r.fork.freezeWindowSamplesMs.length);
    const devices = (r.deviceHandover.rounds as Obj[]).reduce((a, x) => a + x.deviceStallsMs.length, 0);
    expect(devices).toBeGreaterThan(0);
    expect(plot(/^stall per device/).marks).toBe(devices);
    const t = r.liveUpgrade.serverHandover.timeline;
    // per lane: the switch band, the gap band and one path of ticks (the calls inside the window)
    for (const [re, ws] of [
      [/^server handover x/, t.handovers],
      [/^naive restart/, t.naiveRestarts],
    ] as [RegExp, Obj[]][]) {
      expect(ws.length).toBeGreaterThan(0);
      expect(plot(re).marks).toBeGreaterThanOrEqual(2 * ws.length);
      expect(plot(re).marks).toBeLessThanOrEqual(3 * ws.length);
    }
    expect(page.text).toContain(`n=${r.exec.samplesMs.length}`);
  });

  it('renders a results file without raw samples as notes, not as a broken page', async () => {
    const old = await renderPage(benchReportHtml(load('foundation.json'), 'foundation.json'));
    expect(pageProblems(old, 0)).toEqual([]);
    expect(old.text).toMatch(/no raw samples in this results file/);
  });
});
