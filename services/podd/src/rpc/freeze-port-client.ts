/**
 * The FreezePort of core/quiesce.ts over gRPC: a client of the host's
 * sandnode.vmm.v1.FreezePortService on its unix socket (one channel, shared by every call),
 * every call with a deadline. Connection failures become UnavailableError; the port's own
 * errors keep their code.
 */
import { createSandnodeChannel, createServiceClient, fromClientError, isCode, Status, UnavailableError, unixAddress } from '@sandnode/shared';
import { FreezeEndedBy, FreezePortServiceDefinition } from '@sandnode/shared/proto/vmm/v1/vmm';
import type { FreezeEnd, FreezePort, PortStatus } from '../core/quiesce';

/** freezeEndFromProto maps the port's enum; UNSPECIFIED and unknown values are undefined. */
export function freezeEndFromProto(v: FreezeEndedBy): FreezeEnd {
  if (v === FreezeEndedBy.FREEZE_ENDED_BY_CALLER) return 'caller';
  if (v === FreezeEndedBy.FREEZE_ENDED_BY_WATCHDOG) return 'watchdog';
  return undefined;
}

/** mapPortError turns a port call failure into a domain error (UNAVAILABLE names the socket). */
export function mapPortError(err: unknown, socketPath: string): unknown {
  if (isCode(err, Status.UNAVAILABLE)) {
    return new UnavailableError(`freeze port ${socketPath} is not reachable: ${(err as { details?: string }).details ?? (err as Error).message}`);
  }
  return fromClientError(err);
}

/** Attempts of a freeze-port call that found the port UNAVAILABLE (the supervisor restarting). */
export const DEFAULT_FREEZE_PORT_RETRY_ATTEMPTS = 2;

/**
 * createFreezePortClient returns the FreezePort on socketPath; every call has a timeoutMs
 * deadline and up to retryAttempts attempts while the port is UNAVAILABLE.
 */
export function createFreezePortClient(socketPath: string, timeoutMs: number, retryAttempts = DEFAULT_FREEZE_PORT_RETRY_ATTEMPTS): FreezePort {
  const client = createServiceClient(FreezePortServiceDefinition, createSandnodeChannel(unixAddress(socketPath)), { timeoutMs, retryAttempts });
  const call = async <T>(fn: () => Promise<T>): Promise<T> => {
    try {
      return await fn();
    } catch (err) {
      throw mapPortError(err, socketPath);
    }
  };
  return {
    freeze: (maxFreezeMs) =>
      call(async () => {
        const r = await client.freezeFilesystems({ maxFreezeMs });
        return { token: r.freezeToken, maxFreezeMs: r.maxFreezeMs, deadlineUnixMs: r.deadlineUnixMs, filesystems: r.filesystems, freezeMs: r.freezeMs };
      }),
    thaw: (token, signal) =>
      call(async () => {
        const r = await client.thawFilesystems({ freezeToken: token }, { signal });
        return { endedBy: freezeEndFromProto(r.endedBy), frozenMs: r.frozenMs };
      }),
    status: (signal) =>
      call(async (): Promise<PortStatus> => {
        const r = await client.getFilesystemFreeze({}, { signal });
        return { frozen: r.frozen, token: r.freezeToken, maxFreezeMs: r.maxFreezeMs, remainingMs: r.remainingMs, endedBy: freezeEndFromProto(r.endedBy), frozenMs: r.frozenMs };
      }),
  };
}
