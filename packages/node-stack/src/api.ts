/**
 * The client of a node server's public API that the CLI, the bench and the tests share (one
 * piece of code in shared serves them all).
 */
export { connectServerApi as connectServer, type ServerApi } from '@sandnode/shared';
