/**
 * The suite's test order: jest's own (slowest and previously failed first), except that the
 * files in FIRST run before all others. server-guards.test.ts counts the bytes grpc-js holds
 * for raw HTTP/2 streams; after about 145 other suites in the same process (`--runInBand`) its
 * held-bytes count stalled below the cap in CI (2 of 2 runs on 2026-12-01; it passes alone and
 * first). The cause is not found yet: this keeps the test meaningful meanwhile (it runs on a
 * fresh process state) instead of skipping it.
 */
const Sequencer = require('@jest/test-sequencer').default;

const FIRST = ['packages/shared/src/server-guards.test.ts'];

class SandnodeSequencer extends Sequencer {
  sort(tests) {
    const sorted = super.sort(tests);
    const isFirst = (t) => FIRST.some((f) => t.path.endsWith(f));
    return [...sorted.filter(isFirst), ...sorted.filter((t) => !isFirst(t))];
  }
}

module.exports = SandnodeSequencer;
