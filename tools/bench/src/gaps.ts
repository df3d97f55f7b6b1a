/** Gap figures of the handover bench (live-upgrade.ts). Pure. */

/**
 * gapIn is the longest time without a successful call around [from, to] (monotonic ms): over
 * the successes inside it, the last one before it and the first one after it (from and to
 * themselves when there is none: an outage that runs past the window counts up to its edge).
 */
export function gapIn(times: number[], from: number, to: number): number {
  let prev = from;
  let next = to;
  const inside: number[] = [];
  for (const t of times) {
    if (t < from) prev = Math.max(prev === from ? t : prev, t);
    else if (t > to) next = next === to ? t : Math.min(next, t);
    else inside.push(t);
  }
  const pts = [prev, ...inside.sort((x, y) => x - y), next];
  let gap = 0;
  for (let i = 1; i < pts.length; i++) gap = Math.max(gap, pts[i]! - pts[i - 1]!);
  return gap;
}

/**
 * timelineOf is one window of the handover timeline for the HTML report, times in ms relative
 * to `from`: the successful calls inside [from, to] plus the last one before and the first
 * one after it (the points gapIn measures between), rounded to 0.1 ms.
 */
export function timelineOf(times: number[], from: number, to: number): number[] {
  let prev: number | undefined;
  let next: number | undefined;
  const inside: number[] = [];
  for (const t of times) {
    if (t < from) prev = prev === undefined ? t : Math.max(prev, t);
    else if (t > to) next = next === undefined ? t : Math.min(next, t);
    else inside.push(t);
  }
  const pts = [...(prev === undefined ? [] : [prev]), ...inside.sort((x, y) => x - y), ...(next === undefined ? [] : [next])];
  return pts.map((t) => Math.round((t - from) * 10) / 10);
}
