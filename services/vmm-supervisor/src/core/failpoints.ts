/**
 * The vmm-supervisor's named failpoints for fault-injection tests (after containerd's
 * integration/failpoint), on the shared {@link Failpoints} parser: env
 * `SANDNODE_VMM_SUPERVISOR_FAILPOINTS` holds a comma-separated list of `name[=action]`; a bare
 * name means `kill` (the process SIGKILLs itself there, as a crash would); `error` and `off`
 * work too. main.ts reads the env once at start, and an unknown name or action fails the
 * start naming it. Never set in production.
 */
import { Failpoints } from '@sandnode/shared';

/** Failpoint names this release knows. */
export const FAILPOINTS = {
  /** runc driver: the VM's mounts are up, the container is not started. */
  createAfterMounts: 'runc.create.after-mounts',
  /** network: UpdateVmNetwork's new policy is in the slot table, the nft change not applied yet. */
  networkUpdateAfterStore: 'network.update.after-store',
  /** network: a new slot is half made (its netns is bound; netlink path: with the veth, no host address; spawn path: no veth yet). */
  networkSlotHalfMade: 'network.slot.half-made',
} as const;

/** A vmm-supervisor failpoint name. */
export type VmmFailpoint = (typeof FAILPOINTS)[keyof typeof FAILPOINTS];

/** The supervisor's failpoints; unset until main.ts calls `failpoints.set()`. */
export const failpoints = new Failpoints<VmmFailpoint>({ service: 'vmm-supervisor', names: Object.values(FAILPOINTS), defaultAction: 'kill' });

/** The env var that enables failpoints: SANDNODE_VMM_SUPERVISOR_FAILPOINTS. */
export const FAILPOINTS_ENV = failpoints.env;
