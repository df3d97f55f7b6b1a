/**
 * The Grafana dashboard's preview (grafana-preview.ts) in headless chromium: every panel of
 * deploy/grafana/sandnode-node.json is laid out by the browser at its gridPos with a size, no
 * two panels' rendered boxes meet, each shows its title, and the page has no script error,
 * no request off the page and no NaN. (Grafana itself is not on this machine: the preview is
 * our own HTML of the panels' layout, titles and queries.)
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { PARTS_BROWSER, describeWith, pageProblems, renderPage } from '@sandnode/testkit';
import { dashboardPreviewHtml, type PreviewPanel } from './grafana-preview';

jest.setTimeout(120_000);

const dashboard = JSON.parse(readFileSync(path.join(__dirname, 'grafana', 'sandnode-node.json'), 'utf8')) as { title: string; uid: string; panels: PreviewPanel[] };

describeWith('Grafana dashboard preview in headless chromium', [PARTS_BROWSER], () => {
  it('lays out every panel with a size, none overlapping another, each with its title', async () => {
    const page = await renderPage(dashboardPreviewHtml(dashboard), { boxesOf: 'section.panel' });
    expect(pageProblems(page, 0)).toEqual([]);
    expect(page.boxes).toHaveLength(dashboard.panels.length);
    const overlaps: string[] = [];
    page.boxes.forEach((a, i) => {
      expect([a.text.slice(0, 40), a.width > 0 && a.height > 0]).toEqual([a.text.slice(0, 40), true]);
      expect(a.text).toContain(dashboard.panels[i]!.title);
      for (const b of page.boxes.slice(i + 1)) {
        if (a.x < b.x + b.width - 0.5 && b.x < a.x + a.width - 0.5 && a.y < b.y + b.height - 0.5 && b.y < a.y + a.height - 0.5) overlaps.push(`"${a.text.slice(0, 40)}" / "${b.text.slice(0, 40)}"`);
      }
    });
    expect(overlaps).toEqual([]);
  });
});
