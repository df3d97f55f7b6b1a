/**
 * The server's named failpoints for crash tests (containerd's `integration/failpoint` idea),
 * on the shared {@link Failpoints} parser: env `SANDNODE_SERVER_FAILPOINTS` lists
 * `name[=action]` pairs separated by commas (action `kill`, the default, SIGKILLs this process
 * at that point; `error` throws INTERNAL there; `pause` (PAUSABLE_FAILPOINTS) waits there for
 * SIGUSR2; `off` does nothing). main.ts parses it once at
 * start (`setServerFailpoints`): an unknown name or action fails the start naming it. Unset
 * in production: every check is one map lookup. Each service has its own variable, so a server
 * failpoint in `sandnode up`'s environment does not reach the ublk-manager.
 */
import { ConfigError, Failpoints } from '@sandnode/shared';

/** The failpoints of the server handover, in the order they are reached. */
export const HANDOVER_FAILPOINTS = [
  'handover.at-prepare', // old: PrepareHandover asked (the standby's preflight), nothing held yet
  'handover.after-hold', // old: lifecycle calls held, in-flight ones done
  'handover.after-send', // old: listeners sent to the standby
  'handover.after-release', // old: lease released, before answering
  'takeover.after-fds', // new: listeners received, lease not taken
  'takeover.after-lease', // new: lease taken (epoch+1), before adoption
  'takeover.after-serve', // new: serving (adopted, handlers attached and warmed up, accepting beside the old server), before FinishHandover
] as const;

/** The failpoints that accept `pause` (reached through {@link failpointAsync}; SIGUSR2 goes on). */
export const PAUSABLE_FAILPOINTS: readonly ServerFailpoint[] = ['takeover.after-serve'];

/** The failpoints of ForkSandbox and ResetRootfs (crash tests of the server). */
export const FORK_FAILPOINTS = [
  'fork.after-hold', // the parent is frozen (podd Quiesce) or paused, before the clones
  'fork.after-clone', // both clones made, before the parent is released
  'reset.after-stop', // ResetRootfs: fresh upper recorded, VM stopped, before the switch
] as const;

/** The failpoints of UpdateSandboxNetwork (crash tests of the server). */
export const NETWORK_FAILPOINTS = [
  'network.after-vm-update', // the supervisor applied the new policy, the record is not written yet
] as const;

/** Every failpoint name of the server. */
export type ServerFailpoint = (typeof HANDOVER_FAILPOINTS)[number] | (typeof FORK_FAILPOINTS)[number] | (typeof NETWORK_FAILPOINTS)[number];

/** The server's failpoints (env `SANDNODE_SERVER_FAILPOINTS`). */
export const serverFailpoints = new Failpoints<ServerFailpoint>({ service: 'server', names: [...HANDOVER_FAILPOINTS, ...FORK_FAILPOINTS, ...NETWORK_FAILPOINTS], pausable: PAUSABLE_FAILPOINTS });

/** SERVER_FAILPOINTS_ENV is "SANDNODE_SERVER_FAILPOINTS". */
export const SERVER_FAILPOINTS_ENV = serverFailpoints.env;

/**
 * setServerFailpoints parses list (default: env SANDNODE_SERVER_FAILPOINTS) and makes it the
 * active set; throws ConfigError naming an unknown name or action (main.ts: exit 2).
 */
export function setServerFailpoints(list: string | undefined = process.env[SERVER_FAILPOINTS_ENV]): string[] {
  try {
    serverFailpoints.set(list);
  } catch (err) {
    throw new ConfigError((err as Error).message);
  }
  return serverFailpoints.list();
}

/** failpointAsync runs any action set for name; `pause` (PAUSABLE_FAILPOINTS only) waits for SIGUSR2. */
export async function failpointAsync(name: ServerFailpoint): Promise<void> {
  await serverFailpoints.hitAsync(name);
}

/** failpoint runs the action set for name, if any (`kill`: SIGKILL now; `error`: throws InternalError). */
export function failpoint(name: ServerFailpoint): void {
  serverFailpoints.hit(name);
}
