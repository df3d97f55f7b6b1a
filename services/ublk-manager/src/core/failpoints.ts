/**
 * Failpoints: named places where a test makes the ublk-manager fail on purpose (after
 * containerd's `integration/failpoint`), on the shared {@link Failpoints} parser. They are set
 * with env `SANDNODE_UBLK_MANAGER_FAILPOINTS` (the ublk-manager's own variable: a server
 * failpoint in the same environment is not read here) as a comma-separated list of
 * `name=action`, e.g. `ublk.recover=error,ublk.release.after=kill`; a bare name means `error`:
 *
 * - `error`: the call throws InternalError("failpoint <name>") at that place;
 * - `kill`: the process sends itself SIGKILL at that place (a crash at exactly that step);
 * - `pause` (only the `ublk.handover-all.*` ones, which run where waiting is safe): the call
 *   waits at that place until the process gets SIGUSR2 (a test does something in between,
 *   e.g. deletes a device on the old slot, then sends the signal);
 * - `off`: nothing.
 *
 * Unknown names or actions fail the start ({@link parseFailpoints} throws naming them).
 */
import { Failpoints, type FailpointAction } from '@sandnode/shared';

export type { FailpointAction };

/** The failpoints of the ublk-manager, in handover order, then CloneDevice's. */
export const FAILPOINT_NAMES = [
  /** Old slot: the device is quiesced, before QuiesceDevice answers. */
  'ublk.quiesce.after',
  /** Old slot: the `released` row is persisted, before ReleaseDevice answers. */
  'ublk.release.after',
  /** New slot (HandoverAll): ReleaseDevice answered, before RecoverDevice starts. */
  'ublk.handover.after-release',
  /** New slot: RecoverDevice starts, before anything changed. */
  'ublk.recover',
  /** New slot: the recovered row is persisted, before RecoverDevice answers. */
  'ublk.recover.before-response',
  /** New slot (HandoverAll): the old slot's devices are listed, before the first moves. */
  'ublk.handover-all.after-list',
  /** New slot (HandoverAll): the first device moved (recover persisted), before the next one. */
  'ublk.handover-all.after-first-move',
  /** CloneDevice: the copy is written and fsynced under its temp name, before the rename (row still `creating`). */
  'ublk.clone.after-copy',
  /** CloneDevice: the clone's row is persisted `ready` (with cloned_from), before the device is attached. */
  'ublk.clone.after-persist',
] as const;

/** A failpoint name. */
export type FailpointName = (typeof FAILPOINT_NAMES)[number];

/** The failpoints that accept `pause` (they are reached through {@link failpointAsync}). */
export const PAUSABLE_FAILPOINTS: readonly FailpointName[] = ['ublk.handover-all.after-list', 'ublk.handover-all.after-first-move'];

/** The ublk-manager's failpoints (shared parser; env SANDNODE_UBLK_MANAGER_FAILPOINTS). */
export const failpoints = new Failpoints<FailpointName>({ service: 'ublk-manager', names: FAILPOINT_NAMES, defaultAction: 'error', pausable: PAUSABLE_FAILPOINTS });

/** Env var that sets failpoints at start: `SANDNODE_UBLK_MANAGER_FAILPOINTS`. */
export const FAILPOINTS_ENV = failpoints.env;

/** parseFailpoints reads a `name=action,...` list; throws Error naming a bad entry. */
export function parseFailpoints(spec: string | undefined): Map<FailpointName, FailpointAction> {
  return failpoints.parse(spec);
}

/** setFailpoints replaces the active failpoints (main.ts at start, from FAILPOINTS_ENV; unit tests). */
export function setFailpoints(spec: string | undefined): void {
  failpoints.set(spec ?? '');
}

/** activeFailpoints lists the active ones as `name=action` (for the start log). */
export function activeFailpoints(): string[] {
  return failpoints.list();
}

/** failpoint runs the `error` / `kill` action set for name, if any. */
export function failpoint(name: FailpointName): void {
  failpoints.hit(name);
}

/**
 * failpointAsync runs the action set for name, if any; `pause` waits for SIGUSR2, calling
 * onPause first (the caller logs that it waits).
 */
export async function failpointAsync(name: FailpointName, onPause?: () => void): Promise<void> {
  await failpoints.hitAsync(name, onPause);
}
