/**
 * Defaults of a node drain (AdminService.Drain, `sandnode drain`, the pod's pre-stop hook):
 * one pair for the server, which applies them to a request that says 0, and the CLI, which
 * offers them as its option defaults.
 */

/** Time for the whole drain when a request says 0, in ms (proto: `DrainRequest.deadline_ms`). */
export const DEFAULT_DRAIN_DEADLINE_MS = 20_000;
/** Sandboxes paused and persisted at once when a request says 0 (proto: `DrainRequest.concurrency`). */
export const DEFAULT_DRAIN_CONCURRENCY = 8;
