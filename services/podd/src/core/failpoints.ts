/**
 * Named failpoints for fault-injection tests (after containerd's integration/failpoint).
 * `SANDNODE_PODD_FAILPOINTS` holds a comma-separated list of names. Never set in production.
 */

/** The env var that enables failpoints. */
export const FAILPOINTS_ENV = 'SANDNODE_PODD_FAILPOINTS';

/** Failpoint names this release knows. */
export const FAILPOINTS = {
  /** Quiesce: the freeze port froze the filesystems; the handler then hangs forever ("handler stuck"). */
  quiesceHangAfterFreeze: 'quiesce.hang-after-freeze',
} as const;

/** failpointEnabled says whether name is in SANDNODE_PODD_FAILPOINTS (of env, default process.env). */
export function failpointEnabled(name: string, env: NodeJS.ProcessEnv = process.env): boolean {
  const enabled = env[FAILPOINTS_ENV];
  return !!enabled && enabled.split(',').map((s) => s.trim()).includes(name);
}

/** hangForever returns a promise that never settles and ignores cancellation (a stuck handler). */
export function hangForever(): Promise<never> {
  // The server keeps the process alive; the call itself just never ends.
  return new Promise<never>(() => undefined);
}
