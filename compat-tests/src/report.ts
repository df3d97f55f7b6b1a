/**
 * The report: `matrix.json` (exactly {cells, upgrades, wallMs}), `matrix.md` and a
 * self-contained `matrix.html` (inline CSS and SVG, no scripts, no network) with the grid of
 * combinations x scenarios, every upgrade/rollback run as a timeline (a Gantt of its steps,
 * one row per component) and a table of its steps with their timings, extra sections and the
 * wall time.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { gantt, type GanttBar } from '@sandnode/plot';
import { COMPONENTS, type CellResult, type Report, type ReportSection, type ScenarioResult, type UpgradeRun } from './types';

/** scenarioNames lists the scenario columns in first-seen order. */
function scenarioNames(cells: CellResult[]): string[] {
  const out: string[] = [];
  for (const c of cells) for (const s of c.scenarios) if (!out.includes(s.name)) out.push(s.name);
  return out;
}

/** toJson gives matrix.json's exact shape. */
export function toJson(r: Report): unknown {
  return {
    cells: r.cells.map((c) => ({ assignment: Object.fromEntries(COMPONENTS.map((k) => [k, c.assignment[k]])), result: c.result, scenarios: c.scenarios })),
    upgrades: r.upgrades.map((u) => ({ component: u.component, from: u.from, to: u.to, result: u.result, steps: u.steps })),
    wallMs: r.wallMs,
  };
}

const timingText = (t?: Record<string, number>) =>
  t
    ? Object.entries(t)
        .map(([k, v]) => `${k} ${Number.isInteger(v) ? v : v.toFixed(1)}`)
        .join(', ')
    : '';

/** toMarkdown renders the report for people. */
export function toMarkdown(r: Report, sections: ReportSection[] = [], meta: string[] = []): string {
  const names = scenarioNames(r.cells);
  const L: string[] = ['# sandnode compatibility matrix', '', ...meta.map((m) => `- ${m}`), `- wall time: ${(r.wallMs / 1000).toFixed(1)} s`, ''];
  L.push('## Matrix (process mode)', '');
  L.push(`| ${COMPONENTS.join(' | ')} | result | ${names.join(' | ')} | ms |`, `|${' --- |'.repeat(COMPONENTS.length + names.length + 2)}`);
  for (const c of r.cells) {
    const by = new Map(c.scenarios.map((s) => [s.name, s]));
    L.push(`| ${COMPONENTS.map((k) => c.assignment[k]).join(' | ')} | **${c.result}** | ${names.map((n) => by.get(n)?.result ?? '-').join(' | ')} | ${c.ms ?? ''} |`);
  }
  const notes = r.cells.flatMap((c) => c.scenarios.filter((s) => s.result !== 'pass').map((s) => ({ c, s })));
  if (notes.length) {
    L.push('', '### Not passed', '');
    for (const { c, s } of notes) L.push(...scenarioNote(COMPONENTS.map((k) => `${k}=${c.assignment[k]}`).join(' '), s));
  }
  for (const u of r.upgrades) L.push('', ...upgradeMarkdown(u));
  for (const s of sections) {
    L.push('', `## ${s.title}: ${s.result}${s.ms !== undefined ? ` (${s.ms} ms)` : ''}`, '');
    if (s.summary) L.push(s.summary, '');
    if (s.cells?.length) L.push(...s.cells.map((c) => `- ${COMPONENTS.map((k) => `${k}=${c.assignment[k]}`).join(' ')}: **${c.result}**`));
    for (const u of s.upgrades ?? []) L.push('', ...upgradeMarkdown(u));
    if (s.rows?.length) {
      const cols = [...new Set(s.rows.flatMap((x) => Object.keys(x)))];
      L.push('', `| ${cols.join(' | ')} |`, `|${' --- |'.repeat(cols.length)}`, ...s.rows.map((x) => `| ${cols.map((k) => (x[k] ?? '').replace(/\|/g, '\\|')).join(' | ')} |`));
    }
    if (s.markdown) L.push('', s.markdown);
  }
  return `${L.join('\n')}\n`;
}

function scenarioNote(where: string, s: ScenarioResult): string[] {
  const out = [`- ${where} / **${s.name}**: ${s.result}${s.grpcStatus ? ` (${s.grpcStatus})` : ''}: ${s.detail ?? ''}`];
  if (s.logExcerpt) out.push('', '  ```', ...s.logExcerpt.split('\n').map((l) => `  ${l.slice(0, 400)}`), '  ```');
  return out;
}

function upgradeMarkdown(u: UpgradeRun): string[] {
  const L = [`## Upgrade and rollback run ${u.from} -> ${u.to} -> ${u.from}: **${u.result}**${u.ms !== undefined ? ` (${(u.ms / 1000).toFixed(1)} s)` : ''}`, ''];
  L.push('| step | result | ms | timings | detail |', '| --- | --- | --- | --- | --- |');
  for (const s of u.steps) {
    const sc = s.scenarios ? ` [${s.scenarios.map((x) => `${x.name}: ${x.result}`).join(', ')}]` : '';
    L.push(`| ${s.name} | **${s.result}** | ${s.ms} | ${timingText(s.timings)} | ${(s.detail ?? '').replace(/\|/g, '\\|').replace(/\n/g, ' ').slice(0, 600)}${sc} |`);
  }
  for (const s of u.steps) {
    for (const x of s.scenarios ?? []) if (x.result === 'fail') L.push(...scenarioNote(s.name, x));
    if (s.result === 'fail' && s.logExcerpt) L.push('', `- ${s.name}:`, '', '  ```', ...s.logExcerpt.split('\n').map((l) => `  ${l.slice(0, 400)}`), '  ```');
  }
  return L;
}

/** The Gantt's row for the steps that touch no one component (start, checks, records). */
export const NODE_LANE = 'node (checks)';

/**
 * upgradeGantt draws the run's steps on a time axis, one row per component (steps without one
 * on NODE_LANE); a step without startMs (an older report) starts where the one before it ended.
 */
export function upgradeGantt(u: UpgradeRun): string {
  let at = 0;
  const bars: GanttBar[] = u.steps.map((s) => {
    const from = s.startMs ?? at;
    at = from + s.ms;
    return { lane: s.component ?? NODE_LANE, from: from / 1000, to: (from + s.ms) / 1000, label: s.name, status: s.result };
  });
  return gantt({ title: `upgrade and rollback run ${u.from} -> ${u.to} -> ${u.from}: steps per component`, xLabel: 's from the run start', lanes: [...COMPONENTS, NODE_LANE], bars });
}

const esc = (s: string) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');

/** toHtml renders a self-contained page (inline CSS and SVG, no scripts, no network). */
export function toHtml(r: Report, sections: ReportSection[] = [], meta: string[] = []): string {
  const names = scenarioNames(r.cells);
  const badge = (x: string, title = '') => `<td class="${esc(x.replace('/', ''))}" title="${esc(title)}">${esc(x)}</td>`;
  const H: string[] = [];
  H.push('<!doctype html><html><head><meta charset="utf-8"><title>sandnode compatibility matrix</title><style>');
  H.push('body{font:14px system-ui,sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 7px;vertical-align:top}');
  H.push(
    '.pass{background:#cfc}.fail{background:#fcc}.fallback{background:#ffc}.na{background:#eee;color:#666}.skipped{background:#eee}pre{background:#f6f6f6;padding:.5em;max-width:100em;overflow:auto;font-size:12px}',
  );
  H.push('</style></head><body><h1>sandnode compatibility matrix</h1><ul>');
  for (const m of [...meta, `wall time: ${(r.wallMs / 1000).toFixed(1)} s`]) H.push(`<li>${esc(m)}</li>`);
  H.push('</ul><h2>Matrix (process mode)</h2><table><tr>');
  for (const h of [...COMPONENTS, 'result', ...names, 'ms']) H.push(`<th>${esc(h)}</th>`);
  H.push('</tr>');
  for (const c of r.cells) {
    const by = new Map(c.scenarios.map((s) => [s.name, s]));
    H.push(`<tr>${COMPONENTS.map((k) => `<td>${esc(c.assignment[k])}</td>`).join('')}${badge(c.result)}`);
    for (const n of names) {
      const s = by.get(n);
      H.push(s ? badge(s.result, `${s.grpcStatus ? `${s.grpcStatus}: ` : ''}${s.detail ?? ''}`) : '<td>-</td>');
    }
    H.push(`<td>${c.ms ?? ''}</td></tr>`);
  }
  H.push('</table>');
  const notes = r.cells.flatMap((c) => c.scenarios.filter((s) => s.result === 'fail' || s.result === 'n/a' || s.result === 'fallback').map((s) => ({ c, s })));
  if (notes.length) {
    H.push('<h3>Not passed</h3><ul>');
    for (const { c, s } of notes) {
      H.push(
        `<li>${esc(COMPONENTS.map((k) => `${k}=${c.assignment[k]}`).join(' '))} / <b>${esc(s.name)}</b>: ${esc(s.result)}${s.grpcStatus ? ` (${esc(s.grpcStatus)})` : ''}: ${esc(s.detail ?? '')}`,
      );
      if (s.logExcerpt) H.push(`<pre>${esc(s.logExcerpt)}</pre>`);
      H.push('</li>');
    }
    H.push('</ul>');
  }
  const upgradeHtml = (u: UpgradeRun) => {
    H.push(
      `<h2>Upgrade and rollback run ${esc(u.from)} &rarr; ${esc(u.to)} &rarr; ${esc(u.from)}: <span class="${u.result}">${u.result}</span>${u.ms !== undefined ? ` (${(u.ms / 1000).toFixed(1)} s)` : ''}</h2>`,
    );
    H.push(`<figure>${upgradeGantt(u)}<figcaption>green: passed, red: failed, grey: n/a; hover a step for its name and duration</figcaption></figure>`);
    H.push('<table><tr><th>step</th><th>result</th><th>ms</th><th>timings</th><th>detail</th></tr>');
    for (const s of u.steps) {
      H.push(`<tr><td>${esc(s.name)}</td>${badge(s.result)}<td>${s.ms}</td><td>${esc(timingText(s.timings))}</td><td>${esc(s.detail ?? '')}`);
      if (s.scenarios) H.push(`<br>${s.scenarios.map((x) => `<span class="${esc(x.result.replace('/', ''))}" title="${esc(x.detail ?? '')}">${esc(x.name)}: ${esc(x.result)}</span>`).join(' ')}`);
      for (const x of s.scenarios ?? []) if (x.result === 'fail' && x.logExcerpt) H.push(`<pre>${esc(`${x.name}: ${x.detail ?? ''}\n${x.logExcerpt}`)}</pre>`);
      if (s.result === 'fail' && s.logExcerpt) H.push(`<pre>${esc(s.logExcerpt)}</pre>`);
      H.push('</td></tr>');
    }
    H.push('</table>');
  };
  r.upgrades.forEach(upgradeHtml);
  for (const s of sections) {
    H.push(`<h2>${esc(s.title)}: <span class="${esc(s.result)}">${esc(s.result)}</span></h2>`);
    if (s.summary) H.push(`<p>${esc(s.summary)}</p>`);
    for (const c of s.cells ?? []) H.push(`<div>${esc(COMPONENTS.map((k) => `${k}=${c.assignment[k]}`).join(' '))}: <span class="${c.result}">${c.result}</span></div>`);
    (s.upgrades ?? []).forEach(upgradeHtml);
    if (s.rows?.length) {
      const cols = [...new Set(s.rows.flatMap((x) => Object.keys(x)))];
      H.push(`<table><tr>${cols.map((c) => `<th>${esc(c)}</th>`).join('')}</tr>${s.rows.map((x) => `<tr>${cols.map((k) => `<td>${esc(x[k] ?? '')}</td>`).join('')}</tr>`).join('')}</table>`);
    }
    if (s.markdown) H.push(`<pre>${esc(s.markdown)}</pre>`);
  }
  H.push('</body></html>');
  return `${H.join('\n')}\n`;
}

/** writeReport writes matrix.{json,md,html} into dir (and sections.json when there are sections); returns the paths. */
export function writeReport(dir: string, r: Report, sections: ReportSection[] = [], meta: string[] = []): string[] {
  mkdirSync(dir, { recursive: true });
  const files = [path.join(dir, 'matrix.json'), path.join(dir, 'matrix.md'), path.join(dir, 'matrix.html')];
  writeFileSync(files[0]!, `${JSON.stringify(toJson(r), null, 2)}\n`);
  writeFileSync(files[1]!, toMarkdown(r, sections, meta));
  writeFileSync(files[2]!, toHtml(r, sections, meta));
  if (sections.length) {
    files.push(path.join(dir, 'sections.json'));
    writeFileSync(files[3]!, `${JSON.stringify(sections, null, 2)}\n`);
  }
  return files;
}
