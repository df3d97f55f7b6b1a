/**
 * HandoverAll (new slot): moves devices from the old slot to this one, one at a time:
 * Quiesce(old) -> Release(old) -> Recover(self), the release sent right behind the quiesce
 * (sent again if it got there first); any failure after the release runs
 * AbortHandover(old) so the old slot takes the device back. A device the old slot no longer
 * has when its turn comes (deleted meanwhile: Quiesce NOT_FOUND) is skipped, not a failure.
 * After the listed devices, the old slot is listed again and devices that appeared meanwhile
 * are moved too (at most MAX_HANDOVER_PASSES passes). Every step is persisted by the
 * slot that does it before it answers, so a kill -9 of either process at any step converges
 * at the next start (see DeviceManager.converge and the README).
 *
 * No proto imports: the old slot is reached through the {@link OldSlot} port (rpc layer).
 */
import { performance } from 'node:perf_hooks';
import { FailedPreconditionError, NotFoundError, UnavailableError, type Logger } from '@sandnode/shared';
import type { DeviceManager } from './device-manager';
import { failpoint, failpointAsync } from './failpoints';
import type { Device } from './types';

/**
 * The old slot, as HandoverAll calls it (each call bounded by timeoutMs, in ms; signal, when
 * given, cancels the call: HandoverAll passes its caller's signal to the steps that move a
 * device, never to resume/abort, which give a device back).
 */
export interface OldSlot {
  /**
   * list returns the devices the old slot owns; it tells the old slot that this slot takes its
   * devices over (the old slot is retiring from then on: CreateDevice there is UNAVAILABLE).
   */
  list(timeoutMs: number, signal?: AbortSignal): Promise<Device[]>;
  /** quiesce asks the old slot to quiesce the device for holdMs; NotFoundError when it has no such device. */
  quiesce(deviceId: string, holdMs: number, timeoutMs: number, signal?: AbortSignal): Promise<void>;
  /** resume ends a quiesce that did not lead to a release. */
  resume(deviceId: string, timeoutMs: number): Promise<void>;
  /**
   * release gives the device up; returns it and the handover token. FailedPreconditionError
   * when the old slot refused it without changing anything (e.g. the device is not quiesced).
   */
  release(deviceId: string, timeoutMs: number, signal?: AbortSignal): Promise<{ device: Device; token: string }>;
  /** abort gives a released device back to the old slot. */
  abort(deviceId: string, token: string, timeoutMs: number): Promise<void>;
}

/** Outcome of one device. */
export type HandoverOutcome = 'moved' | 'aborted' | 'failed';

/** One device's result. */
export interface DeviceHandoverResult {
  deviceId: string;
  result: HandoverOutcome;
  /** Quiesce start to recover end (moved) or to the abort (aborted), in ms. */
  stallMs: number;
  /** Why it was not moved; '' when moved. */
  error: string;
}

/** How devices move: see HandoverAllResponse.mode in the proto. */
export type HandoverMode = 'per-device' | 'single-stall' | 'ownership-only';

/** The whole handover's result. */
export interface HandoverReport {
  devices: DeviceHandoverResult[];
  mode: HandoverMode;
  /** Whole duration, ms. */
  totalMs: number;
}

/** Default per-device bound when the request says 0, in ms. */
export const DEFAULT_PER_DEVICE_TIMEOUT_MS = 5000;
/**
 * Passes over the old slot's list (the first, then one per "devices appeared meanwhile").
 * A device still appearing after the last pass is reported FAILED (the old slot keeps it).
 */
export const MAX_HANDOVER_PASSES = 4;

function msg(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/**
 * handoverMode: loop -> "ownership-only" (the kernel serves I/O, only control moves); ublk with
 * QUIESCE -> "per-device"; ublk without QUIESCE -> "single-stall".
 */
export function handoverMode(manager: DeviceManager): HandoverMode {
  const c = manager.capabilities();
  if (c.driver === 'loop') return 'ownership-only';
  return c.capabilities.includes('quiesce') ? 'per-device' : 'single-stall';
}

/**
 * handoverAll moves deviceIds (empty: every device the old slot lists, then those that
 * appeared there meanwhile) from old to manager. Never throws for one device: each gets MOVED,
 * ABORTED (the old slot kept or took back the device) or FAILED (it could not be given back,
 * or kept appearing; error says why); a device deleted on the old slot before its turn is
 * left out of the report (logged). observe gets each moved device's stall in seconds.
 */
export async function handoverAll(opts: {
  manager: DeviceManager;
  old: OldSlot;
  deviceIds: string[];
  perDeviceTimeoutMs: number;
  log: Logger;
  /** The caller's cancellation (the RPC's signal): no further device starts to move once it fires. */
  signal?: AbortSignal;
  observe?: (stallSeconds: number, mode: HandoverMode) => void;
}): Promise<HandoverReport> {
  const { manager, old, log, signal } = opts;
  const t0 = performance.now();
  const bound = opts.perDeviceTimeoutMs > 0 ? opts.perDeviceTimeoutMs : DEFAULT_PER_DEVICE_TIMEOUT_MS;
  const mode = handoverMode(manager);
  const caps = manager.capabilities().capabilities;
  const listed = (await old.list(bound, signal)).map((d) => d.deviceId);
  await failpointAsync('ublk.handover-all.after-list', () => log.warn({ failpoint: 'ublk.handover-all.after-list' }, 'failpoint ublk.handover-all.after-list paused until SIGUSR2'));
  const explicit = opts.deviceIds.length > 0;
  const results: DeviceHandoverResult[] = [];
  const attempted = new Set<string>();
  let firstMoveDone = false;

  const moveOne = async (id: string): Promise<void> => {
    const dlog = log.child({ device_id: id });
    if (mode !== 'ownership-only' && !caps.includes('user-recovery')) {
      results.push({ deviceId: id, result: 'failed', stallMs: 0, error: 'FAILED_PRECONDITION: the driver lacks USER_RECOVERY; pause the sandbox, move the device, resume it' });
      return;
    }
    const start = performance.now();
    const deadline = start + bound;
    const left = () => Math.max(1, Math.round(deadline - performance.now()));
    let released: { device: Device; token: string } | undefined;
    let quiescedAt: number;
    try {
      // The release goes out right behind the quiesce, without waiting for its answer: one round
      // trip less in the stall window. The old slot serves the two in order (the device's lock);
      // a release that got there first changed nothing (FAILED_PRECONDITION: not quiesced) and
      // is sent again once the quiesce answered.
      const quiesce = old.quiesce(id, bound, left(), signal);
      const early = old.release(id, left(), signal).then(
        (r) => ({ r }),
        (err: unknown) => ({ err }),
      );
      try {
        await quiesce;
        quiescedAt = performance.now();
      } catch (err) {
        const e = await early;
        // A quiesce whose answer was lost but that took effect: the release got the device.
        if ('r' in e) released = e.r;
        if (err instanceof NotFoundError && !released) {
          // Deleted on the old slot since it was listed: it is simply not part of the move.
          dlog.info({ err }, 'handover: the old slot no longer has this device (deleted meanwhile); skipped');
          return;
        }
        throw err;
      }
      const e = await early;
      if ('r' in e) released = e.r;
      else if (e.err instanceof FailedPreconditionError) released = await old.release(id, left(), signal);
      else throw e.err;
      const releasedAt = performance.now();
      failpoint('ublk.handover.after-release');
      await manager.recover({ deviceId: id, path: released.device.path, backingFile: released.device.backingFile }, released.token);
      const stallMs = performance.now() - start;
      opts.observe?.(stallMs / 1000, mode);
      results.push({ deviceId: id, result: 'moved', stallMs, error: '' });
      dlog.info({ stall_ms: stallMs, quiesce_ms: quiescedAt - start, release_ms: releasedAt - quiescedAt, recover_ms: performance.now() - releasedAt }, 'handover: device moved');
    } catch (err) {
      const why = msg(err);
      if (!released) {
        await old.resume(id, bound).catch((e: unknown) => dlog.warn({ err: e }, 'handover: resume after a failed quiesce/release failed (the quiesce times out by itself)'));
        results.push({ deviceId: id, result: 'aborted', stallMs: performance.now() - start, error: why });
        dlog.warn({ err }, 'handover: device not released; the old slot keeps it');
        return;
      }
      try {
        await old.abort(id, released.token, bound);
        results.push({ deviceId: id, result: 'aborted', stallMs: performance.now() - start, error: why });
        dlog.warn({ err }, 'handover: recover failed; the old slot took the device back');
      } catch (abortErr) {
        results.push({ deviceId: id, result: 'failed', stallMs: performance.now() - start, error: `${why}; AbortHandover failed too: ${msg(abortErr)} (the next start of either slot converges)` });
        dlog.error({ err }, 'handover: recover failed');
        dlog.error({ err: abortErr }, 'handover: AbortHandover after the failed recover failed too (the next start of either slot converges)');
      }
    }
  };

  let ids = explicit ? opts.deviceIds : listed;
  for (let pass = 1; ; pass++) {
    for (const id of ids) {
      if (signal?.aborted) break;
      attempted.add(id);
      if (!listed.includes(id)) {
        results.push({ deviceId: id, result: 'failed', stallMs: 0, error: `the old slot does not own device_id "${id}"` });
        continue;
      }
      await moveOne(id);
      if (!firstMoveDone && results.at(-1)?.deviceId === id && results.at(-1)?.result === 'moved') {
        firstMoveDone = true;
        await failpointAsync('ublk.handover-all.after-first-move', () =>
          log.warn({ failpoint: 'ublk.handover-all.after-first-move' }, 'failpoint ublk.handover-all.after-first-move paused until SIGUSR2'),
        );
      }
    }
    if (explicit || signal?.aborted) {
      if (signal?.aborted) log.warn({ moved: results.filter((r) => r.result === 'moved').length }, 'handover: the caller cancelled; no further device is moved');
      break;
    }
    // Final pass: devices created on the old slot while the list above was being moved.
    let again: string[];
    try {
      again = (await old.list(bound, signal)).map((d) => d.deviceId).filter((id) => !attempted.has(id));
    } catch (err) {
      log.error({ err, pass }, 'handover: listing the old slot again failed');
      throw new UnavailableError(
        `listing the old slot again after pass ${pass} failed (${results.filter((r) => r.result === 'moved').length} devices moved so far; a new HandoverAll moves the rest): ${msg(err)}`,
      );
    }
    if (again.length === 0) break;
    if (pass >= MAX_HANDOVER_PASSES) {
      for (const id of again) {
        results.push({ deviceId: id, result: 'failed', stallMs: 0, error: `device_id "${id}" appeared on the old slot after ${pass} passes; the old slot keeps it` });
      }
      log.error({ device_ids: again, passes: pass }, 'handover: devices keep appearing on the old slot; giving up on them');
      break;
    }
    log.info({ device_ids: again, pass: pass + 1 }, 'handover: devices appeared on the old slot during the move; moving them too');
    listed.push(...again);
    ids = again;
  }
  return { devices: results, mode, totalMs: performance.now() - t0 };
}
