/**
 * Named failpoints for fault-injection tests (after containerd's integration/failpoint).
 * `SANDNODE_VMM_SUPERVISOR_FAILPOINTS` holds a comma-separated list of names; when code
 * reaches an enabled failpoint the process kills itself with SIGKILL, as a crash would.
 * Never set in production.
 */

/** The env var that enables failpoints. */
export const FAILPOINTS_ENV = 'SANDNODE_VMM_SUPERVISOR_FAILPOINTS';

/** Failpoint names this release knows. */
export const FAILPOINTS = {
  /** runc driver: the VM's mounts are up, the container is not started. */
  createAfterMounts: 'runc.create.after-mounts',
} as const;

/** failpoint SIGKILLs this process when name is enabled. */
export function failpoint(name: string): void {
  const enabled = process.env[FAILPOINTS_ENV];
  if (enabled && enabled.split(',').includes(name)) process.kill(process.pid, 'SIGKILL');
}
