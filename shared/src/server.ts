/**
 * createServiceServer: the one way a sandnode component serves gRPC. It composes error mapping,
 * logging and metrics middleware once, and serves VersionService, grpc.health.v1.Health and
 * server reflection next to the component's own services. Services never wire middleware
 * themselves.
 *
 * Shutdown order (nice-grpc terminator + health pattern): health NOT_SERVING -> stop taking new
 * calls -> drain running calls (GOAWAY, wait up to drainMs) -> force close -> exit.
 */
import { chmodSync, existsSync, readFileSync, unlinkSync } from 'node:fs';
import path from 'node:path';
import { createServer, ServerError, Status } from 'nice-grpc';
import type { CallContext, ServerMiddlewareCall, Server, ServiceImplementation, CompatServiceDefinition } from 'nice-grpc';
import { HealthDefinition, HealthServiceImpl, HealthState } from 'nice-grpc-server-health';
import { ServerReflection, ServerReflectionService } from 'nice-grpc-server-reflection';
import type { Logger } from 'pino';
import { isAbortError } from 'abort-controller-x';
import { toServerError } from './errors';
import { VersionServiceDefinition } from './gen/sandnode/common/v1/version';
import { versionService, type ComponentInfo } from './version';
import { rpcDuration } from './metrics';

/** Largest gRPC message a sandnode component accepts or sends, in bytes (4 MiB). */
export const MAX_MESSAGE_BYTES = 4 * 1024 * 1024;
/** Default time running calls get to finish at shutdown, in ms. */
export const DEFAULT_DRAIN_MS = 5000;

/** Extra context every handler gets: a child logger bound to the RPC. */
export interface SandnodeCallContext {
  log: Logger;
}

export interface ServiceServerOptions {
  info: ComponentInfo;
  log: Logger;
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
  /** The underlying nice-grpc servers, one per listened address. */
  readonly servers: readonly Server<SandnodeCallContext>[];
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

/** createServiceServer builds a component server with the common middleware and services. */
export function createServiceServer(opts: ServiceServerOptions): ServiceServer {
  const { info, log } = opts;
  const health = HealthState();
  const names: string[] = ['sandnode.common.v1.VersionService'];
  const socketPaths: string[] = [];

  async function* errorAndLog<Req, Res>(call: ServerMiddlewareCall<Req, Res, SandnodeCallContext>, context: CallContext) {
    const rpc = call.method.path;
    const child = log.child({ rpc });
    const end = rpcDuration.startTimer({ component: info.component, rpc });
    let code: Status = Status.OK;
    try {
      return yield* call.next(call.request, { ...context, log: child });
    } catch (err) {
      if (isAbortError(err)) {
        code = Status.CANCELLED;
        throw new ServerError(Status.CANCELLED, 'call cancelled');
      }
      const mapped = toServerError(err);
      if (mapped) {
        code = mapped.code;
        child.debug({ code: Status[mapped.code], err: mapped.details }, 'rpc failed');
        throw mapped;
      }
      code = Status.UNKNOWN;
      child.error({ err }, 'rpc failed with an unexpected error');
      throw new ServerError(Status.UNKNOWN, 'internal error (see the component log)');
    } finally {
      end({ code: Status[code] });
    }
  }

  const services: [CompatServiceDefinition, unknown][] = [
    [VersionServiceDefinition, versionService(info)],
    [HealthDefinition, HealthServiceImpl(health)],
  ];
  const servers: Server<SandnodeCallContext>[] = [];

  // nice-grpc binds one address per server: each address gets its own server with the same
  // middleware and services.
  const makeServer = (): Server<SandnodeCallContext> => {
    const srv = createServer({
      'grpc.max_receive_message_length': MAX_MESSAGE_BYTES,
      'grpc.max_send_message_length': MAX_MESSAGE_BYTES,
    }).use(errorAndLog);
    for (const [def, impl] of services) {
      // eslint-disable-next-line @typescript-eslint/no-explicit-any
      srv.add(def, impl as any);
    }
    return srv;
  };

  let reflectionAdded = false;
  return {
    get servers() {
      return servers;
    },
    add(def, impl) {
      if (servers.length) throw new Error('add() after listen()');
      services.push([def, impl]);
      names.push(fullServiceName(def));
    },
    async listen(addresses) {
      if (!reflectionAdded) {
        services.push([ServerReflectionService, ServerReflection(loadDescriptorSet(), names)]);
        reflectionAdded = true;
      }
      const ports: number[] = [];
      for (const addr of addresses) {
        const srv = makeServer();
        if (addr.startsWith('unix://')) {
          const p = addr.slice('unix://'.length);
          if (existsSync(p)) unlinkSync(p); // a stale socket from a killed process
          ports.push(await srv.listen(addr));
          chmodSync(p, 0o600);
          socketPaths.push(p);
        } else {
          ports.push(await srv.listen(addr));
        }
        servers.push(srv);
      }
      this.setServing(true);
      return ports;
    },
    setServing(serving) {
      const s = serving ? 'healthy' : 'unhealthy';
      health.setStatus(s);
      for (const n of names) health.setStatus(s, n);
    },
    async shutdown(drainMs = DEFAULT_DRAIN_MS) {
      this.setServing(false);
      const timer = setTimeout(() => servers.forEach((srv) => srv.forceShutdown()), drainMs);
      try {
        await Promise.all(servers.map((srv) => srv.shutdown()));
      } finally {
        clearTimeout(timer);
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
