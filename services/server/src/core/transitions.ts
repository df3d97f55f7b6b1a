/**
 * The transition table of the server's runtime records: the one place that says which state a
 * sandbox may move to from which. Create, pause/resume, delete, drain, fork, reset, the reaper
 * and adoption all move a record with {@link transition}; nothing else assigns `rec.state`.
 *
 *                 pause                  drain, reset
 *   RUNNING ---------------> PAUSED ------------------> DRAINED
 *    ^  ^  |  <--- resume ---                               |
 *    |  |  +------------- drain, reset -------------------> |
 *    |  +---------- resume (cold start), reset's boot ------+
 *    +-- boot -- CREATING <-- (new)
 *
 *   RUNNING, PAUSED --VM gone / adoption failed--> ERROR
 *   ERROR --its VM taken for gone on a failed /proc read runs (reaper)--> RUNNING, PAUSED
 *   every state --teardown (DeleteSandbox, reaper, a failed create or fork)--> DELETING
 *
 * The table itself, one line per from-state (a unit test parses these lines and compares
 * them with TRANSITIONS, so the picture and the code cannot drift apart):
 *
 *   (new)    --> CREATING
 *   CREATING --> RUNNING (boot: podd answered) | DELETING (a failed create or fork; adoption)
 *   RUNNING  --> PAUSED (pause; adoption follows the VM) | DRAINED (drain; reset) | ERROR (VM gone; adoption failed) | DELETING
 *   PAUSED   --> RUNNING (resume; adoption follows the VM) | DRAINED (drain; reset) | ERROR (VM gone; adoption failed) | DELETING
 *   DRAINED  --> RUNNING (resume: cold start; reset's boot) | DELETING
 *   ERROR    --> RUNNING (the reaper: a liveness error whose VM runs) | PAUSED (the same, its VM paused) | DELETING
 *   DELETING --> DELETING (a teardown retried by the reaper or adoption)
 *   UNKNOWN  --> DELETING (DeleteSandbox only)
 *
 * UNKNOWN is a state written by a newer server that this one cannot read: nothing moves a
 * record into it, and the only move out is DeleteSandbox (an operator's explicit request; the
 * reaper, drain and adoption skip such records). A state string that is not in the table at
 * all is never moved.
 *
 * Two kinds of refusal: {@link requireState} checks a caller's request before anything is done
 * (FAILED_PRECONDITION: the sandbox is in the wrong state for it); {@link transition} refuses a
 * move the table does not allow with an {@link IllegalTransitionError} (INTERNAL: the caller's
 * precondition was checked, so a refused move is a bug of this server).
 */
import { FailedPreconditionError, InternalError } from '@sandnode/shared';
import type { SandboxRecord, SandboxState } from './types';

/** The state a new record starts in (the "(new)" row). */
export const INITIAL_STATE: SandboxState = 'CREATING';

/** TRANSITIONS[from] lists the states a record in `from` may move to. */
export const TRANSITIONS: Readonly<Record<SandboxState, readonly SandboxState[]>> = {
  CREATING: ['RUNNING', 'DELETING'],
  RUNNING: ['PAUSED', 'DRAINED', 'ERROR', 'DELETING'],
  PAUSED: ['RUNNING', 'DRAINED', 'ERROR', 'DELETING'],
  DRAINED: ['RUNNING', 'DELETING'],
  ERROR: ['RUNNING', 'PAUSED', 'DELETING'],
  DELETING: ['DELETING'],
  UNKNOWN: ['DELETING'],
};

/**
 * OPERATION_STATES: the states each caller-facing operation needs of its sandbox (what
 * {@link requireState} checks). An operation that moves the record moves it only along
 * TRANSITIONS (the unit test checks every from-state here against the table).
 */
export const OPERATION_STATES = {
  PauseSandbox: ['RUNNING'],
  ResumeSandbox: ['PAUSED', 'DRAINED'],
  ResetRootfs: ['RUNNING', 'PAUSED'],
  /** the parent: a fork does not move it */
  ForkSandbox: ['RUNNING', 'PAUSED'],
  Drain: ['RUNNING', 'PAUSED'],
  /** a DRAINED sandbox's policy is recorded and applied at its resume */
  UpdateSandboxNetwork: ['RUNNING', 'PAUSED', 'DRAINED'],
  Exec: ['RUNNING'],
  ListProcesses: ['RUNNING'],
  SignalProcess: ['RUNNING'],
  ReadFile: ['RUNNING'],
  WriteFile: ['RUNNING'],
} as const satisfies Record<string, readonly SandboxState[]>;

/** A caller-facing operation named in OPERATION_STATES. */
export type Operation = keyof typeof OPERATION_STATES;

/** The states a live sandbox (a VM that should exist) is in: the reaper and drain look at these. */
export const LIVE_STATES: readonly SandboxState[] = ['RUNNING', 'PAUSED'];

/** IllegalTransitionError: a move the table does not allow was attempted (a bug). Maps to INTERNAL. */
export class IllegalTransitionError extends InternalError {
  constructor(
    readonly sandboxId: string,
    readonly from: string,
    readonly to: string,
  ) {
    super(`sandbox ${sandboxId}: ${from} -> ${to} is not a transition of a runtime record`);
  }
}

/** canMove says whether the table allows from -> to; false for a state not in the table. */
export function canMove(from: string, to: string): boolean {
  if (!Object.prototype.hasOwnProperty.call(TRANSITIONS, from)) return false;
  return (TRANSITIONS[from as SandboxState] as readonly string[]).includes(to);
}

/**
 * transition moves rec from its current state to `to` (in memory; the caller persists it with
 * touch). Throws IllegalTransitionError (INTERNAL) and leaves rec unchanged when the table has
 * no such move.
 */
export function transition(rec: SandboxRecord, to: SandboxState): void {
  if (!canMove(rec.state, to)) throw new IllegalTransitionError(rec.sandboxId, rec.state, to);
  rec.state = to;
}

/**
 * requireState checks a caller's request against the sandbox's state before anything is done:
 * FailedPreconditionError ("sandbox sb-... is PAUSED; Exec needs RUNNING") unless rec.state is
 * one of the operation's states. Returns rec.
 */
export function requireState(rec: SandboxRecord, op: Operation): SandboxRecord {
  const states: readonly SandboxState[] = OPERATION_STATES[op];
  if (!states.includes(rec.state)) {
    throw new FailedPreconditionError(`sandbox ${rec.sandboxId} is ${rec.state}; ${op} needs ${states.join(' or ')}`);
  }
  return rec;
}

/** isLive says whether a record is RUNNING or PAUSED. */
export function isLive(rec: SandboxRecord): boolean {
  return LIVE_STATES.includes(rec.state);
}
