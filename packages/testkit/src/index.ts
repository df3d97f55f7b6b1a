/** @sandnode/testkit: fixtures and helpers for sandnode's tests (never imported by daemons). */
export * from './node-fixture';
