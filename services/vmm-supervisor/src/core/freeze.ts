/**
 * Bounded filesystem freeze of one VM (the host side of podd's Quiesce/Thaw): the window
 * arithmetic, the token rules and the persisted record. No host access and no proto imports:
 * `drivers/freeze-port.ts` does the FIFREEZE/FITHAW (in-process ioctls; Linux
 * Documentation/filesystems/vfs.rst, freeze_fs/unfreeze_fs) and the watchdog.
 */
import { randomBytes } from 'node:crypto';
import { FailedPreconditionError, InvalidArgumentError } from '@sandnode/shared';

export { clampFreezeMs, DEFAULT_FREEZE_MS, MAX_FREEZE_MS, MIN_FREEZE_MS } from '@sandnode/shared';

/** The record schema of freeze-state.json this release writes. */
export const FREEZE_RECORD_SCHEMA = 1;

/** newFreezeToken returns a fresh, unguessable freeze token (32 lowercase hex digits). */
export function newFreezeToken(): string {
  return randomBytes(16).toString('hex');
}

/** FreezeEnd says what ended a freeze: `caller` (ThawFilesystems) or `watchdog` (the window ran out). */
export type FreezeEnd = 'caller' | 'watchdog';

/** FrozenMount is one host filesystem of the VM that a freeze holds. */
export interface FrozenMount {
  /** Host mount point, e.g. `<vmDir>/upper-dev`. */
  host: string;
  /** What the VM calls it: "/" (the rootfs upper) or "/workspace". */
  guest: string;
}

/**
 * FreezeRecord is the persisted state of a VM's current or latest freeze
 * (`<vmDir>/freeze-state.json`, written atomically on the run dir, never on a frozen fs).
 */
export interface FreezeRecord {
  /** See {@link FREEZE_RECORD_SCHEMA}. */
  schema: number;
  /** The freeze's token. */
  token: string;
  /** Mounts in freeze order (thawed in reverse). */
  mounts: FrozenMount[];
  /** The window after clamping, ms. */
  maxFreezeMs: number;
  /** Wall clock (Unix epoch ms) just before the watchdog was started and the first FIFREEZE began. */
  startedAtMs: number;
  /** startedAtMs + maxFreezeMs: when the watchdog thaws (Unix epoch ms; it counts on CLOCK_MONOTONIC). */
  deadlineMs: number;
  /** Host pid of the watchdog (leader of its own session and process group). */
  watchdogPid: number;
  /** Start ticks of watchdogPid (/proc/<pid>/stat field 22), to tell a reused pid apart. */
  watchdogStartTicks: number;
  /** File the watchdog writes its thaw time (Unix epoch ms) into once it has thawed. */
  watchdogEndFile: string;
  /**
   * "node": the node's long-lived watchdog (its pid above; the freeze's deadline file is taken
   * back at a thaw); absent in records of older releases: a watchdog process group of this
   * freeze's own, killed at a thaw.
   */
  watchdog?: 'node';
  /** Time the FIFREEZE calls took, ms. */
  freezeMs: number;
  /** Wall clock (Unix epoch ms) when the first FIFREEZE began; absent in older records (then startedAtMs). */
  frozenAtMs?: number;
  /** How it ended; undefined while it holds (or until the end is noticed). */
  endedBy?: FreezeEnd;
  /** First FIFREEZE start to the end of the last FITHAW, ms; set with endedBy. */
  frozenMs?: number;
}

/** FreezeStatus answers GetFilesystemFreeze. */
export interface FreezeStatus {
  frozen: boolean;
  /** Token of the current or latest freeze; "" when there never was one. */
  token: string;
  maxFreezeMs: number;
  /** ms until the watchdog thaws; 0 when not frozen. */
  remainingMs: number;
  /** How the latest freeze ended; undefined while it holds or when there was none. */
  endedBy: FreezeEnd | undefined;
  /** The latest ended freeze's window, ms (0 while it holds). */
  frozenMs: number;
  /** Wall clock (Unix epoch ms) when its first FIFREEZE began; 0 when there was none. */
  frozenAtMs: number;
}

/**
 * checkThawToken validates a ThawFilesystems token against the latest record: empty ->
 * InvalidArgumentError (`freeze_token`); no record or another token -> FailedPreconditionError
 * (a stale token never thaws a later freeze). Returns the record when the token names it.
 */
export function checkThawToken(token: string, latest: FreezeRecord | undefined): FreezeRecord {
  if (!token) throw new InvalidArgumentError('freeze_token: required');
  if (!latest) throw new FailedPreconditionError('freeze_token: this VM has no freeze');
  if (latest.token !== token) throw new FailedPreconditionError('freeze_token: not the latest freeze of this VM');
  return latest;
}

/** statusOf describes rec at nowMs (wall clock ms). */
export function statusOf(rec: FreezeRecord | undefined, nowMs: number): FreezeStatus {
  if (!rec) return { frozen: false, token: '', maxFreezeMs: 0, remainingMs: 0, endedBy: undefined, frozenMs: 0, frozenAtMs: 0 };
  const frozen = rec.endedBy === undefined;
  return {
    frozen,
    token: rec.token,
    maxFreezeMs: rec.maxFreezeMs,
    remainingMs: frozen ? Math.max(0, Math.ceil(rec.deadlineMs - nowMs)) : 0,
    endedBy: rec.endedBy,
    frozenMs: frozen ? 0 : (rec.frozenMs ?? 0),
    frozenAtMs: rec.frozenAtMs ?? rec.startedAtMs,
  };
}

/**
 * windowMs is the frozen window from the first FIFREEZE (rec.frozenAtMs; startedAtMs, which is
 * earlier, in older records) to endMs (Unix epoch ms), never negative, whole ms.
 */
export function windowMs(rec: FreezeRecord, endMs: number): number {
  return Math.max(0, Math.round(endMs - (rec.frozenAtMs ?? rec.startedAtMs)));
}

/** MACHINE_ID_RE: machine-id(5), 32 lowercase hex digits. */
export const MACHINE_ID_RE = /^[0-9a-f]{32}$/;

/** validateMachineId throws InvalidArgumentError (`spec.machine_id`) unless id is empty or 32 lowercase hex digits. */
export function validateMachineId(id: string | undefined): void {
  if (id === undefined || id === '') return;
  if (!MACHINE_ID_RE.test(id)) throw new InvalidArgumentError(`spec.machine_id: ${JSON.stringify(id)} is not 32 lowercase hex digits (machine-id(5))`);
}
