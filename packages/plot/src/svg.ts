/**
 * Small SVG plots for the reports people look at (the bench's HTML report, the compat report's
 * upgrade timeline): histograms, bars against a goal line, lanes of points and spans (the
 * handover timeline), a Gantt of steps. Each function returns one self-contained `<svg>`
 * string (no scripts, no fonts or styles from the network), sized in px, with
 * `class="plot"` and `data-plot=<kind>` so a test can find every plot on a page; the marks that
 * draw data (bars, bands, ticks, steps) have `class="mark"`, axes and legends do not.
 *
 * Numbers that are not finite (NaN, Infinity) are never drawn nor printed: they are dropped
 * from the data and counted in the plot's caption ("2 not finite"), so a page never shows NaN.
 */

/** Colours of the series, in order (the first is the figure, the second its baseline). */
export const PALETTE = ['#1f6fb4', '#e8731a', '#2a9d3a', '#c6282b', '#8354b8', '#7a5a48'] as const;
const GOAL_COLOUR = '#c6282b';
const AXIS = '#555';
const GRID = '#e4e4e4';

/** esc escapes text for HTML/SVG text and attribute values. */
export function esc(s: string): string {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
}

/** fmt prints a finite number with at most 3 significant decimals ("-" for anything else). */
export function fmt(x: number): string {
  if (!Number.isFinite(x)) return '-';
  const a = Math.abs(x);
  const d = a >= 100 ? 0 : a >= 10 ? 1 : a >= 1 ? 2 : 3;
  return String(Number(x.toFixed(d)));
}

/** finite splits xs into the finite values and the count of the others. */
export function finite(xs: readonly number[]): { values: number[]; dropped: number } {
  const values = xs.filter((x) => Number.isFinite(x));
  return { values, dropped: xs.length - values.length };
}

/** quantile of xs (sorted copy, nearest rank), p in [0, 100]; NaN for no values. */
export function quantile(xs: readonly number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  if (!s.length) return NaN;
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))] as number;
}

/** niceTicks gives about `count` round tick values covering [min, max] (min < max). */
export function niceTicks(min: number, max: number, count = 5): number[] {
  const span = max - min;
  const raw = span / Math.max(1, count);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => span / s <= count) ?? 10 * mag;
  const out: number[] = [];
  for (let t = Math.ceil(min / step) * step; t <= max + step * 1e-9; t += step) out.push(Number(t.toPrecision(12)));
  return out;
}

/** A linear map of [d0, d1] onto [r0, r1] (a zero-width domain is widened by 1 around it). */
function scale(d0: number, d1: number, r0: number, r1: number): (x: number) => number {
  const [a, b] = d0 === d1 ? [d0 - 0.5, d1 + 0.5] : [d0, d1];
  return (x) => r0 + ((x - a) / (b - a)) * (r1 - r0);
}

interface Box {
  width: number;
  height: number;
  left: number;
  right: number;
  top: number;
  bottom: number;
}

function open(kind: string, title: string, box: Box): string[] {
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" class="plot" data-plot="${esc(kind)}" width="${box.width}" height="${box.height}" viewBox="0 0 ${box.width} ${box.height}" font-family="sans-serif" font-size="11">`,
    `<title>${esc(title)}</title>`,
    `<text x="${box.left}" y="14" font-size="13" font-weight="bold">${esc(title)}</text>`,
  ];
}

/** axisX draws the x axis with ticks of [d0, d1] and its label. */
function axisX(L: string[], box: Box, d0: number, d1: number, x: (v: number) => number, label: string): void {
  const y = box.height - box.bottom;
  L.push(`<line x1="${box.left}" y1="${y}" x2="${box.width - box.right}" y2="${y}" stroke="${AXIS}"/>`);
  for (const t of niceTicks(d0, d1, 6)) {
    const px = x(t).toFixed(1);
    L.push(`<line x1="${px}" y1="${y}" x2="${px}" y2="${y + 4}" stroke="${AXIS}"/><text x="${px}" y="${y + 15}" text-anchor="middle">${fmt(t)}</text>`);
  }
  L.push(`<text x="${(box.left + box.width - box.right) / 2}" y="${box.height - 4}" text-anchor="middle">${esc(label)}</text>`);
}

/** axisY draws the y axis with ticks and grid lines of [d0, d1] and its label. */
function axisY(L: string[], box: Box, d0: number, d1: number, y: (v: number) => number, label: string): void {
  L.push(`<line x1="${box.left}" y1="${box.top}" x2="${box.left}" y2="${box.height - box.bottom}" stroke="${AXIS}"/>`);
  for (const t of niceTicks(d0, d1, 5)) {
    const py = y(t).toFixed(1);
    L.push(`<line x1="${box.left}" y1="${py}" x2="${box.width - box.right}" y2="${py}" stroke="${GRID}"/>`);
    L.push(`<text x="${box.left - 4}" y="${py}" dy="3.5" text-anchor="end">${fmt(t)}</text>`);
  }
  L.push(`<text transform="translate(11 ${(box.top + box.height - box.bottom) / 2}) rotate(-90)" text-anchor="middle">${esc(label)}</text>`);
}

/** legend writes one line per entry (colour swatch + text) at the top right. */
function legend(L: string[], box: Box, entries: { colour: string; text: string; dashed?: boolean }[]): void {
  entries.forEach((e, i) => {
    const y = box.top + 4 + i * 14;
    const x = box.width - box.right - 8;
    const mark = e.dashed
      ? `<line x1="${x - 14}" y1="${y - 4}" x2="${x}" y2="${y - 4}" stroke="${e.colour}" stroke-width="2" stroke-dasharray="4 2"/>`
      : `<rect x="${x - 12}" y="${y - 9}" width="10" height="10" fill="${e.colour}" fill-opacity="0.7"/>`;
    L.push(`${mark}<text x="${x - 18}" y="${y}" text-anchor="end">${esc(e.text)}</text>`);
  });
}

/** A named set of samples (one unit for all series of a plot). */
export interface Series {
  label: string;
  values: readonly number[];
}

/** A goal drawn as a dashed red line across the plot. */
export interface Goal {
  value: number;
  label: string;
}

/** HistogramOptions: the series share one set of bins; bars show each series' share of its own samples (%). */
export interface HistogramOptions {
  title: string;
  /** the x axis' label, with its unit, e.g. "latency (ms)" */
  xLabel: string;
  /** the figure first, its baseline(s) after it */
  series: Series[];
  goal?: Goal;
  /** number of bins; default ceil(sqrt(n)) between 8 and 40 */
  bins?: number;
  width?: number;
  height?: number;
}

/**
 * histogram overlays the series over shared bins; the legend gives each series' n, p50 and
 * p99. A series without finite samples is listed as "no samples".
 */
export function histogram(o: HistogramOptions): string {
  const box: Box = { width: o.width ?? 520, height: o.height ?? 250, left: 48, right: 12, top: 24, bottom: 34 };
  const series = o.series.map((s) => ({ label: s.label, ...finite(s.values) }));
  const all = series.flatMap((s) => s.values);
  const L = open('histogram', o.title, box);
  const lo = Math.min(...all, o.goal?.value ?? Infinity);
  const hi = Math.max(...all, o.goal?.value ?? -Infinity);
  const [d0, d1] = all.length === 0 ? [0, 1] : lo === hi ? [lo - 0.5, hi + 0.5] : [lo, hi];
  const n = o.bins ?? Math.min(40, Math.max(8, Math.ceil(Math.sqrt(Math.max(...series.map((s) => s.values.length), 1)))));
  const w = (d1 - d0) / n;
  const shares = series.map((s) => {
    const counts = Array.from({ length: n }, () => 0);
    for (const v of s.values) counts[Math.min(n - 1, Math.floor((v - d0) / w))]! += 1;
    return counts.map((c) => (s.values.length ? (100 * c) / s.values.length : 0));
  });
  const yMax = Math.max(1, ...shares.flat()) * 1.1;
  const x = scale(d0, d1, box.left, box.width - box.right);
  const y = scale(0, yMax, box.height - box.bottom, box.top);
  axisY(L, box, 0, yMax, y, 'share of samples (%)');
  shares.forEach((sh, si) => {
    const colour = PALETTE[si % PALETTE.length];
    sh.forEach((v, b) => {
      if (v === 0) return;
      const x0 = x(d0 + b * w);
      L.push(
        `<rect class="mark" x="${x0.toFixed(1)}" y="${y(v).toFixed(1)}" width="${Math.max(1, x(d0 + (b + 1) * w) - x0 - 1).toFixed(1)}" height="${(y(0) - y(v)).toFixed(1)}" fill="${colour}" fill-opacity="0.55"/>`,
      );
    });
  });
  axisX(L, box, d0, d1, x, o.xLabel);
  if (o.goal && Number.isFinite(o.goal.value)) {
    const gx = x(o.goal.value).toFixed(1);
    L.push(`<line x1="${gx}" y1="${box.top}" x2="${gx}" y2="${box.height - box.bottom}" stroke="${GOAL_COLOUR}" stroke-width="2" stroke-dasharray="5 3"/>`);
  }
  legend(L, box, [
    ...series.map((s, i) => ({
      colour: PALETTE[i % PALETTE.length] as string,
      text: s.values.length
        ? `${s.label}: n=${s.values.length}, p50 ${fmt(quantile(s.values, 50))}, p99 ${fmt(quantile(s.values, 99))}${s.dropped ? `, ${s.dropped} not finite` : ''}`
        : `${s.label}: no samples`,
    })),
    ...(o.goal ? [{ colour: GOAL_COLOUR, text: o.goal.label, dashed: true }] : []),
  ]);
  L.push('</svg>');
  return L.join('');
}

/** One group of bars (e.g. one round), each bar one value (e.g. one device). */
export interface BarGroup {
  label: string;
  values: readonly { label: string; value: number }[];
}

/** BarsOptions: bars in groups against a goal line; a bar on the wrong side of the goal is drawn red. */
export interface BarsOptions {
  title: string;
  /** the y axis' label with its unit */
  yLabel: string;
  groups: BarGroup[];
  goal?: Goal;
  /** whether the goal is an upper bound (default: a bar over it is red) or a lower bound (a bar under it is red) */
  goalIs?: 'max' | 'min';
  /** the bars' colour (default the first of PALETTE) */
  colour?: string;
  width?: number;
  height?: number;
}

/** bars draws one bar per value (its label as a tooltip), groups labelled under the axis. */
export function bars(o: BarsOptions): string {
  const box: Box = { width: o.width ?? 520, height: o.height ?? 250, left: 48, right: 12, top: 24, bottom: 34 };
  const groups = o.groups.map((g) => ({ label: g.label, values: g.values.filter((v) => Number.isFinite(v.value)), dropped: g.values.filter((v) => !Number.isFinite(v.value)).length }));
  const count = groups.reduce((a, g) => a + g.values.length, 0);
  const L = open('bars', o.title, box);
  const yMax = Math.max(1e-9, ...groups.flatMap((g) => g.values.map((v) => v.value)), o.goal?.value ?? 0) * 1.1;
  const y = scale(0, yMax, box.height - box.bottom, box.top);
  axisY(L, box, 0, yMax, y, o.yLabel);
  const plotW = box.width - box.left - box.right;
  const gapW = groups.length > 1 ? 1 : 0;
  const slot = plotW / Math.max(1, count + gapW * (groups.length - 1));
  let at = box.left;
  const colour = o.colour ?? PALETTE[0];
  for (const [gi, g] of groups.entries()) {
    const g0 = at;
    for (const v of g.values) {
      const over = o.goal !== undefined && (o.goalIs === 'min' ? v.value < o.goal.value : v.value > o.goal.value);
      L.push(
        `<rect class="mark" x="${(at + slot * 0.1).toFixed(1)}" y="${y(v.value).toFixed(1)}" width="${Math.max(0.5, slot * 0.8).toFixed(1)}" height="${(y(0) - y(v.value)).toFixed(1)}" fill="${over ? GOAL_COLOUR : colour}" fill-opacity="0.75"><title>${esc(`${v.label}: ${fmt(v.value)}`)}</title></rect>`,
      );
      at += slot;
    }
    L.push(`<text x="${((g0 + at) / 2).toFixed(1)}" y="${box.height - box.bottom + 14}" text-anchor="middle">${esc(g.label)}${g.dropped ? ` (${g.dropped} not finite)` : ''}</text>`);
    if (gi < groups.length - 1) at += slot * gapW;
  }
  const base = box.height - box.bottom;
  L.push(`<line x1="${box.left}" y1="${base}" x2="${box.width - box.right}" y2="${base}" stroke="${AXIS}"/>`);
  L.push(`<text x="${(box.left + box.width - box.right) / 2}" y="${box.height - 4}" text-anchor="middle">${count} bars</text>`);
  if (o.goal && Number.isFinite(o.goal.value)) {
    const gy = y(o.goal.value).toFixed(1);
    L.push(`<line x1="${box.left}" y1="${gy}" x2="${box.width - box.right}" y2="${gy}" stroke="${GOAL_COLOUR}" stroke-width="2" stroke-dasharray="5 3"/>`);
    legend(L, box, [{ colour: GOAL_COLOUR, text: o.goal.label, dashed: true }]);
  }
  L.push('</svg>');
  return L.join('');
}

/** A span on a lane: the operation (switch) or the longest time without a success (gap). */
export interface LaneSpan {
  from: number;
  to: number;
  kind: 'switch' | 'gap';
}

/** One lane of a timeline: points (e.g. successful calls) and spans, in the x unit. */
export interface Lane {
  label: string;
  points: readonly number[];
  spans: readonly LaneSpan[];
}

/** LanesOptions: one row per lane over a shared x axis [0, xMax]. */
export interface LanesOptions {
  title: string;
  xLabel: string;
  lanes: Lane[];
  /** the axis' end; default the longest lane's last point or span end */
  xMax?: number;
  width?: number;
}

const SPAN_FILL: Record<LaneSpan['kind'], string> = { switch: '#cfe2f7', gap: '#f3a6a6' };

/**
 * lanes draws a timeline: per lane its spans as bands (switch light blue, gap red) and its
 * points as ticks; what lies outside [0, xMax] is clipped to it.
 */
export function lanes(o: LanesOptions): string {
  const rowH = 14;
  const box: Box = { width: o.width ?? 520, height: 24 + 18 + o.lanes.length * rowH + 34, left: 78, right: 12, top: 24 + 18, bottom: 34 };
  const ends = o.lanes.flatMap((l) => [...l.points, ...l.spans.map((s) => s.to)]).filter((v) => Number.isFinite(v));
  const xMax = o.xMax ?? Math.max(1, ...ends);
  const x = scale(0, xMax, box.left, box.width - box.right);
  const cx = (v: number) => x(Math.min(xMax, Math.max(0, v)));
  const L = open('lanes', o.title, box);
  legend(L, { ...box, top: 18 }, [
    { colour: SPAN_FILL.switch, text: 'the switch' },
    { colour: SPAN_FILL.gap, text: 'longest time without a success' },
  ]);
  o.lanes.forEach((lane, i) => {
    const y0 = box.top + i * rowH;
    L.push(`<text x="${box.left - 4}" y="${y0 + rowH - 3}" text-anchor="end" font-size="10">${esc(lane.label)}</text>`);
    for (const s of lane.spans) {
      if (!Number.isFinite(s.from) || !Number.isFinite(s.to)) continue;
      const a = cx(s.from);
      L.push(
        `<rect class="mark" x="${a.toFixed(1)}" y="${y0 + 1}" width="${Math.max(1, cx(s.to) - a).toFixed(1)}" height="${rowH - 2}" fill="${SPAN_FILL[s.kind]}" fill-opacity="${s.kind === 'gap' ? 0.8 : 1}"/>`,
      );
    }
    const ticks = lane.points
      .filter((p) => Number.isFinite(p) && p >= 0 && p <= xMax)
      .map((p) => `M${x(p).toFixed(1)} ${y0 + 3}v${rowH - 6}`)
      .join('');
    if (ticks) L.push(`<path class="mark" d="${ticks}" stroke="#333" stroke-width="0.6"/>`);
  });
  axisX(L, box, 0, xMax, x, o.xLabel);
  L.push('</svg>');
  return L.join('');
}

/** One step of a Gantt: its lane (e.g. the component it touches), start and end in the x unit. */
export interface GanttBar {
  lane: string;
  from: number;
  to: number;
  label: string;
  status: 'pass' | 'fail' | 'n/a';
}

/** GanttOptions: lanes in the order given; bars coloured by status. */
export interface GanttOptions {
  title: string;
  xLabel: string;
  lanes: string[];
  bars: GanttBar[];
  width?: number;
}

const STATUS_FILL: Record<GanttBar['status'], string> = { pass: '#5bb55b', fail: '#d64545', 'n/a': '#aaaaaa' };

/** gantt draws one row per lane and a bar per step (tooltip: label and duration); bars of an unknown lane go to a last "other" row. */
export function gantt(o: GanttOptions): string {
  const rowH = 24;
  const names = [...o.lanes, ...(o.bars.some((b) => !o.lanes.includes(b.lane)) ? ['other'] : [])];
  const box: Box = { width: o.width ?? 900, height: 24 + names.length * rowH + 40, left: 120, right: 16, top: 28, bottom: 40 };
  const ok = o.bars.filter((b) => Number.isFinite(b.from) && Number.isFinite(b.to));
  const xMax = Math.max(1, ...ok.map((b) => b.to));
  const x = scale(0, xMax, box.left, box.width - box.right);
  const L = open('gantt', o.title, box);
  names.forEach((n, i) => {
    const y0 = box.top + i * rowH;
    L.push(`<rect x="${box.left}" y="${y0}" width="${box.width - box.left - box.right}" height="${rowH}" fill="${i % 2 ? '#fafafa' : '#f0f0f0'}"/>`);
    L.push(`<text x="${box.left - 6}" y="${y0 + rowH / 2 + 4}" text-anchor="end">${esc(n)}</text>`);
  });
  for (const b of ok) {
    const row = names.indexOf(o.lanes.includes(b.lane) ? b.lane : 'other');
    const a = x(b.from);
    const w = Math.max(2, x(b.to) - a);
    const y0 = box.top + row * rowH;
    L.push(
      `<rect class="mark step ${b.status === 'n/a' ? 'na' : b.status}" x="${a.toFixed(1)}" y="${y0 + 3}" width="${w.toFixed(1)}" height="${rowH - 6}" fill="${STATUS_FILL[b.status]}" stroke="#fff" stroke-width="0.5"><title>${esc(`${b.label}: ${b.status}, ${fmt(b.to - b.from)} (${fmt(b.from)}–${fmt(b.to)})`)}</title></rect>`,
    );
  }
  axisX(L, box, 0, xMax, x, o.xLabel);
  L.push('</svg>');
  return L.join('');
}

/** A figure on a page: a plot and the sentence under it. */
export interface Figure {
  svg: string;
  caption: string;
}

/** figureRow lays figures side by side (a figure beside its baseline), wrapping on narrow pages. */
export function figureRow(figures: Figure[]): string {
  return `<div class="row">${figures.map((f) => `<figure>${f.svg}<figcaption>${esc(f.caption)}</figcaption></figure>`).join('')}</div>`;
}

/** PAGE_CSS is the inline style of a report page that holds figures. */
export const PAGE_CSS =
  'body{font:14px system-ui,sans-serif;margin:2em;color:#222}.row{display:flex;flex-wrap:wrap;gap:1.5em;align-items:flex-start}figure{margin:0 0 1em 0;max-width:940px}figcaption{font-size:12px;color:#555;max-width:520px}table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 7px;vertical-align:top;text-align:left}';

/** page wraps body HTML in a self-contained document (inline CSS, no scripts, no network). */
export function page(title: string, body: string[]): string {
  return `<!doctype html><html><head><meta charset="utf-8"><title>${esc(title)}</title><style>${PAGE_CSS}</style></head><body><h1>${esc(title)}</h1>\n${body.join('\n')}\n</body></html>\n`;
}
