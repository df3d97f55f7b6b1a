/**
 * Thin handlers of sandnode.vmm.v1.FreezePortService for ONE VM, and the per-VM server that
 * serves them on `<vmDir>/freeze-port/freeze.sock` (seen by the VM at
 * /run/sandnode-freeze/freeze.sock). Domain errors map to gRPC codes in the shared middleware.
 *
 * Everything inside the sandbox can reach this server, so it states its own limits, far below
 * the shared ones (the real requests are a few bytes; podd holds one connection and makes one
 * call at a time): {@link FreezePortLimits}. A freeze is let in by the FreezeGate (armed by the
 * server, or unarmed within the VM's rate while arming is not required) before any host work.
 */
import { chmodSync, existsSync, unlinkSync } from 'node:fs';
import net from 'node:net';
import { buildCommit, createServiceServer, RETRY_AFTER_MS_TRAILER, SUITE_VERSION, VMM_FEATURES, type Logger, type SandnodeCallContext } from '@sandnode/shared';
import { FreezeEndedBy, FreezePortServiceDefinition, type FreezePortServiceImplementation } from '@sandnode/shared/proto/vmm/v1/vmm';
import type { FreezeEnd } from '../core/freeze';
import { FreezeRateError, type FreezeGate } from '../core/freeze-gate';
import type { Freezer } from '../drivers/freeze-port';

/** Component name the freeze port reports in GetVersion. */
export const FREEZE_PORT_COMPONENT = 'vmm-supervisor-freeze-port';
/** Time running freeze-port calls get when the port closes, in ms. */
export const DEFAULT_FREEZE_PORT_DRAIN_MS = 1000;
/** Most connections one VM's freeze port holds at once (podd needs one; config `freezePortMaxConnections`). */
export const FREEZE_PORT_MAX_CONNECTIONS = 4;
/** Largest message the freeze port accepts, bytes (its requests are a few bytes; config `freezePortMaxMessageBytes`). */
export const FREEZE_PORT_MAX_MESSAGE_BYTES = 4096;
/** A connection without a call is sent GOAWAY and closed after this, ms (also the time to the first call; config `freezePortIdleMs`). */
export const FREEZE_PORT_IDLE_MS = 10_000;
/** A connection that has sent no byte (not even the HTTP/2 preface) after this is closed, ms (config `freezePortHandshakeMs`). */
export const FREEZE_PORT_HANDSHAKE_MS = 2000;
/** Streams one connection may have open at once. */
export const FREEZE_PORT_MAX_STREAMS = 1;
/** A connection is closed after this long however busy, ms (then {@link FREEZE_PORT_MAX_AGE_GRACE_MS} for a running call). */
export const FREEZE_PORT_MAX_AGE_MS = 60_000;
/** Time a running call gets once its connection is past its age, ms (a FIFREEZE may take up to 30 s). */
export const FREEZE_PORT_MAX_AGE_GRACE_MS = 35_000;
/** HTTP/2 session memory of one connection (nghttp2 buffers, Node's maxSessionMemory), MiB. */
export const FREEZE_PORT_SESSION_MEMORY_MIB = 1;

/** FreezePortLimits are one VM's freeze-port server limits. */
export interface FreezePortLimits {
  /** Connections at once (default {@link FREEZE_PORT_MAX_CONNECTIONS}). */
  maxConnections: number;
  /** Largest message, bytes (default {@link FREEZE_PORT_MAX_MESSAGE_BYTES}). */
  maxMessageBytes: number;
  /** Idle time of a connection without a call, ms (default {@link FREEZE_PORT_IDLE_MS}). */
  idleMs: number;
  /** Time to the first byte of a connection, ms (default {@link FREEZE_PORT_HANDSHAKE_MS}). */
  handshakeMs: number;
}

/** The freeze port's limits unless configured. */
export const DEFAULT_FREEZE_PORT_LIMITS: FreezePortLimits = {
  maxConnections: FREEZE_PORT_MAX_CONNECTIONS,
  maxMessageBytes: FREEZE_PORT_MAX_MESSAGE_BYTES,
  idleMs: FREEZE_PORT_IDLE_MS,
  handshakeMs: FREEZE_PORT_HANDSHAKE_MS,
};

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
 * createFreezePortService returns the FreezePortService of vmId, whose freezer is freezer and
 * whose freezes gate lets in (none: every freeze, as before 0.3.0 — unit tests).
 * FreezeFilesystems: FAILED_PRECONDITION (not armed while arming is required, a freeze holds,
 * the VM does not run), RESOURCE_EXHAUSTED (unarmed beyond the VM's rate; trailer
 * `retry-after-ms`), INTERNAL (a FIFREEZE failed; thawed again). ThawFilesystems:
 * INVALID_ARGUMENT (empty token), FAILED_PRECONDITION (not the latest freeze).
 * GetFilesystemFreeze never fails.
 */
export function createFreezePortService(freezer: Freezer, gate?: FreezeGate, vmId = ''): FreezePortServiceImplementation<SandnodeCallContext> {
  return {
    async freezeFilesystems(req, ctx) {
      try {
        const how = gate?.admit(vmId);
        if (how === 'unarmed') ctx.log.info({ vm_id: vmId }, 'unarmed freeze let in (the lease holder does not arm freezes)');
      } catch (err) {
        if (err instanceof FreezeRateError) ctx.trailer.set(RETRY_AFTER_MS_TRAILER, String(err.retryAfterMs));
        throw err;
      }
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

/**
 * freezePortServer returns the FreezePortServe the runc driver uses: one small gRPC server per
 * VM with the limits (default {@link DEFAULT_FREEZE_PORT_LIMITS}), its freezes let in by gate.
 */
export function freezePortServer(log: Logger, gate?: FreezeGate, limits: FreezePortLimits = DEFAULT_FREEZE_PORT_LIMITS): FreezePortServe {
  return async (vmId, socketPath, freezer) => {
    const vmLog = log.child({ vm_id: vmId, component_part: FREEZE_PORT_COMPONENT });
    const server = createServiceServer({
      info: { component: FREEZE_PORT_COMPONENT, version: SUITE_VERSION, commit: buildCommit(), features: [VMM_FEATURES.freezePort, ...(gate ? [VMM_FEATURES.freezeArm] : [])] },
      log: vmLog,
      // one call at a time per connection; a connection without a call (one that sent only
      // the HTTP/2 preface, or nothing: the timer starts at accept) is closed after idleMs
      limits: { maxConcurrentStreams: FREEZE_PORT_MAX_STREAMS, maxConnectionIdleMs: limits.idleMs },
      grpcOptions: {
        // a larger message is RESOURCE_EXHAUSTED at its 5-byte header, before it is buffered
        'grpc.max_receive_message_length': limits.maxMessageBytes,
        'grpc.max_send_message_length': 64 * 1024,
        'grpc-node.max_session_memory': FREEZE_PORT_SESSION_MEMORY_MIB,
        'grpc.max_connection_age_ms': FREEZE_PORT_MAX_AGE_MS,
        'grpc.max_connection_age_grace_ms': FREEZE_PORT_MAX_AGE_GRACE_MS,
      },
    });
    server.add(FreezePortServiceDefinition, createFreezePortService(freezer, gate, vmId));
    // The port is reachable from inside the sandbox: cap its connections, so that a sandbox
    // cannot spend the supervisor's file descriptors (the one above the cap is closed at once).
    if (existsSync(socketPath)) unlinkSync(socketPath); // a stale socket of a killed supervisor
    const listener = net.createServer();
    listener.maxConnections = limits.maxConnections;
    // gRPC's idle limit closes a connection without a call only once nghttp2 got the preface:
    // one that sends nothing at all is closed here (registered before serveListener's handler)
    listener.on('connection', (socket: net.Socket) => {
      const t = setTimeout(() => {
        if (socket.bytesRead === 0) socket.destroy();
      }, limits.handshakeMs);
      t.unref();
      socket.once('close', () => clearTimeout(t));
    });
    await new Promise<void>((resolve, reject) => {
      listener.once('error', reject);
      listener.listen(socketPath, () => {
        listener.off('error', reject);
        resolve();
      });
    });
    chmodSync(socketPath, 0o600);
    server.serveListener(listener);
    return {
      close: async () => {
        gate?.forget(vmId);
        await server.shutdown(DEFAULT_FREEZE_PORT_DRAIN_MS);
      },
    };
  };
}
