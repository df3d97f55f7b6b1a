/**
 * @sandnode/node-stack: the local stack of one node as its operator drives it: start, find,
 * stop and purge the daemons; find the active server; upgrade the server and the ublk-manager
 * by handover; the server API client the CLI, the bench and the tests share.
 */
export * from './stack';
export * from './lease';
export * from './upgrade';
export * from './upgrade-ublk';
export * from './stats';
export * from './api';
