/**
 * Errors of the host peers (vmm-supervisor, ublk-manager) as the server's callers see them.
 * A peer's INTERNAL or UNKNOWN answer carries what broke on the host (a runc or losetup
 * command line and its stderr, paths): that goes to this server's log with the error object,
 * and the caller gets an INTERNAL that names the peer and the call only. Every other code is
 * the peer's own sentence about the request (NOT_FOUND, FAILED_PRECONDITION, ABORTED for a
 * stale epoch, UNAVAILABLE / DEADLINE_EXCEEDED / RESOURCE_EXHAUSTED that a client may retry)
 * and passes unchanged, so retryable codes stay retryable.
 */
import { InternalError, isCode, Status, type Logger } from '@sandnode/shared';
import type { DevicePort, VmPort } from './types';

/** Codes whose message may hold host details: never forwarded to a caller. */
const HIDDEN_CODES: readonly Status[] = [Status.INTERNAL, Status.UNKNOWN, Status.DATA_LOSS];

/**
 * mapPeerError returns what a caller may see of a peer call's failure: err itself, or (for
 * INTERNAL / UNKNOWN / DATA_LOSS) an InternalError "<peer> <call> failed; the server log has
 * the details", after logging err. A value that is not a status error is returned as it is
 * (the server middleware answers it UNKNOWN with a generic message and logs it).
 */
export function mapPeerError(err: unknown, peer: string, call: string, log: Logger): unknown {
  if (!HIDDEN_CODES.some((code) => isCode(err, code))) return err;
  log.error({ err, peer, call }, 'peer call failed');
  return new InternalError(`${peer} ${call} failed; the server log has the details`);
}

/** guarded runs a peer call and maps its failure with mapPeerError. */
async function guarded<T>(peer: string, call: string, log: Logger, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    throw mapPeerError(err, peer, call, log);
  }
}

/** guardVmPort wraps the vmm-supervisor port so that its host errors never reach a caller. */
export function guardVmPort(vms: VmPort, log: Logger): VmPort {
  const g = <T>(call: string, fn: () => Promise<T>) => guarded('vmm-supervisor', call, log, fn);
  return {
    create: (a) => g('CreateVm', () => vms.create(a)),
    get: (id) => g('GetVm', () => vms.get(id)),
    list: () => g('ListVms', () => vms.list()),
    pause: (id) => g('PauseVm', () => vms.pause(id)),
    resume: (id) => g('ResumeVm', () => vms.resume(id)),
    freezeStatus: (id) => g('GetVmFreeze', () => vms.freezeStatus(id)),
    delete: (id) => g('DeleteVm', () => vms.delete(id)),
  };
}

/** guardDevicePort wraps the ublk-manager port so that its host errors never reach a caller. */
export function guardDevicePort(devices: DevicePort, log: Logger): DevicePort {
  const g = <T>(call: string, fn: () => Promise<T>) => guarded('ublk-manager', call, log, fn);
  return {
    createEmpty: (id, size) => g('CreateDevice', () => devices.createEmpty(id, size)),
    clone: (id, src, quiesced, deadlineMs) => g('CloneDevice', () => devices.clone(id, src, quiesced, deadlineMs)),
    version: () => g('GetVersion', () => devices.version()),
    get: (id) => g('GetDevice', () => devices.get(id)),
    list: () => g('ListDevices', () => devices.list()),
    delete: (id) => g('DeleteDevice', () => devices.delete(id)),
  };
}
