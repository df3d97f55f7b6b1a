// Run by prereq-ci.test.ts in a child jest: a suite whose part is missing. PROBE_CI_PROVIDES=1
// makes the part one that .ci/run installs.
import { describeWith, type Part } from '../prereq';

const part: Part = { name: 'probe-part (apt-get install probe)', present: () => false, ciProvides: process.env.PROBE_CI_PROVIDES === '1' };

describeWith('probe suite', [part], () => {
  it('would run', () => {
    expect(true).toBe(true);
  });
});
