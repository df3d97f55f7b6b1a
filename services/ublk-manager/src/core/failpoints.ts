/**
 * Failpoints: named places where a test makes the process fail on purpose (after containerd's
 * `integration/failpoint`). They are set with env `SANDNODE_FAILPOINTS` as a comma-separated
 * list of `name=action`, e.g. `ublk.recover=error,ublk.release.after=kill`:
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
import { InternalError } from '@sandnode/shared';

/** Env var that sets failpoints at start. */
export const FAILPOINTS_ENV = 'SANDNODE_FAILPOINTS';

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

/** The failpoints that accept `pause` (they are reached through {@link failpointAsync}). */
export const PAUSABLE_FAILPOINTS: readonly FailpointName[] = ['ublk.handover-all.after-list', 'ublk.handover-all.after-first-move'];

/** A failpoint name. */
export type FailpointName = (typeof FAILPOINT_NAMES)[number];
/** What a failpoint does. */
export type FailpointAction = 'error' | 'kill' | 'pause' | 'off';

const ACTIONS: readonly FailpointAction[] = ['error', 'kill', 'pause', 'off'];

/** parseFailpoints reads a `name=action,...` list; throws Error naming a bad entry. */
export function parseFailpoints(spec: string | undefined): Map<FailpointName, FailpointAction> {
  const out = new Map<FailpointName, FailpointAction>();
  for (const part of (spec ?? '').split(',').map((p) => p.trim()).filter(Boolean)) {
    const eq = part.lastIndexOf('=');
    const name = eq < 0 ? part : part.slice(0, eq);
    const action = eq < 0 ? 'error' : part.slice(eq + 1);
    if (!(FAILPOINT_NAMES as readonly string[]).includes(name)) throw new Error(`${FAILPOINTS_ENV}: unknown failpoint "${name}" (known: ${FAILPOINT_NAMES.join(', ')})`);
    if (!(ACTIONS as readonly string[]).includes(action)) throw new Error(`${FAILPOINTS_ENV}: failpoint "${name}": unknown action "${action}" (error, kill, pause, off)`);
    if (action === 'pause' && !PAUSABLE_FAILPOINTS.includes(name as FailpointName)) {
      throw new Error(`${FAILPOINTS_ENV}: failpoint "${name}": pause is only for ${PAUSABLE_FAILPOINTS.join(', ')}`);
    }
    out.set(name as FailpointName, action as FailpointAction);
  }
  return out;
}

let active = new Map<FailpointName, FailpointAction>();

/** setFailpoints replaces the active failpoints (main.ts at start; unit tests). */
export function setFailpoints(spec: string | undefined): void {
  active = parseFailpoints(spec);
}

/** activeFailpoints lists the active ones as `name=action` (for the start log). */
export function activeFailpoints(): string[] {
  return [...active].filter(([, a]) => a !== 'off').map(([n, a]) => `${n}=${a}`);
}

/** failpoint runs the action set for name, if any. */
export function failpoint(name: FailpointName): void {
  const action = active.get(name);
  if (action === 'error') throw new InternalError(`failpoint ${name}`);
  if (action === 'kill') {
    process.kill(process.pid, 'SIGKILL');
    // SIGKILL to ourselves is delivered before the syscall returns; never reached.
    throw new InternalError(`failpoint ${name}: SIGKILL did not stop the process`);
  }
}

/**
 * failpointAsync runs the action set for name, if any; `pause` waits for SIGUSR2, calling
 * onPause first (the caller logs that it waits).
 */
export async function failpointAsync(name: FailpointName, onPause?: () => void): Promise<void> {
  if (active.get(name) !== 'pause') return failpoint(name);
  const resumed = new Promise<void>((resolve) => process.once('SIGUSR2', () => resolve()));
  onPause?.();
  await resumed;
}
