/**
 * The browser check itself (browser.ts) on pages made to be broken: each kind of breakage the
 * report tests rely on it to catch must show up in pageProblems, and a sound page must show none.
 */
import { describeWith } from './prereq';
import { PARTS_BROWSER, pageProblems, renderPage } from './browser';

jest.setTimeout(120_000);

const svg = (body: string, size = 'width="200" height="100"') => `<svg xmlns="http://www.w3.org/2000/svg" class="plot" data-plot="t" ${size}><title>t</title>${body}</svg>`;
const doc = (body: string) => `<!doctype html><html><head><meta charset="utf-8"><title>p</title></head><body><p>text</p>${body}</body></html>`;
const BAR = '<rect class="mark" x="10" y="10" width="20" height="50" fill="blue"/>';

describeWith('renderPage + pageProblems in headless chromium', [PARTS_BROWSER], () => {
  it('finds nothing wrong with a sound page, and reports its plot with its size and marks', async () => {
    const p = await renderPage(doc(svg(BAR)));
    expect(pageProblems(p, 1)).toEqual([]);
    expect(p.plots).toEqual([{ kind: 't', title: 't', width: 200, height: 100, marks: 1 }]);
  });

  it.each([
    ['no plot', doc('<p>nothing drawn</p>'), /0 plots/],
    ['a plot of zero size', doc(svg(BAR, 'width="0" height="0"')), /renders 0 x 0/],
    ['a plot with axes only', doc(svg('<line x1="0" y1="0" x2="100" y2="0" stroke="black"/>')), /draws nothing/],
    ['NaN in the text', doc(`<p>p50 NaN ms</p>${svg(BAR)}`), /shows NaN/],
    ['NaN in an SVG label', doc(svg(`${BAR}<text x="5" y="5">undefined</text>`)), /shows undefined/],
    ['a script error', doc(`${svg(BAR)}<script>null.x()</script>`), /pageerror/],
    ['a request off the page', doc(`${svg(BAR)}<img src="http://192.0.2.1/x.png">`), /requested http:\/\/192\.0\.2\.1\/x\.png/],
    ['an empty body', '<!doctype html><html><body></body></html>', /no text/],
  ])('reports %s', async (_name, html, problem) => {
    const problems = pageProblems(await renderPage(html), 1);
    expect(problems.join('\n')).toMatch(problem);
  });
});
