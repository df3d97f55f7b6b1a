/**
 * @sandnode/chaos: the chaos run of a whole node (`npm run chaos -- --seed N --steps M`), as a
 * function the bench calls too.
 */
export { checkInvariants, type Expectation, type NodeSnapshot } from './invariants';
export { describeAction, payload, planActions, Prng, SERVER_HANDOVER_FAILPOINTS, UBLK_HANDOVER_FAILPOINTS, type Action, type ActionKind, type HandoverFailpoint } from './plan';
export { DEFAULT_CONVERGE_MS, DEFAULT_QUIET_SETTLE_MS, runChaos, type ChaosFailure, type ChaosOptions, type ChaosReport } from './run';
export { formatReport, writeReport, DEFAULT_REPORT_PATH } from './report';
