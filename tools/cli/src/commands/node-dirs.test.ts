import path from 'node:path';
import { nodeDirsLine } from './node';

describe("up's line naming the node's dirs", () => {
  it('gives them absolute, from the directory the command runs in (newcomer: `up` from another directory started another node)', () => {
    const w = nodeDirsLine({ stateDir: './.sandnode/state', runDir: './.sandnode/run' });
    expect(w.stateDir).toBe(path.resolve('.sandnode/state'));
    expect(w.runDir).toBe(path.resolve('.sandnode/run'));
    expect(w.text).toBe(`sandnode: this node: state ${w.stateDir}, run ${w.runDir} (other commands find it from this directory, or with --state-dir/--run-dir)`);
  });

  it('keeps absolute dirs as given', () => {
    expect(nodeDirsLine({ stateDir: '/var/lib/sn', runDir: '/run/sn' })).toMatchObject({ stateDir: '/var/lib/sn', runDir: '/run/sn' });
  });
});
