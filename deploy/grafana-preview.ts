/**
 * A preview of deploy/grafana/sandnode-node.json without Grafana: one self-contained HTML page
 * (inline CSS, no scripts, no network) that lays the panels out on Grafana's grid (24 columns,
 * gridPos x/y/w/h in grid units, one unit 30 px high) with each panel's title, type and queries.
 * No data: it shows where each panel sits and what it asks Prometheus, which is what the
 * dashboard JSON decides. grafana-preview.it.test.ts renders it in headless chromium.
 */

/** The parts of a dashboard panel the preview draws. */
export interface PreviewPanel {
  id: number;
  type: string;
  title: string;
  gridPos: { h: number; w: number; x: number; y: number };
  targets?: { expr: string; legendFormat?: string }[];
  fieldConfig?: { defaults?: { unit?: string } };
}

const esc = (s: string) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');

/** ROW_PX: the height of one grid unit, px (Grafana's). */
export const ROW_PX = 30;

/**
 * dashboardPreviewHtml renders the dashboard's panels at their gridPos: each panel a
 * `<section class="panel" data-id=N>` (rows `class="panel row"`) holding its title, type, unit
 * and queries.
 */
export function dashboardPreviewHtml(d: { title: string; uid: string; panels: PreviewPanel[] }): string {
  const H: string[] = [
    `<!doctype html><html><head><meta charset="utf-8"><title>${esc(`${d.title} (preview)`)}</title><style>`,
    'body{font:13px system-ui,sans-serif;margin:1em;background:#111217;color:#ccccdc}',
    `.grid{display:grid;grid-template-columns:repeat(24,1fr);grid-auto-rows:${ROW_PX - 4}px;gap:4px;min-width:1200px}`,
    '.panel{background:#181b1f;border:1px solid #2c3235;border-radius:2px;padding:4px 8px;overflow:hidden}',
    '.panel.row{background:none;border:none;border-bottom:1px solid #2c3235;font-weight:bold;font-size:15px;padding:2px 0}',
    '.panel h2{font-size:13px;margin:0 0 4px 0;color:#fff}.panel .type{float:right;color:#8e8e8e;font-size:11px}',
    '.panel code{display:block;font-size:11px;color:#6ea6ff;white-space:pre-wrap;word-break:break-all;margin:2px 0}',
    '</style></head><body>',
    `<h1>${esc(d.title)} <small>(${esc(d.uid)}: layout and queries of ${d.panels.length} panels, no data)</small></h1><div class="grid">`,
  ];
  for (const p of d.panels) {
    const g = p.gridPos;
    const style = `grid-column:${g.x + 1} / span ${g.w};grid-row:${g.y + 1} / span ${g.h}`;
    if (p.type === 'row') {
      H.push(`<section class="panel row" data-id="${p.id}" style="${style}">${esc(p.title)}</section>`);
      continue;
    }
    const unit = p.fieldConfig?.defaults?.unit;
    H.push(`<section class="panel" data-id="${p.id}" style="${style}"><span class="type">${esc(p.type)}${unit ? ` · ${esc(unit)}` : ''}</span><h2>${esc(p.title)}</h2>`);
    for (const t of p.targets ?? []) H.push(`<code>${esc(t.expr)}${t.legendFormat ? `  [${esc(t.legendFormat)}]` : ''}</code>`);
    H.push('</section>');
  }
  H.push('</div></body></html>');
  return `${H.join('\n')}\n`;
}
