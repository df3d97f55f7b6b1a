/** @sandnode/testkit: fixtures and helpers for sandnode's tests (never imported by daemons). */
export * from './prereq';
export * from './expect-code';
export * from './wait-for';
export * from './temp-dir';
export * from './daemon';
export * from './node-fixture';
export * from './dead-nodes';
export * from './test-pool';
export * from './wire-fuzz';
export * from './sqlite-lock';
export * from './fuzz-random';
export * from './test-subnet';
export * from './test-internet';
export * from './browser';
