/**
 * podd's named failpoints for fault-injection tests (after containerd's integration/failpoint),
 * on the shared {@link Failpoints} parser: env `SANDNODE_PODD_FAILPOINTS` holds a
 * comma-separated list of `name[=action]`; a bare name means `hang` (a stuck handler), the
 * only action besides `kill`, `error` and `off`. Unknown names or actions fail podd's start
 * naming them. Never set in production.
 */
import { Failpoints } from '@sandnode/shared';

/** Failpoint names this release knows. */
export const FAILPOINTS = {
  /** Quiesce: the freeze port froze the filesystems; the handler then hangs forever ("handler stuck"). */
  quiesceHangAfterFreeze: 'quiesce.hang-after-freeze',
} as const;

/** A podd failpoint name. */
export type PoddFailpoint = (typeof FAILPOINTS)[keyof typeof FAILPOINTS];

/** poddFailpoints returns a fresh, unset Failpoints of podd (set() reads the env). */
export function poddFailpoints(): Failpoints<PoddFailpoint> {
  return new Failpoints<PoddFailpoint>({
    service: 'podd',
    names: Object.values(FAILPOINTS),
    defaultAction: 'hang',
    hangable: [FAILPOINTS.quiesceHangAfterFreeze],
  });
}

/** The env var that enables failpoints: SANDNODE_PODD_FAILPOINTS. */
export const FAILPOINTS_ENV = poddFailpoints().env;
