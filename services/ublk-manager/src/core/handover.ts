/**
 * HandoverAll (new slot): moves devices from the old slot to this one, one at a time:
 * Quiesce(old) -> Release(old) -> Recover(self); any failure after the release runs
 * AbortHandover(old) so the old slot takes the device back. Every step is persisted by the
 * slot that does it before it answers, so a kill -9 of either process at any step converges
 * at the next start (see DeviceManager.converge and the README).
 *
 * No proto imports: the old slot is reached through the {@link OldSlot} port (rpc layer).
 */
import { performance } from 'node:perf_hooks';
import type { Logger } from '@sandnode/shared';
import type { DeviceManager } from './device-manager';
import { failpoint } from './failpoints';
import type { Device } from './types';

/** The old slot, as HandoverAll calls it (each call bounded by timeoutMs). */
export interface OldSlot {
  /** list returns the devices the old slot owns. */
  list(timeoutMs: number): Promise<Device[]>;
  /** quiesce asks the old slot to quiesce the device for holdMs. */
  quiesce(deviceId: string, holdMs: number, timeoutMs: number): Promise<void>;
  /** resume ends a quiesce that did not lead to a release. */
  resume(deviceId: string, timeoutMs: number): Promise<void>;
  /** release gives the device up; returns it and the handover token. */
  release(deviceId: string, timeoutMs: number): Promise<{ device: Device; token: string }>;
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
 * handoverAll moves deviceIds (empty: every device the old slot lists) from old to manager.
 * Never throws for one device: each gets MOVED, ABORTED (the old slot kept or took back the
 * device) or FAILED (it could not be given back; error says why). observe gets each moved
 * device's stall in seconds.
 */
export async function handoverAll(opts: {
  manager: DeviceManager;
  old: OldSlot;
  deviceIds: string[];
  perDeviceTimeoutMs: number;
  log: Logger;
  observe?: (stallSeconds: number, mode: HandoverMode) => void;
}): Promise<HandoverReport> {
  const { manager, old, log } = opts;
  const t0 = performance.now();
  const bound = opts.perDeviceTimeoutMs > 0 ? opts.perDeviceTimeoutMs : DEFAULT_PER_DEVICE_TIMEOUT_MS;
  const mode = handoverMode(manager);
  const caps = manager.capabilities().capabilities;
  const listed = (await old.list(bound)).map((d) => d.deviceId);
  const ids = opts.deviceIds.length > 0 ? opts.deviceIds : listed;
  const results: DeviceHandoverResult[] = [];
  for (const id of ids) {
    const dlog = log.child({ device_id: id });
    if (!listed.includes(id)) {
      results.push({ deviceId: id, result: 'failed', stallMs: 0, error: `the old slot does not own device_id "${id}"` });
      continue;
    }
    if (mode !== 'ownership-only' && !caps.includes('user-recovery')) {
      results.push({ deviceId: id, result: 'failed', stallMs: 0, error: 'FAILED_PRECONDITION: the driver lacks USER_RECOVERY; pause the sandbox, move the device, resume it' });
      continue;
    }
    const start = performance.now();
    const deadline = start + bound;
    const left = () => Math.max(1, Math.round(deadline - performance.now()));
    let released: { device: Device; token: string } | undefined;
    try {
      await old.quiesce(id, bound, left());
      released = await old.release(id, left());
      failpoint('ublk.handover.after-release');
      await manager.recover({ deviceId: id, path: released.device.path, backingFile: released.device.backingFile }, released.token);
      const stallMs = performance.now() - start;
      opts.observe?.(stallMs / 1000, mode);
      results.push({ deviceId: id, result: 'moved', stallMs, error: '' });
      dlog.info({ stall_ms: stallMs }, 'handover: device moved');
    } catch (err) {
      const why = msg(err);
      if (!released) {
        await old.resume(id, bound).catch((e: unknown) => dlog.warn({ err: msg(e) }, 'handover: resume after a failed quiesce/release failed (the quiesce times out by itself)'));
        results.push({ deviceId: id, result: 'aborted', stallMs: performance.now() - start, error: why });
        dlog.warn({ err: why }, 'handover: device not released; the old slot keeps it');
        continue;
      }
      try {
        await old.abort(id, released.token, bound);
        results.push({ deviceId: id, result: 'aborted', stallMs: performance.now() - start, error: why });
        dlog.warn({ err: why }, 'handover: recover failed; the old slot took the device back');
      } catch (abortErr) {
        results.push({ deviceId: id, result: 'failed', stallMs: performance.now() - start, error: `${why}; AbortHandover failed too: ${msg(abortErr)} (the next start of either slot converges)` });
        dlog.error({ err: why, abort_err: msg(abortErr) }, 'handover: recover and abort failed');
      }
    }
  }
  return { devices: results, mode, totalMs: performance.now() - t0 };
}
