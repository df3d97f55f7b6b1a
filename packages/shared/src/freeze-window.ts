/**
 * The bounded freeze window of podd's Quiesce and the supervisor's freeze port
 * (proto/sandnode/podd/v1/podd.proto, vmm.v1 FreezePortService): one rule for every component.
 */

/** Shortest freeze window, in ms. */
export const MIN_FREEZE_MS = 100;
/** Longest freeze window, in ms. */
export const MAX_FREEZE_MS = 5000;
/** Window of a request that says 0, in ms. */
export const DEFAULT_FREEZE_MS = 1500;

/**
 * clampFreezeMs returns the window a request gets, in ms: 0 (or a non-finite value) means
 * {@link DEFAULT_FREEZE_MS}; anything else is clamped to [MIN_FREEZE_MS, MAX_FREEZE_MS].
 */
export function clampFreezeMs(requested: number): number {
  if (!Number.isFinite(requested) || requested <= 0) return DEFAULT_FREEZE_MS;
  return Math.min(MAX_FREEZE_MS, Math.max(MIN_FREEZE_MS, Math.floor(requested)));
}
