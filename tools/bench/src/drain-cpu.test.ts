/** The drain bench's host CPU figures: /proc/stat parsed (idle and iowait are not busy) and busy cores between two readings. */
import { busyCores, cpuTimes } from './drain';

describe('drain bench host CPU', () => {
  it('reads the cpu line: busy is everything but idle and iowait', () => {
    // user nice system idle iowait irq softirq steal
    expect(cpuTimes('cpu  100 5 50 800 40 3 2 0 0 0\ncpu0 1 2 3 4 5 6 7 8\n')).toEqual({ busy: 160, total: 1000 });
  });

  it('busy cores between two readings, scaled to the host cores; no time passed is 0', () => {
    expect(busyCores({ busy: 0, total: 0 }, { busy: 50, total: 100 }, 2)).toBe(1);
    expect(busyCores({ busy: 10, total: 100 }, { busy: 10, total: 100 }, 2)).toBe(0);
  });

  it('this host: a reading of its own /proc/stat grows', () => {
    const a = cpuTimes();
    for (let i = 0; i < 2e6; i++) Math.sqrt(i);
    const b = cpuTimes();
    expect(b.total).toBeGreaterThanOrEqual(a.total);
    expect(busyCores(a, b)).toBeGreaterThanOrEqual(0);
  });
});
