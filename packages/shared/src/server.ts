/**
 * createServiceServer: the one way a sandnode component serves gRPC. It composes error mapping,
 * logging, metrics and deadline middleware once, and serves VersionService, grpc.health.v1.Health and
 * server reflection next to the component's own services. Services never wire middleware
 * themselves.
 *
 * Shutdown order (nice-grpc terminator + health pattern): health NOT_SERVING -> stop taking new
 * calls -> drain running calls (GOAWAY, wait up to drainMs) -> force close -> exit.
 */
import { chmodSync, existsSync, readFileSync, unlinkSync } from 'node:fs';
import path from 'node:path';
import type net from 'node:net';
import type * as grpc from '@grpc/grpc-js';
import { ServerError, Status } from 'nice-grpc';
import type { CallContext, ServerMiddlewareCall, ServiceImplementation, CompatServiceDefinition } from 'nice-grpc';
import { HealthDefinition, HealthServiceImpl, HealthState } from 'nice-grpc-server-health';
import { ServerReflection, ServerReflectionService } from 'nice-grpc-server-reflection';
import type { Logger } from 'pino';
import { isAbortError } from 'abort-controller-x';
import { DeadlineExceededError, toServerError } from './errors';
import { VersionServiceDefinition } from './gen/sandnode/common/v1/version';
import { versionService, type ComponentInfo } from './version';
import { setBuildInfo } from './metrics';
import { startServerCall } from './grpc-metrics';
import { runWithLogContext, type LogContext } from './logger';
import { DEADLINE_METADATA_KEY, GrpcHost } from './grpc-host';
import type { RawProtocol } from './bulk-channel';
import { epochFenceMiddleware, type EpochFence } from './epoch-fence';
import { authMiddleware, peerKeyOfSocket, type AuthPolicy, type Role } from './connection-auth';
import { RETRY_AFTER_MS_TRAILER, retryAfterMsOf } from './sqlite-busy';
import { DEFAULT_GUARD_LIMITS, ServerGuards, type GuardLimits } from './server-guards';

/** Largest gRPC message a sandnode component accepts or sends, in bytes (4 MiB). */
export const MAX_MESSAGE_BYTES = 4 * 1024 * 1024;
/** Default time running calls get to finish at shutdown, in ms. */
export const DEFAULT_DRAIN_MS = 5000;

/** Extra context every handler gets: a child logger bound to the RPC, and the caller's role. */
export interface SandnodeCallContext {
  log: Logger;
  /**
   * The role authMiddleware found for the caller (connection-auth.ts), set only by it (never
   * from the request or its metadata); undefined on a server without an AuthPolicy, whose
   * callers are all admins (the socket's file mode is the only check). A handler that gives a
   * caller more than the method's result (activity, an auto-resume: rpc/idle-hooks.ts) reads it.
   */
  callerRole?: Role;
}

/**
 * Connection limits of every sandnode gRPC server (issue 10 §5: connections that only sent the
 * HTTP/2 preface were held forever, one connection could open any number of streams). grpc-js
 * server options: `grpc.max_concurrent_streams` (SETTINGS_MAX_CONCURRENT_STREAMS, RFC 9113
 * §6.5.2), `grpc.max_connection_idle_ms` (GOAWAY to a connection with no call for that long;
 * gRPC A9 "Server-side Connection Management"), `grpc.keepalive_time_ms` /
 * `grpc.keepalive_timeout_ms` (pings find peers that vanished; gRPC A8).
 */
export interface ServerLimits extends GuardLimits {
  /** streams one connection may have open at once */
  maxConcurrentStreams: number;
  /** a connection without a call for this long is sent GOAWAY and closed, ms */
  maxConnectionIdleMs: number;
  /** a ping after this long without traffic, ms */
  keepaliveTimeMs: number;
  /** the connection is closed when a ping is not answered within this, ms */
  keepaliveTimeoutMs: number;
}

/** The limits unless a component says otherwise. */
export const DEFAULT_SERVER_LIMITS: ServerLimits = {
  ...DEFAULT_GUARD_LIMITS,
  maxConcurrentStreams: 256,
  maxConnectionIdleMs: 300_000,
  keepaliveTimeMs: 60_000,
  keepaliveTimeoutMs: 20_000,
};

export interface ServiceServerOptions {
  info: ComponentInfo;
  log: Logger;
  /** epoch fence for mutating calls (vmm-supervisor, ublk-manager); its epoch is on every log line of a call */
  fence?: EpochFence;
  /** the epoch on every log line of a call when there is no fence (the server: its lease epoch) */
  epoch?: () => number;
  /** connection limits (default DEFAULT_SERVER_LIMITS) */
  limits?: Partial<ServerLimits>;
  /** who may call (connection-auth.ts); undefined: whoever can reach the socket */
  auth?: AuthPolicy;
  /**
   * grpc-js server options applied over the ones derived from the defaults and limits: a
   * component's own stricter settings (e.g. the vmm-supervisor's freeze port: a 4 KiB receive
   * limit, `grpc-node.max_session_memory`, `grpc.max_connection_age_ms`).
   */
  grpcOptions?: Record<string, number>;
}

/** ServiceServer is a running component server. */
export interface ServiceServer {
  /** add registers a service and marks it healthy once listening. */
  add<D extends CompatServiceDefinition>(def: D, impl: ServiceImplementation<D, SandnodeCallContext>): void;
  /** listen binds every address ("unix:///abs.sock" or "host:port"); returns bound ports. */
  listen(addresses: string[]): Promise<number[]>;
  /** setServing flips the health status of every service. */
  setServing(serving: boolean): void;
  /** shutdown runs the shutdown order; resolves when the server is closed. */
  shutdown(drainMs?: number): Promise<void>;
  /** serveListener serves gRPC on connections accepted by a listening net.Server we own (creds: default insecure). */
  serveListener(listener: net.Server, creds?: grpc.ServerCredentials, raw?: RawProtocol): void;
  /** The grpc-js host (for handover: injected listeners, stop accepting). */
  readonly host: GrpcHost;
  /** The per-call and per-connection limits (server-guards.ts); setPeerKey names peers. */
  readonly guards: ServerGuards;
}

/**
 * deadlineMiddleware answers DEADLINE_EXCEEDED without calling the handler when the call's
 * deadline (stamped by GrpcHost from `grpc-timeout`, ms since the epoch) has already passed on
 * arrival, or its signal is already aborted (the caller went away): such a call does nothing.
 * Calls without a deadline are let through. A deadline that passes later aborts ctx.signal,
 * which handlers pass downstream.
 */
export async function* deadlineMiddleware<Req, Res>(call: ServerMiddlewareCall<Req, Res>, context: CallContext) {
  const stamped = context.metadata.get(DEADLINE_METADATA_KEY);
  const deadline = stamped === undefined ? Infinity : Number(stamped);
  const now = Date.now();
  if (context.signal.aborted || now >= deadline) {
    const late = Number.isFinite(deadline) ? ` (${now - deadline} ms past it)` : '';
    throw new DeadlineExceededError(`${call.method.path}: the call's deadline passed before it was handled${late}; nothing was done`);
  }
  return yield* call.next(call.request, context);
}

function fullServiceName(def: CompatServiceDefinition): string {
  const d = def as { fullName?: string; name?: string };
  if (d.fullName) return d.fullName;
  const first = Object.values(def as Record<string, { path?: string }>)[0];
  return first?.path?.split('/')[1] ?? d.name ?? 'unknown';
}

/** Finds the descriptor set that `npm run gen` writes; empty if missing (reflection then lists nothing). */
function loadDescriptorSet(): Uint8Array {
  const p = path.join(__dirname, '..', 'descriptor', 'sandnode.binpb');
  return existsSync(p) ? new Uint8Array(readFileSync(p)) : new Uint8Array();
}

/**
 * The reflection services made so far, by their service names: parsing the descriptor set
 * costs ~5 MB of heap per server, and the vmm-supervisor runs one small server per VM (its
 * freeze port). A bigger heap makes every child process start (fork) of the daemon slower.
 */
const reflections = new Map<string, ReturnType<typeof ServerReflection>>();

/** reflectionFor is the ServerReflection service for names (full service names), made once per process and names. */
export function reflectionFor(names: string[]): ReturnType<typeof ServerReflection> {
  const key = names.join('\n');
  let r = reflections.get(key);
  if (!r) reflections.set(key, (r = ServerReflection(loadDescriptorSet(), [...names])));
  return r;
}

/**
 * sandboxIdOf is the sandbox a unary request is about: its sandbox_id, vm_id (the supervisor's
 * VMs are named by sandbox id), parent_id (fork) or the sandbox of a device id
 * ("sb-<16 hex>-upper"); undefined for a stream of requests or none.
 */
export function sandboxIdOf(request: unknown): string | undefined {
  if (typeof request !== 'object' || request === null || Symbol.asyncIterator in request) return undefined;
  const r = request as { sandboxId?: unknown; vmId?: unknown; parentId?: unknown; parentSandboxId?: unknown; deviceId?: unknown };
  for (const v of [r.sandboxId, r.vmId, r.parentId, r.parentSandboxId]) if (typeof v === 'string' && v !== '') return v;
  return typeof r.deviceId === 'string' ? /^(sb-[0-9a-f]{16})-/.exec(r.deviceId)?.[1] : undefined;
}

/**
 * inLogContext drives gen with the log context fields set on each step: the handler (which
 * the inner generator starts on its first step) and everything it starts log with them.
 */
async function* inLogContext<T, R>(fields: LogContext, gen: AsyncGenerator<T, R, undefined>): AsyncGenerator<T, R, undefined> {
  let done = false;
  try {
    for (;;) {
      const step = await runWithLogContext(fields, () => gen.next());
      if (step.done) {
        done = true;
        return step.value;
      }
      yield step.value;
    }
  } finally {
    if (!done) await runWithLogContext(fields, () => gen.return(undefined as R));
  }
}

/** createServiceServer builds a component server with the common middleware and services. */
export function createServiceServer(opts: ServiceServerOptions): ServiceServer {
  const { info, log } = opts;
  setBuildInfo(info);
  const health = HealthState();
  const names: string[] = ['sandnode.common.v1.VersionService'];
  const socketPaths: string[] = [];

  const epochOf = opts.epoch ?? (opts.fence ? () => opts.fence!.current : undefined);

  async function* errorAndLog<Req, Res>(call: ServerMiddlewareCall<Req, Res, SandnodeCallContext>, context: CallContext) {
    const rpc = call.method.path;
    // every line logged while the call runs carries rpc, epoch and sandbox_id (logger.ts mixin)
    const fields: LogContext = { rpc, epoch: epochOf?.(), sandbox_id: sandboxIdOf(call.request) };
    const ctx = { ...context, log } as CallContext & SandnodeCallContext;
    const end = startServerCall(call.method);
    let code: Status = Status.OK;
    try {
      return yield* inLogContext(fields, call.next(call.request, ctx) as AsyncGenerator<Res, Res | void, undefined>);
    } catch (err) {
      if (isAbortError(err)) {
        code = Status.CANCELLED;
        throw new ServerError(Status.CANCELLED, 'call cancelled');
      }
      const mapped = toServerError(err);
      if (mapped) {
        code = mapped.code;
        const retryAfterMs = retryAfterMsOf(err);
        if (retryAfterMs !== undefined) context.trailer.set(RETRY_AFTER_MS_TRAILER, String(retryAfterMs));
        if (log.isLevelEnabled('debug')) runWithLogContext(fields, () => log.debug({ code: Status[mapped.code], err: mapped.details }, 'rpc failed'));
        throw mapped;
      }
      code = Status.UNKNOWN;
      runWithLogContext(fields, () => log.error({ err }, 'rpc failed with an unexpected error'));
      throw new ServerError(Status.UNKNOWN, 'internal error (see the component log)');
    } finally {
      end(code);
    }
  }

  const limits = { ...DEFAULT_SERVER_LIMITS, ...opts.limits };
  const guards = new ServerGuards(limits);
  guards.setPeerKey(peerKeyOfSocket);
  const host = new GrpcHost({
    options: {
      'grpc.max_receive_message_length': MAX_MESSAGE_BYTES,
      'grpc.max_send_message_length': MAX_MESSAGE_BYTES,
      'grpc.max_concurrent_streams': limits.maxConcurrentStreams,
      'grpc.max_connection_idle_ms': limits.maxConnectionIdleMs,
      'grpc.keepalive_time_ms': limits.keepaliveTimeMs,
      'grpc.keepalive_timeout_ms': limits.keepaliveTimeoutMs,
      ...opts.grpcOptions,
      interceptors: [guards.interceptor],
    },
    // deadline before the fence: a call that is already late must not even raise the epoch
    // auth first after error mapping: nothing runs for a caller that is refused
    middleware: [errorAndLog, ...(opts.auth ? [authMiddleware(opts.auth)] : []), deadlineMiddleware, ...(opts.fence ? [epochFenceMiddleware(opts.fence)] : [])],
  });
  host.add(VersionServiceDefinition, versionService(info));
  host.add(HealthDefinition, HealthServiceImpl(health));

  let reflectionAdded = false;
  const addReflection = () => {
    if (!reflectionAdded) {
      host.add(ServerReflectionService, reflectionFor(names));
      reflectionAdded = true;
    }
  };
  return {
    host,
    guards,
    add(def, impl) {
      if (reflectionAdded) throw new Error('add() after listen()');
      host.add(def, impl);
      names.push(fullServiceName(def));
    },
    async listen(addresses) {
      addReflection();
      const ports: number[] = [];
      for (const addr of addresses) {
        if (addr.startsWith('unix://')) {
          const p = addr.slice('unix://'.length);
          if (existsSync(p)) unlinkSync(p); // a stale socket from a killed process
          ports.push(await host.bind(addr));
          chmodSync(p, 0o600);
          socketPaths.push(p);
        } else {
          ports.push(await host.bind(addr));
        }
        guards.watch(host.server);
      }
      this.setServing(true);
      return ports;
    },
    serveListener(listener, creds, raw) {
      addReflection();
      host.serveListener(listener, creds, raw);
      guards.watch(host.server);
      this.setServing(true);
    },
    setServing(serving) {
      const s = serving ? 'healthy' : 'unhealthy';
      health.setStatus(s);
      for (const n of names) health.setStatus(s, n);
    },
    async shutdown(drainMs = DEFAULT_DRAIN_MS) {
      this.setServing(false);
      try {
        await host.shutdown(drainMs);
      } finally {
        for (const p of socketPaths) {
          try {
            unlinkSync(p);
          } catch {
            /* already gone */
          }
        }
      }
    },
  };
}
