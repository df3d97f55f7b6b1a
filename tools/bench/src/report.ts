/**
 * The bench's HTML report: `bench/results/<name>.html` beside `<name>.json`, written by
 * writeBenchResults (results.ts) from the same results object, self-contained (inline SVG from
 * @sandnode/plot, inline CSS, no scripts, no network). It plots the raw samples the sections
 * keep in the JSON, each figure beside its baseline from the same run where there is one:
 * - create / exec latency histograms (goal line: the p50 goal),
 * - GetSandbox calls/s per round, the sandnode client beside the lean client,
 * - fork latency histogram and the parent's freeze window of each fork against the goal line,
 * - device handover: each device's stall per round against the goal line; write + fdatasync
 *   latency during the handovers beside the same writer's quiet window before them,
 * - server handover timeline: the successful calls of the open channel around each switch, the
 *   switch and the unavailability window (the longest time without a success) marked, beside
 *   the naive restart and the same windows without a switch (the host's noise floor); the gaps'
 *   histogram of the three.
 * A section the run did not have is not shown; one that failed shows its error; a results file
 * without raw samples (written before they were kept) says so instead of a plot.
 *
 * Run alone: `node tools/bench/dist/report.js bench/results/<name>.json` (re)writes `<name>.html`.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { bars, esc, figureRow, fmt, histogram, lanes, page, type Figure, type Lane, type LaneSpan } from '@sandnode/plot';

type Obj = Record<string, unknown>;

const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);
const nums = (v: unknown): number[] | undefined => (Array.isArray(v) && v.every((x) => typeof x === 'number') ? (v as number[]) : undefined);
const num = (v: unknown): number => (typeof v === 'number' ? v : NaN);

/** A section of the page: its heading and either figures or a sentence why there are none. */
interface Part {
  title: string;
  figures: Figure[][];
  notes: string[];
}

const NO_SAMPLES = 'no raw samples in this results file (written before the bench kept them): rerun the section to plot it';

/** failedOr returns the section's error text when it failed (`{ error }`), else undefined. */
function failedOf(v: unknown): string | undefined {
  return isObj(v) && typeof v.error === 'string' ? v.error : undefined;
}

function latencyPart(title: string, key: string, r: Obj): Part | undefined {
  const v = r[key];
  if (v === undefined) return undefined;
  const part: Part = { title, figures: [], notes: [] };
  const err = failedOf(v);
  if (err) return { ...part, notes: [`FAILED: ${err}`] };
  const o = v as Obj;
  const xs = nums(o.samplesMs);
  if (!xs) return { ...part, notes: [NO_SAMPLES, `p50 ${fmt(num(o.p50Ms))} ms, p95 ${fmt(num(o.p95Ms))} ms (n=${fmt(num(o.n))})`] };
  const goal = num(o.goalP50Ms);
  part.figures.push([
    {
      svg: histogram({ title, xLabel: 'latency (ms)', series: [{ label: title, values: xs }], goal: Number.isFinite(goal) ? { value: goal, label: `goal: p50 <= ${fmt(goal)} ms` } : undefined }),
      caption: `${xs.length} samples in order of the run; p50 ${fmt(num(o.p50Ms))} ms, p95 ${fmt(num(o.p95Ms))} ms. No baseline in this section.`,
    },
  ]);
  return part;
}

function getSandboxPart(r: Obj): Part | undefined {
  const v = r.getSandbox;
  if (v === undefined) return undefined;
  const part: Part = { title: 'GetSandbox throughput', figures: [], notes: [] };
  const err = failedOf(v);
  if (err) return { ...part, notes: [`FAILED: ${err}`] };
  const o = v as Obj;
  const rounds = (k: string) => (Array.isArray(o[k]) ? (o[k] as Obj[]) : []);
  const s = rounds('sandnodeClient');
  const l = rounds('leanClient');
  const goal = num(o.goalCallsPerSecond);
  const group = (label: string, rs: Obj[]) => ({ label, values: rs.map((x, i) => ({ label: `round ${i + 1}`, value: num(x.callsPerSecond) })) });
  part.figures.push([
    {
      svg: bars({
        title: 'GetSandbox calls/s per round',
        yLabel: 'calls/s',
        groups: [group('sandnode client', s), group('lean client (baseline)', l)],
        goal: Number.isFinite(goal) ? { value: goal, label: `goal >= ${fmt(goal)} calls/s` } : undefined,
        goalIs: 'min',
      }),
      caption: `Alternating rounds of ${fmt(num(o.seconds))} s, ${fmt(num(o.inFlight))} calls in flight; the lean client (no middleware) is the baseline from the same run.`,
    },
  ]);
  return part;
}

function forkPart(r: Obj): Part | undefined {
  const v = r.fork;
  if (v === undefined) return undefined;
  const part: Part = { title: 'Fork', figures: [], notes: [] };
  const err = failedOf(v);
  if (err) return { ...part, notes: [`FAILED: ${err}`] };
  const o = v as Obj;
  const forkMs = nums(o.forkSamplesMs);
  const held = nums(o.freezeWindowSamplesMs);
  if (!forkMs || !held) return { ...part, notes: [NO_SAMPLES, `fork p50 ${fmt(num(o.forkP50Ms))} ms; freeze window p99 ${fmt(num(o.freezeWindowP99Ms))} ms`] };
  const goalFork = num(o.goalForkP50Ms);
  const goalHeld = num(o.goalFreezeWindowP99Ms);
  part.figures.push([
    {
      svg: histogram({
        title: `fork latency (parent with ${fmt(num(o.parentWorkspaceMB))} MB, ${String(o.method)})`,
        xLabel: 'latency (ms)',
        series: [{ label: 'fork', values: forkMs }],
        goal: { value: goalFork, label: `goal: p50 <= ${fmt(goalFork)} ms` },
      }),
      caption: `${forkMs.length} forks one at a time, as the client sees them.`,
    },
    {
      svg: bars({
        title: "parent's freeze window per fork",
        yLabel: 'freeze window (ms)',
        groups: [{ label: 'forks in order', values: held.map((x, i) => ({ label: `fork ${i + 1}`, value: x })) }],
        goal: { value: goalHeld, label: `goal: p99 <= ${fmt(goalHeld)} ms` },
      }),
      caption: `First FIFREEZE to last FITHAW as podd reports it; a bar over the goal line is red. p99 ${fmt(num(o.freezeWindowP99Ms))} ms.`,
    },
  ]);
  return part;
}

function devicePart(r: Obj): Part | undefined {
  const v = r.deviceHandover;
  if (v === undefined) return undefined;
  const part: Part = { title: 'Device handover (ublk-manager upgrade with an fsync writer on every device)', figures: [], notes: [] };
  const err = failedOf(v);
  if (err) return { ...part, notes: [`FAILED: ${err}`] };
  const o = v as Obj;
  const rounds = Array.isArray(o.rounds) ? (o.rounds as Obj[]) : [];
  if (!rounds.length || rounds.some((x) => !Array.isArray(x.deviceStallsMs) || !nums(x.writeSamplesMs))) {
    return { ...part, notes: [NO_SAMPLES, `stall p99 per round: ${rounds.map((x) => fmt(num(x.stallP99Ms))).join(' / ')} ms`] };
  }
  const goal = num(o.goalStallP99Ms);
  const during = rounds.flatMap((x) => nums(x.writeSamplesMs) ?? []);
  const quiet = rounds.flatMap((x) => nums(x.baselineWriteSamplesMs) ?? []);
  part.figures.push([
    {
      svg: bars({
        title: 'stall per device, per round',
        yLabel: 'stall (ms)',
        groups: rounds.map((x, i) => ({ label: `round ${i + 1} (${String(x.mode)})`, values: (x.deviceStallsMs as Obj[]).map((d) => ({ label: String(d.deviceId), value: num(d.stallMs) })) })),
        goal: { value: goal, label: `goal: p99 <= ${fmt(goal)} ms` },
      }),
      caption: `Each device's I/O stall (quiesce start to recover end) as HandoverAll reports it; ${rounds[0]?.devices ?? 0} devices, ${rounds.length} rounds.`,
    },
    {
      svg: histogram({
        title: 'write + fdatasync latency',
        xLabel: 'latency (ms)',
        series: [
          { label: 'during the handovers', values: during },
          { label: 'quiet window before (baseline)', values: quiet },
        ],
      }),
      caption: `The writer pauses ${fmt(num(o.writerPauseMs))} ms after each write; the baseline is the same writer over a window of the same length just before each handover.`,
    },
  ]);
  return part;
}

interface Window {
  lengthMs: number;
  switchEndMs: number;
  gapMs: number;
  okMs: number[];
  rep?: number;
}

/** laneOf draws one window: the switch [switchStart, switchEnd] and the longest gap between its successes. */
function laneOf(label: string, w: Window, switchStartMs: number): Lane {
  const pts = [...w.okMs].sort((a, b) => a - b);
  // as gapIn: the window's edges stand in for a success before / after it when there is none
  const edges = [pts[0] !== undefined && pts[0] < 0 ? [] : [0], pts, pts.at(-1) !== undefined && (pts.at(-1) as number) > w.lengthMs ? [] : [w.lengthMs]].flat();
  let at = 0;
  let best = -1;
  for (let i = 1; i < edges.length; i++) {
    const g = (edges[i] as number) - (edges[i - 1] as number);
    if (g > best) [best, at] = [g, i];
  }
  const spans: LaneSpan[] = [{ from: switchStartMs, to: w.switchEndMs, kind: 'switch' }];
  if (best > 0) spans.push({ from: edges[at - 1] as number, to: edges[at] as number, kind: 'gap' });
  return { label, points: pts, spans };
}

function handoverPart(r: Obj): Part | undefined {
  const v = r.liveUpgrade;
  if (v === undefined) return undefined;
  const part: Part = { title: 'Server handover under load (open channel, a call every few ms)', figures: [], notes: [] };
  const err = failedOf(v);
  if (err) return { ...part, notes: [`FAILED: ${err}`] };
  const sh = (v as Obj).serverHandover;
  if (!isObj(sh)) return { ...part, notes: ['no server handover figures in this results file'] };
  const h = isObj(sh.handover) ? sh.handover : {};
  const t = sh.timeline;
  if (!isObj(t)) return { ...part, notes: [NO_SAMPLES, `gap p50 ${fmt(num(h.gapP50Ms))} ms, p99 ${fmt(num(h.gapP99Ms))} ms`] };
  const start = num(t.switchStartMs);
  const ws = (k: string) => (Array.isArray(t[k]) ? (t[k] as Window[]) : []);
  const hs = ws('handovers');
  const idle = ws('idle');
  const naive = ws('naiveRestarts');
  const xMax = Math.max(1, ...[...hs, ...idle, ...naive].map((w) => w.lengthMs));
  const lanesOf = (list: Window[], name: string) => list.map((w, i) => laneOf(`${name} ${i + 1}`, w, start));
  part.figures.push([
    {
      svg: lanes({ title: `server handover x${hs.length}: successful calls around each switch`, xLabel: 'ms from the window start', lanes: lanesOf(hs, 'handover'), xMax }),
      caption: `Each tick a successful GetSandbox on the open channel; blue: \`upgrade server\` from its start to its end; red: the unavailability window (longest time without a success). gap p50 ${fmt(num(h.gapP50Ms))} ms, p99 ${fmt(num(h.gapP99Ms))} ms; ${fmt(num(h.refused))} refused, ${fmt(num(h.failed))} failed.`,
    },
    {
      svg: lanes({ title: `naive restart x${naive.length} (baseline)`, xLabel: 'ms from the window start', lanes: lanesOf(naive, 'restart'), xMax }),
      caption: `The same load through a stop (SIGTERM) and start of the server on the same port.`,
    },
  ]);
  const gaps = (list: Window[]) => list.map((w) => w.gapMs);
  part.figures.push([
    {
      svg: histogram({
        title: 'unavailability window per switch',
        xLabel: 'longest time without a success (ms)',
        series: [
          { label: 'handover', values: gaps(hs) },
          { label: 'no switch (noise floor)', values: gaps(idle) },
          { label: 'naive restart', values: gaps(naive) },
        ],
        goal: { value: 30, label: 'goal: handover p99 <= 30 ms' },
      }),
      caption: `The windows without a switch (same length, same load) show what the host alone causes: a gap they also show is CPU contention, not the handover.`,
    },
    {
      svg: lanes({ title: `same windows without a switch x${idle.length} (noise floor)`, xLabel: 'ms from the window start', lanes: lanesOf(idle, 'idle'), xMax }),
      caption: 'Blue here marks a wait of the median switch time, with no switch in it.',
    },
  ]);
  return part;
}

/**
 * benchReportHtml renders the results object of one bench run (what main.ts or fork.ts write
 * as JSON) as a self-contained HTML page; jsonName names the JSON file beside it.
 */
export function benchReportHtml(results: Obj, jsonName: string): string {
  const host = isObj(results.host) ? results.host : {};
  const load = isObj(results.loadAverage1m) ? results.loadAverage1m : {};
  const failed = Array.isArray(results.failedSections) ? (results.failedSections as string[]) : [];
  const body: string[] = [
    '<ul>',
    `<li>results: <code>${esc(jsonName)}</code> (every plot is drawn from the raw samples in it)</li>`,
    `<li>date: ${esc(String(results.date ?? '-'))}; host: ${esc(`${fmt(num(host.cpus))} cpus, ${fmt(num(host.memGiB))} GiB, kernel ${String(host.kernel ?? '-')}`)}</li>`,
    `<li>sections: ${esc(Array.isArray(results.sections) ? (results.sections as string[]).join(', ') : '-')}; bench took ${fmt(num(results.benchSeconds))} s; load average (1 min) ${fmt(num(load.start))} at the start, ${fmt(num(load.end))} at the end</li>`,
    '<li>figures are indicative: the host is shared with other work that moves them; a baseline sits beside a figure where the section has one (same run)</li>',
    ...(failed.length ? [`<li><b>failed sections: ${esc(failed.join(', '))}</b></li>`] : []),
    '</ul>',
  ];
  const parts = [
    latencyPart('sandbox create', 'create', results),
    latencyPart('exec round trip (true)', 'exec', results),
    getSandboxPart(results),
    forkPart(results),
    devicePart(results),
    handoverPart(results),
  ].filter((p): p is Part => p !== undefined);
  if (!parts.length) body.push('<p>This run has no section the report plots (create, exec, getsandbox, fork, device, live-upgrade).</p>');
  for (const p of parts) {
    body.push(`<h2>${esc(p.title)}</h2>`);
    for (const n of p.notes) body.push(`<p class="note">${esc(n)}</p>`);
    for (const row of p.figures) body.push(figureRow(row));
  }
  return page('sandnode bench report', body);
}

/** standalone: `node report.js <results.json>...` writes each `<name>.html` beside it. */
function main(argv: string[]): void {
  if (!argv.length) throw new Error('usage: report.js bench/results/<name>.json ...');
  for (const f of argv) {
    const out = f.replace(/\.json$/, '') + '.html';
    writeFileSync(out, benchReportHtml(JSON.parse(readFileSync(f, 'utf8')) as Obj, f.split('/').pop() ?? f));
    process.stdout.write(`written to ${out}\n`);
  }
}

if (require.main === module) main(process.argv.slice(2));
