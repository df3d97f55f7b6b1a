/**
 * The defaults of a node drain (server.v1 AdminService.Drain, proto/sandnode/server/v1/admin.proto):
 * one place for the server, its SIGTERM drain and the CLI's `sandnode drain`.
 */

/** Time for a whole drain when the request says 0, ms. */
export const DEFAULT_DRAIN_DEADLINE_MS = 20_000;
/** Sandboxes drained at once when the request says 0. */
export const DEFAULT_DRAIN_CONCURRENCY = 8;
