/**
 * DeviceService handlers: thin. Map the request (convert.ts), call the DeviceManager, map
 * the result. Errors are the typed domain errors of core; the shared server middleware maps
 * them to gRPC status codes (and fences mutating calls by epoch before they get here).
 */
import { statSync } from 'node:fs';
import path from 'node:path';
import {
  FailedPreconditionError,
  InvalidArgumentError,
  metadataEpoch,
  parseEpoch,
  readEpochFile,
  restoreNormalPriority,
  UnavailableError,
  type EpochFence,
  type SandnodeCallContext,
} from '@sandnode/shared';
import type { DeviceServiceImplementation } from '@sandnode/shared/proto/ublk/v1/ublk';
import type { DeviceManager } from '../core/device-manager';
import type { QuarantinedRow } from '../core/store';
import { handoverAll, type HandoverMode } from '../core/handover';
import { capabilitiesToPb, cloneInputFromPb, cloneToPb, createInputFromPb, deviceToPb, handoverToPb } from './convert';
import { connectOldSlot, HANDOVER_TO_METADATA_KEY } from './old-slot-client';

/** Options of the handlers that need more than the manager. */
export interface DeviceServiceOptions {
  /** This slot's own listen address: HandoverAll from it is INVALID_ARGUMENT. */
  selfAddress?: string;
  /** Called with each moved device's stall in seconds (the stall histogram). */
  observeStall?: (stallSeconds: number, mode: HandoverMode) => void;
  /** Called with the copy time of each clone made, in seconds (the clone histogram). */
  observeClone?: (copySeconds: number, reflinked: boolean) => void;
  /** The node's epoch fence (FenceEpoch raises it); without one FenceEpoch is FAILED_PRECONDITION. */
  fence?: EpochFence;
  /** The rows of this slot's table set aside as unreadable (ListDevices reports them); none when absent. */
  quarantined?: () => QuarantinedRow[];
}

/** deviceService implements sandnode.ublk.v1.DeviceService on a DeviceManager. */
/** How many quarantined rows ListDevices reports at most (the newest), and the longest key and reason it sends, in characters. */
export const MAX_LISTED_QUARANTINED = 1000;
const MAX_LISTED_KEY_CHARS = 128;
const MAX_LISTED_REASON_CHARS = 600;

/**
 * listedQuarantine is what ListDevices reports of the quarantine table: the newest
 * MAX_LISTED_QUARANTINED rows, oldest first, keys and reasons cut, so that the list stays far
 * below the 4 MiB message limit (~1000 x 750 bytes) whatever rows were planted.
 */
function listedQuarantine(rows: QuarantinedRow[]): { key: string; reason: string; quarantinedAtMs: number }[] {
  return rows.slice(-MAX_LISTED_QUARANTINED).map((q) => ({ key: q.deviceId.slice(0, MAX_LISTED_KEY_CHARS), reason: q.reason.slice(0, MAX_LISTED_REASON_CHARS), quarantinedAtMs: q.quarantinedAtMs }));
}

export function deviceService(manager: DeviceManager, opts: DeviceServiceOptions = {}): DeviceServiceImplementation<SandnodeCallContext> {
  let handoverRunning = false;
  return {
    /**
     * CloneDevice (feature "ublk.clone"): device_id becomes a copy of source_device_id's image
     * (DeviceManager.clone: cp(1) --reflink / FICLONE ioctl_ficlone(2), sparse; temp name,
     * fsync, rename; row persisted before the answer), attached like a new device. Returns
     * the device, clone_ms (copy time, ms; 0 for an existing clone), reflinked and
     * copied_bytes (the source's allocated bytes). Codes: INVALID_ARGUMENT, NOT_FOUND,
     * ALREADY_EXISTS, FAILED_PRECONDITION, UNAVAILABLE, RESOURCE_EXHAUSTED (see DeviceManager.clone).
     */
    async cloneDevice(req, context) {
      const r = await manager.clone(cloneInputFromPb(req), { signal: context.signal });
      if (r.created) opts.observeClone?.(r.cloneMs / 1000, r.reflinked);
      return cloneToPb(r);
    },
    /**
     * SnapshotDevices (feature "ublk.clone-snapshot.v1"): each item cloned as CloneDevice does
     * but not attached (DeviceManager.snapshot; all or nothing), answered in item order with
     * total_ms (the whole call, ms). Codes: CloneDevice's, INVALID_ARGUMENT for no items, more
     * than 8 or a device_id twice, DEADLINE_EXCEEDED when the caller's deadline passed (undone).
     */
    async snapshotDevices(req, context) {
      const t0 = performance.now();
      const rs = await manager.snapshot(
        req.items.map((i) => cloneInputFromPb({ deviceId: i.deviceId, sourceDeviceId: i.sourceDeviceId, sourceQuiesced: req.sourceQuiesced, readOnly: false })),
        { signal: context.signal },
      );
      for (const r of rs) if (r.created) opts.observeClone?.(r.cloneMs / 1000, r.reflinked);
      return { snapshots: rs.map(cloneToPb), totalMs: Math.ceil(performance.now() - t0) };
    },
    async getCapabilities() {
      return capabilitiesToPb(manager.capabilities());
    },
    async createDevice(req) {
      return { device: deviceToPb(await manager.create(createInputFromPb(req))) };
    },
    async getDevice(req) {
      return { device: deviceToPb(await manager.get(req.deviceId)) };
    },
    async listDevices(_req, context) {
      // HandoverAll of another slot lists this one first: this slot is retiring from now on.
      const to = context.metadata.get(HANDOVER_TO_METADATA_KEY);
      if (to !== undefined) {
        if (!/^(a|b|default)$/.test(to) || to === manager.slot) throw new InvalidArgumentError(`metadata ${HANDOVER_TO_METADATA_KEY}: ${JSON.stringify(to)} is not another slot`);
        manager.beginRetiring(to);
      }
      return {
        devices: (await manager.list()).map(deviceToPb),
        quarantined: listedQuarantine(opts.quarantined?.() ?? []),
        // the fence file is shared by both slots: the other one may have raised it
        fenceEpoch: opts.fence ? Math.max(opts.fence.current, readEpochFile(opts.fence.epochFile)) : 0,
      };
    },
    async deleteDevice(req) {
      return { existed: await manager.delete(req.deviceId) };
    },
    async quiesceDevice(req) {
      const r = await manager.quiesce(req.deviceId, req.timeoutMs);
      return { device: deviceToPb(r.device), quiesceMs: Math.ceil(r.quiesceMs) };
    },
    async resumeDevice(req) {
      return { device: deviceToPb(await manager.resume(req.deviceId)) };
    },
    async releaseDevice(req) {
      const r = await manager.release(req.deviceId);
      return { device: deviceToPb(r.device), handoverToken: r.token };
    },
    async recoverDevice(req) {
      if (!req.device) throw new InvalidArgumentError('device: must be set (ReleaseDeviceResponse.device)');
      const r = await manager.recover({ deviceId: req.device.deviceId, path: req.device.path, backingFile: req.device.backingFile }, req.handoverToken);
      return { device: deviceToPb(r.device), recoverMs: Math.ceil(r.recoverMs) };
    },
    async abortHandover(req) {
      return { device: deviceToPb(await manager.abortHandover(req.deviceId, req.handoverToken)) };
    },
    /**
     * FenceEpoch (feature "ublk.fence-epoch.v1"): raises the node's epoch fence to req.epoch
     * (EpochFence.fenceEpoch; the fence middleware lets this method through so that a bad request
     * changes nothing) and returns the highest epoch seen after the call, persisted.
     * Codes: INVALID_ARGUMENT (0, or not the `sandnode-epoch` metadata when present), ABORTED
     * (lower than the highest seen), FAILED_PRECONDITION (above the epoch the node's server
     * lease names: no server holds it).
     */
    async fenceEpoch(req, context) {
      if (!opts.fence) throw new FailedPreconditionError('FenceEpoch: this ublk-manager runs without an epoch fence');
      return { epoch: opts.fence.fenceEpoch(req.epoch, metadataEpoch(context.metadata)) };
    },
    async handoverAll(req, context) {
      if (req.fromAddress === '') throw new InvalidArgumentError('from_address: must be set (the old slot, e.g. unix:///run/sandnode/ublk-manager-a.sock)');
      if (opts.selfAddress !== undefined && req.fromAddress === opts.selfAddress) throw new InvalidArgumentError(`from_address: ${req.fromAddress} is this slot`);
      checkOldSlotAddress(req.fromAddress);
      if (handoverRunning) throw new UnavailableError('a HandoverAll is already running on this slot; try again when it ends');
      handoverRunning = true;
      // a new slot booted niced beside the old one (upgradeUblk): from here on it must be fast
      restoreNormalPriority();
      try {
        const old = await connectOldSlot(req.fromAddress, parseEpoch(context.metadata), manager.slot, context.signal);
        try {
          const report = await handoverAll({
            manager,
            old,
            deviceIds: req.deviceIds,
            perDeviceTimeoutMs: req.perDeviceTimeoutMs,
            log: context.log,
            signal: context.signal,
            observe: opts.observeStall,
          });
          return { devices: report.devices.map(handoverToPb), mode: report.mode, totalMs: Math.ceil(report.totalMs) };
        } finally {
          old.close();
        }
      } finally {
        handoverRunning = false;
      }
    },
  };
}

/**
 * checkOldSlotAddress: the old slot runs on this node, so from_address is a unix socket
 * ("unix:///abs/path.sock"); anything else (a TCP or DNS target) is INVALID_ARGUMENT and never
 * dialled. A path with no socket is FAILED_PRECONDITION (no slot listens there). Nothing changed.
 */
function checkOldSlotAddress(address: string): void {
  const p = address.startsWith('unix://') ? address.slice('unix://'.length) : '';
  if (!path.isAbsolute(p)) throw new InvalidArgumentError(`from_address: ${JSON.stringify(address.slice(0, 200))} is not "unix://" and an absolute socket path; nothing changed`);
  let isSocket = false;
  try {
    isSocket = statSync(p).isSocket();
  } catch {
    /* missing */
  }
  if (!isSocket) throw new FailedPreconditionError(`from_address: no socket at ${p.slice(0, 200)} (no ublk-manager slot listens there); nothing changed`);
}
