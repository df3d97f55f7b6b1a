/**
 * Renders a page in a real headless browser (Debian's chromium, driven by playwright-core: no
 * browser download) and reports what a person would see: the plots (`svg.plot`, from
 * @sandnode/plot) with their rendered size and marks, the page's text, script errors and every
 * request that left the page (a self-contained report makes none). Tests assert on the report
 * with {@link pageProblems}; suites need {@link PARTS_BROWSER}.
 */
import { accessSync, constants, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type * as Playwright from 'playwright-core';
import type { Part } from './prereq';

/** CHROMIUM: the browser binary (Debian's package `chromium`; SANDNODE_CHROMIUM overrides). */
export const CHROMIUM = process.env.SANDNODE_CHROMIUM ?? '/usr/bin/chromium';

/** The part "a headless chromium": `.ci/run` installs it (apt), so its absence fails under CI=true. */
export const PARTS_BROWSER: Part = { name: `chromium (apt-get install chromium; at ${CHROMIUM})`, present: () => isExecutable(CHROMIUM), ciProvides: true };

/** isExecutable: file is a regular file (after symlinks) that we may execute. */
function isExecutable(file: string): boolean {
  try {
    accessSync(file, constants.X_OK);
    return statSync(file).isFile();
  } catch {
    return false;
  }
}

/** One plot as rendered: its kind (data-plot), title, size in CSS px and how many drawn marks have a non-zero box. */
export interface RenderedPlot {
  kind: string;
  title: string;
  width: number;
  height: number;
  /** data marks (`.mark`: bars, bands, ticks, steps; not axes) whose rendered box is larger than 0 x 0 */
  marks: number;
}

/** What the browser saw of one page. */
export interface RenderedPage {
  title: string;
  /** the body's visible text and the text of every SVG <text> */
  text: string;
  plots: RenderedPlot[];
  /** uncaught exceptions and console errors */
  errors: string[];
  /** URLs the page requested other than itself (all were refused) */
  requests: string[];
  /** the page's own elements with a rendered box, by selector, when asked for (boxesOf) */
  boxes: { selector: string; text: string; x: number; y: number; width: number; height: number }[];
}

/** IN_PAGE runs in the page (plain JS: this package has no DOM types): plots, text (body and SVG text), boxes of a selector. */
const IN_PAGE = `(boxesOf) => {
  const plots = [...document.querySelectorAll('svg.plot')].map((svg) => {
    const r = svg.getBoundingClientRect();
    const marks = [...svg.querySelectorAll('.mark')].filter((m) => {
      const b = m.getBoundingClientRect();
      return b.width > 0 || b.height > 0;
    }).length;
    const t = svg.querySelector('title');
    return { kind: svg.getAttribute('data-plot') || '', title: t ? t.textContent : '', width: r.width, height: r.height, marks };
  });
  const boxes = boxesOf
    ? [...document.querySelectorAll(boxesOf)].map((e) => {
        const b = e.getBoundingClientRect();
        return { selector: boxesOf, text: (e.textContent || '').trim(), x: b.x, y: b.y, width: b.width, height: b.height };
      })
    : [];
  const svgText = [...document.querySelectorAll('svg text')].map((t) => t.textContent || '').join('\\n');
  return { title: document.title, text: (document.body ? document.body.innerText : '') + '\\n' + svgText, plots, boxes };
}`;

/**
 * renderPage opens html (written to a temporary file, loaded as file://) in headless chromium
 * at a 1400 x 900 viewport, waits for load, and reports it. Every request other than the page
 * itself is refused and listed. boxesOf (a CSS selector) also reports those elements' boxes.
 */
export async function renderPage(html: string, opts: { boxesOf?: string; timeoutMs?: number } = {}): Promise<RenderedPage> {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-render-'));
  const file = path.join(dir, 'page.html');
  writeFileSync(file, html);
  const url = `file://${file}`;
  // loaded here, not at the top: importing testkit (the bench does) must not load a browser driver
  const { chromium } = require('playwright-core') as typeof Playwright;
  const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'], timeout: opts.timeoutMs ?? 60_000 });
  try {
    const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
    const errors: string[] = [];
    const requests: string[] = [];
    page.on('pageerror', (e) => errors.push(`pageerror: ${e.message}`));
    page.on('console', (m) => {
      if (m.type() === 'error') errors.push(`console: ${m.text()}`);
    });
    await page.route('**/*', async (route) => {
      if (route.request().url() === url) return route.continue();
      requests.push(route.request().url());
      return route.abort();
    });
    await page.goto(url, { waitUntil: 'load', timeout: opts.timeoutMs ?? 60_000 });
    const seen = (await page.evaluate(`(${IN_PAGE})(${JSON.stringify(opts.boxesOf ?? '')})`)) as Omit<RenderedPage, 'errors' | 'requests'>;
    return { ...seen, errors, requests };
  } finally {
    await browser.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * pageProblems lists what makes a rendered page blank or broken: no plots (fewer than
 * minPlots), a plot of zero size or without data marks, NaN / undefined / Infinity in the text,
 * script errors, requests off the page, an empty body.
 */
export function pageProblems(p: RenderedPage, minPlots: number): string[] {
  const out: string[] = [];
  if (!p.text.trim()) out.push('the page has no text');
  if (p.plots.length < minPlots) out.push(`${p.plots.length} plots (svg.plot), expected at least ${minPlots}`);
  for (const s of p.plots) {
    if (!(s.width > 0 && s.height > 0)) out.push(`plot "${s.title}" renders ${s.width} x ${s.height}`);
    if (s.marks === 0) out.push(`plot "${s.title}" draws nothing`);
  }
  const bad = p.text.match(/\b(NaN|undefined|Infinity)\b/g);
  if (bad) out.push(`the text shows ${[...new Set(bad)].join(', ')}`);
  for (const s of p.plots) if (/\b(NaN|undefined|Infinity)\b/.test(s.title)) out.push(`plot title "${s.title}"`);
  out.push(...p.errors, ...p.requests.map((r) => `requested ${r}`));
  return out;
}
