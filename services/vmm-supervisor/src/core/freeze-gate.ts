/**
 * Which freezes a VM's freeze port lets in (issue 10 §3). The port is reachable by everything
 * inside the sandbox, so a freeze is a host action the sandbox may ask for only while the
 * server has armed one for that VM (a fork of it is running: VmService.ArmFreeze). An arm
 * admits one freeze, within its window; it lives in memory only (a supervisor restart drops
 * it: the fork's freeze is then refused and the fork fails with nothing frozen).
 *
 * Skew: a 0.2.0 server never arms. Arming is required only while the server holding the
 * node's lease has shown that it arms: the gate persists the epoch at which a server armed a
 * VM or fenced with `require_freeze_arm` (`<dir>/freeze-arm-epoch`, `{"epoch":N}`), and arming
 * is required while that epoch is the node's current one. A server of a higher epoch (a
 * handover or rollback to 0.2.0) lifts the requirement until it arms in turn. Unarmed freezes
 * let in so are rate limited per VM (a token bucket; RESOURCE_EXHAUSTED with a retry delay).
 */
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { FailedPreconditionError, ResourceExhaustedError, writeFileAtomic } from '@sandnode/shared';

/** Arm window when ArmFreeze says 0, in ms. */
export const DEFAULT_ARM_WINDOW_MS = 30_000;
/** Shortest arm window, in ms. */
export const MIN_ARM_WINDOW_MS = 1000;
/** Longest arm window, in ms. */
export const MAX_ARM_WINDOW_MS = 120_000;
/** Unarmed freezes a VM may make at once before the rate applies (config `freezeRateBurst`). */
export const DEFAULT_FREEZE_RATE_BURST = 10;
/** Unarmed freezes per second a VM gets back (config `freezeRatePerSecond`). */
export const DEFAULT_FREEZE_RATE_PER_SECOND = 1;
/** The file under the supervisor's state dir that holds the arming epoch. */
export const FREEZE_ARM_EPOCH_FILE = 'freeze-arm-epoch';

/** clampArmWindowMs: 0 -> DEFAULT_ARM_WINDOW_MS, then into [MIN_ARM_WINDOW_MS, MAX_ARM_WINDOW_MS]. */
export function clampArmWindowMs(ms: number): number {
  if (!ms) return DEFAULT_ARM_WINDOW_MS;
  return Math.min(MAX_ARM_WINDOW_MS, Math.max(MIN_ARM_WINDOW_MS, Math.round(ms)));
}

/** FreezeRateError: an unarmed freeze beyond the VM's rate. RESOURCE_EXHAUSTED; retry after retryAfterMs. */
export class FreezeRateError extends ResourceExhaustedError {
  constructor(
    vmId: string,
    /** How long the caller should wait before retrying, in ms. */
    readonly retryAfterMs: number,
  ) {
    super(`vm ${vmId}: too many freezes (the freeze port's rate limit); nothing frozen; retry after ${retryAfterMs} ms`);
  }
}

/** How a freeze was let in. */
export type FreezeAdmission = 'armed' | 'unarmed';

/** FreezeGateOptions wire a FreezeGate. */
export interface FreezeGateOptions {
  /** Dir of the arming epoch file (the supervisor's state dir). */
  dir: string;
  /** The node's current epoch (the supervisor's fence). */
  currentEpoch: () => number;
  /** Unarmed freezes at once (default {@link DEFAULT_FREEZE_RATE_BURST}). */
  rateBurst?: number;
  /** Unarmed freezes per second (default {@link DEFAULT_FREEZE_RATE_PER_SECOND}). */
  ratePerSecond?: number;
  /** Monotonic clock, ms (default performance.now). */
  now?: () => number;
}

/** FreezeGate holds the arms of every VM, the arming requirement and the rate of unarmed freezes. */
export class FreezeGate {
  private readonly file: string;
  private readonly currentEpoch: () => number;
  private readonly burst: number;
  private readonly perSecond: number;
  private readonly now: () => number;
  /** vm id -> arm expiry (monotonic ms). */
  private readonly arms = new Map<string, number>();
  /** vm id -> token bucket. */
  private readonly buckets = new Map<string, { tokens: number; atMs: number }>();
  /** The epoch at which a server last showed it arms; undefined: never. */
  private armEpoch: number | undefined;

  constructor(opts: FreezeGateOptions) {
    this.file = path.join(opts.dir, FREEZE_ARM_EPOCH_FILE);
    this.currentEpoch = opts.currentEpoch;
    this.burst = opts.rateBurst ?? DEFAULT_FREEZE_RATE_BURST;
    this.perSecond = opts.ratePerSecond ?? DEFAULT_FREEZE_RATE_PER_SECOND;
    this.now = opts.now ?? (() => performance.now());
    this.armEpoch = readArmEpoch(this.file);
  }

  /** required says whether unarmed freezes are refused now (the lease holder arms). */
  get required(): boolean {
    return this.armEpoch !== undefined && this.armEpoch >= this.currentEpoch();
  }

  /**
   * requireArming records that the server at epoch arms every freeze (FenceEpoch with
   * require_freeze_arm, or its first ArmFreeze); persisted before it returns.
   */
  requireArming(epoch: number): void {
    if (this.armEpoch !== undefined && this.armEpoch >= epoch) return;
    writeFileAtomic(this.file, `${JSON.stringify({ epoch })}\n`);
    this.armEpoch = epoch;
  }

  /**
   * arm lets vmId's port admit one freeze within windowMs (clamped, see
   * {@link clampArmWindowMs}); renews an arm it holds. The caller checked the VM. Returns the
   * window after clamping and the expiry (monotonic ms).
   */
  arm(vmId: string, windowMs: number): { windowMs: number; expiresAtMs: number } {
    this.requireArming(this.currentEpoch());
    const w = clampArmWindowMs(windowMs);
    const expiresAtMs = this.now() + w;
    this.arms.set(vmId, expiresAtMs);
    return { windowMs: w, expiresAtMs };
  }

  /** disarm ends vmId's unused arm; says whether there was one. */
  disarm(vmId: string): boolean {
    const armed = this.isArmed(vmId);
    this.arms.delete(vmId);
    return armed;
  }

  /** isArmed says whether vmId holds an unused, unexpired arm. */
  isArmed(vmId: string): boolean {
    const until = this.arms.get(vmId);
    if (until === undefined) return false;
    if (this.now() < until) return true;
    this.arms.delete(vmId);
    return false;
  }

  /**
   * admit decides a FreezeFilesystems of vmId before any host work: an armed VM's arm is used
   * up ('armed'); otherwise FailedPreconditionError while arming is required, FreezeRateError
   * (RESOURCE_EXHAUSTED, retryAfterMs) beyond the rate, else 'unarmed'.
   */
  admit(vmId: string): FreezeAdmission {
    if (this.isArmed(vmId)) {
      this.arms.delete(vmId);
      return 'armed';
    }
    if (this.required) throw new FailedPreconditionError(`vm ${vmId}: no freeze was armed for this VM (the server arms one only for a fork of it); nothing frozen`);
    this.take(vmId);
    return 'unarmed';
  }

  /** forget drops what the gate holds for vmId (the VM is gone). */
  forget(vmId: string): void {
    this.arms.delete(vmId);
    this.buckets.delete(vmId);
  }

  private take(vmId: string): void {
    const now = this.now();
    const b = this.buckets.get(vmId) ?? { tokens: this.burst, atMs: now };
    b.tokens = Math.min(this.burst, b.tokens + ((now - b.atMs) / 1000) * this.perSecond);
    b.atMs = now;
    this.buckets.set(vmId, b);
    if (b.tokens < 1) throw new FreezeRateError(vmId, Math.max(1, Math.ceil(((1 - b.tokens) / this.perSecond) * 1000)));
    b.tokens -= 1;
  }
}

/** readArmEpoch reads the arming epoch file; undefined when missing or unreadable. */
function readArmEpoch(file: string): number | undefined {
  if (!existsSync(file)) return undefined;
  try {
    const v = (JSON.parse(readFileSync(file, 'utf8')) as { epoch?: unknown }).epoch;
    return typeof v === 'number' && Number.isSafeInteger(v) && v >= 0 ? v : undefined;
  } catch {
    return undefined;
  }
}
