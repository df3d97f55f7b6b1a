/**
 * Thin handlers of sandnode.vmm.v1.FreezePortService for ONE VM, and the per-VM server that
 * serves them on `<vmDir>/freeze-port/freeze.sock` (seen by the VM at
 * /run/sandnode-freeze/freeze.sock). Domain errors map to gRPC codes in the shared middleware.
 */
import { chmodSync, existsSync, unlinkSync } from 'node:fs';
import net from 'node:net';
import { buildCommit, createServiceServer, SUITE_VERSION, VMM_FEATURES, type Logger, type SandnodeCallContext } from '@sandnode/shared';
import { FreezeEndedBy, FreezePortServiceDefinition, type FreezePortServiceImplementation } from '@sandnode/shared/proto/vmm/v1/vmm';
import type { FreezeEnd } from '../core/freeze';
import type { Freezer } from '../drivers/freeze-port';

/** Component name the freeze port reports in GetVersion. */
export const FREEZE_PORT_COMPONENT = 'vmm-supervisor-freeze-port';
/** Time running freeze-port calls get when the port closes, in ms. */
export const DEFAULT_FREEZE_PORT_DRAIN_MS = 1000;
/** Most connections one VM's freeze port holds at once (podd needs one). */
export const FREEZE_PORT_MAX_CONNECTIONS = 8;

/** freezeEndToProto maps how a freeze ended to the wire (undefined = UNSPECIFIED: still holds / none). */
export function freezeEndToProto(end: FreezeEnd | undefined): FreezeEndedBy {
  switch (end) {
    case 'caller':
      return FreezeEndedBy.FREEZE_ENDED_BY_CALLER;
    case 'watchdog':
      return FreezeEndedBy.FREEZE_ENDED_BY_WATCHDOG;
    default:
      return FreezeEndedBy.FREEZE_ENDED_BY_UNSPECIFIED;
  }
}

/**
 * createFreezePortService returns the FreezePortService of the VM that freezer belongs to.
 * FreezeFilesystems: FAILED_PRECONDITION (a freeze holds, the VM does not run), INTERNAL (a
 * FIFREEZE failed; thawed again). ThawFilesystems: INVALID_ARGUMENT (empty token),
 * FAILED_PRECONDITION (not the latest freeze). GetFilesystemFreeze never fails.
 */
export function createFreezePortService(freezer: Freezer): FreezePortServiceImplementation<SandnodeCallContext> {
  return {
    async freezeFilesystems(req) {
      const r = await freezer.freeze(req.maxFreezeMs);
      return { freezeToken: r.token, maxFreezeMs: r.maxFreezeMs, deadlineUnixMs: r.deadlineMs, filesystems: r.filesystems, freezeMs: r.freezeMs };
    },
    async thawFilesystems(req) {
      const r = await freezer.thaw(req.freezeToken);
      return { endedBy: freezeEndToProto(r.endedBy), frozenMs: r.frozenMs };
    },
    async getFilesystemFreeze() {
      const s = await freezer.status();
      return {
        frozen: s.frozen,
        freezeToken: s.token,
        maxFreezeMs: s.maxFreezeMs,
        remainingMs: s.remainingMs,
        endedBy: freezeEndToProto(s.endedBy),
        frozenMs: s.frozenMs,
      };
    },
  };
}

/** A running freeze port; close() stops it (drain up to DEFAULT_FREEZE_PORT_DRAIN_MS) and removes the socket. */
export interface FreezePortServer {
  close(): Promise<void>;
}

/** FreezePortServe starts the freeze port of one VM on socketPath (a stale socket there is replaced). */
export type FreezePortServe = (vmId: string, socketPath: string, freezer: Freezer) => Promise<FreezePortServer>;

/** freezePortServer returns the FreezePortServe the runc driver uses: one small gRPC server per VM. */
export function freezePortServer(log: Logger): FreezePortServe {
  return async (vmId, socketPath, freezer) => {
    const vmLog = log.child({ vm_id: vmId, component: FREEZE_PORT_COMPONENT });
    const server = createServiceServer({
      info: { component: FREEZE_PORT_COMPONENT, version: SUITE_VERSION, commit: buildCommit(), features: [VMM_FEATURES.freezePort] },
      log: vmLog,
    });
    server.add(FreezePortServiceDefinition, createFreezePortService(freezer));
    // The port is reachable from inside the sandbox: cap its connections, so that a sandbox
    // cannot spend the supervisor's file descriptors (the one above the cap is closed at once).
    if (existsSync(socketPath)) unlinkSync(socketPath); // a stale socket of a killed supervisor
    const listener = net.createServer();
    listener.maxConnections = FREEZE_PORT_MAX_CONNECTIONS;
    await new Promise<void>((resolve, reject) => {
      listener.once('error', reject);
      listener.listen(socketPath, () => {
        listener.off('error', reject);
        resolve();
      });
    });
    chmodSync(socketPath, 0o600);
    server.serveListener(listener);
    return { close: () => server.shutdown(DEFAULT_FREEZE_PORT_DRAIN_MS) };
  };
}
