import { percentile } from './stats';

describe('percentile (nearest rank)', () => {
  it('picks the rank, unsorted input, and NaN when empty', () => {
    expect(percentile([5, 1, 3, 2, 4], 50)).toBe(3);
    expect(percentile([5, 1, 3, 2, 4], 99)).toBe(5);
    expect(percentile([5, 1, 3, 2, 4], 0)).toBe(1);
    expect(percentile([], 50)).toBeNaN();
  });
});
