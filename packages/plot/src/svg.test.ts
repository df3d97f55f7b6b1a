/** svg.ts: ticks, quantiles and what the plots print for values that are not finite or missing. */
import { bars, fmt, gantt, histogram, lanes, niceTicks, quantile } from './svg';

describe('plot helpers', () => {
  it('niceTicks covers the range with round steps', () => {
    expect(niceTicks(0, 100, 5)).toEqual([0, 20, 40, 60, 80, 100]);
    expect(niceTicks(3.2, 9.7, 5)).toEqual([4, 6, 8]);
    expect(niceTicks(0, 0.05, 5)).toEqual([0, 0.01, 0.02, 0.03, 0.04, 0.05]);
  });

  it('quantile is nearest-rank; fmt never prints NaN', () => {
    expect(quantile([5, 1, 3, 2, 4], 50)).toBe(3);
    expect(quantile([1, 2, 3, 4, 100], 99)).toBe(100);
    expect(Number.isNaN(quantile([], 50))).toBe(true);
    expect([fmt(NaN), fmt(Infinity), fmt(1234.5), fmt(12.345), fmt(0.01234)]).toEqual(['-', '-', '1235', '12.3', '0.012']);
  });
});

describe('plots', () => {
  const noBadText = (svg: string) => expect(svg).not.toMatch(/NaN|undefined|Infinity/);

  it('histogram: one bar per non-empty bin per series, not-finite samples counted, an empty series named', () => {
    const svg = histogram({
      title: 't',
      xLabel: 'ms',
      series: [
        { label: 'a', values: [1, 2, 2, 3, NaN] },
        { label: 'b', values: [] },
      ],
      goal: { value: 2.5, label: 'goal' },
      bins: 4,
    });
    noBadText(svg);
    expect(svg.match(/class="mark"/g)).toHaveLength(3);
    expect(svg).toContain('a: n=4, p50 2, p99 3, 1 not finite');
    expect(svg).toContain('b: no samples');
  });

  it('histogram of nothing at all is an empty plot with axes, not NaN', () => {
    const svg = histogram({ title: 't', xLabel: 'ms', series: [{ label: 'a', values: [NaN] }] });
    noBadText(svg);
    expect(svg).not.toContain('class="mark"');
  });

  it('bars: red on the wrong side of the goal (max by default, min when asked)', () => {
    const groups = [
      {
        label: 'g',
        values: [
          { label: 'x', value: 10 },
          { label: 'y', value: 60 },
        ],
      },
    ];
    const max = bars({ title: 't', yLabel: 'ms', groups, goal: { value: 50, label: 'goal' } });
    const min = bars({ title: 't', yLabel: 'ms', groups, goal: { value: 50, label: 'goal' }, goalIs: 'min' });
    noBadText(max);
    const red = (s: string) => (s.match(/fill="#c6282b" fill-opacity="0.75"><title>([^<]*)/g) ?? []).map((m) => m.replace(/.*<title>/, ''));
    expect(red(max)).toEqual(['y: 60']);
    expect(red(min)).toEqual(['x: 10']);
  });

  it('lanes: a band per span and a path of ticks per lane with points', () => {
    const svg = lanes({
      title: 't',
      xLabel: 'ms',
      lanes: [
        {
          label: 'l',
          points: [1, 2, 50],
          spans: [
            { from: 0, to: 10, kind: 'switch' },
            { from: 2, to: 50, kind: 'gap' },
          ],
        },
      ],
    });
    noBadText(svg);
    expect(svg.match(/class="mark"/g)).toHaveLength(3);
  });

  it('gantt: a bar per step; a step of an unknown lane goes to "other"', () => {
    const svg = gantt({
      title: 't',
      xLabel: 's',
      lanes: ['server'],
      bars: [
        { lane: 'server', from: 0, to: 1, label: 'a', status: 'pass' },
        { lane: 'x', from: 1, to: 2, label: 'b', status: 'fail' },
      ],
    });
    noBadText(svg);
    expect(svg.match(/class="mark step/g)).toHaveLength(2);
    expect(svg).toContain('>other</text>');
  });
});
