/**
 * GrpcHost: a grpc-js Server that runs nice-grpc service implementations and middleware, and
 * that we own, so that it can also serve connections accepted on listening sockets it did not
 * bind itself (an inherited fd, or one received over SCM_RIGHTS during a handover) through
 * grpc-js `Server.createConnectionInjector`.
 *
 * nice-grpc keeps its grpc-js server private and binds one address per server; this adapter
 * builds the grpc-js service handlers with nice-grpc's own handler factories (pinned
 * nice-grpc 2.1.18, `lib/server/handle*Call`), so handlers, middleware and error mapping behave
 * exactly as under `createServer()`.
 */
import type http2 from 'node:http2';
import type net from 'node:net';
import * as grpc from '@grpc/grpc-js';
import type { CompatServiceDefinition, ServiceImplementation } from 'nice-grpc';
import { composeServerMiddleware, type ServerMiddleware } from 'nice-grpc-common';
import { boundDetails, InvalidArgumentError, UnimplementedError } from './errors';
import { stampPeer } from './connection-auth';
import { sniffRaw, type RawProtocol } from './bulk-channel';
/* eslint-disable @typescript-eslint/no-explicit-any */
const defs = require('nice-grpc/lib/service-definitions') as {
  normalizeServiceDefinition(d: CompatServiceDefinition): Record<string, any>;
  toGrpcJsServiceDefinition(d: Record<string, any>): grpc.ServiceDefinition;
};
const unary = require('nice-grpc/lib/server/handleUnaryCall') as { createUnaryMethodHandler: (...a: any[]) => any };
const serverStream = require('nice-grpc/lib/server/handleServerStreamingCall') as { createServerStreamingMethodHandler: (...a: any[]) => any };
const clientStream = require('nice-grpc/lib/server/handleClientStreamingCall') as { createClientStreamingMethodHandler: (...a: any[]) => any };
const bidi = require('nice-grpc/lib/server/handleBidiStreamingCall') as { createBidiStreamingMethodHandler: (...a: any[]) => any };

/**
 * The metadata key that carries a call's deadline to middleware: ms since the epoch, as grpc-js
 * computed it from `grpc-timeout` when the headers arrived; absent when the call has none. The
 * host always sets or removes it, so a client cannot send its own.
 */
export const DEADLINE_METADATA_KEY = 'sandnode-deadline-ms';

/** stampDeadline puts the call's deadline into its metadata (nice-grpc's context has no deadline). */
function stampDeadline(call: { metadata?: grpc.Metadata; getDeadline?: () => grpc.Deadline }): void {
  if (!call.metadata) return;
  call.metadata.remove(DEADLINE_METADATA_KEY);
  const d = call.getDeadline?.();
  const ms = d instanceof Date ? d.getTime() : d;
  if (ms !== undefined && Number.isFinite(ms)) call.metadata.set(DEADLINE_METADATA_KEY, String(ms));
}

/** What a request that did not decode is replaced with, so that the call is answered INVALID_ARGUMENT (grpc-js answers INTERNAL). */
const UNDECODABLE = Symbol('sandnode.undecodable');
type Undecodable = { [UNDECODABLE]: string };

function isUndecodable(v: unknown): v is Undecodable {
  return typeof v === 'object' && v !== null && UNDECODABLE in v;
}

/** decodeOrMark wraps a request deserializer: bytes that do not decode become a marker instead of a throw. */
function decodeOrMark(deserialize: (b: Buffer) => unknown): (b: Buffer) => unknown {
  return (b) => {
    try {
      return deserialize(b);
    } catch (err) {
      return { [UNDECODABLE]: err instanceof Error ? err.message : String(err) };
    }
  };
}

/** checkedStream yields a client stream's messages and throws InvalidArgumentError at the first that did not decode. */
async function* checkedStream(requests: AsyncIterable<unknown>, path: string): AsyncIterable<unknown> {
  for await (const r of requests) {
    if (isUndecodable(r)) throw new InvalidArgumentError(`${path}: a message of the request stream is not a valid message of its type (${r[UNDECODABLE]}); the call ended`);
    yield r;
  }
}

const INSECURE = grpc.ServerCredentials.createInsecure();

export interface GrpcHostOptions {
  /** grpc-js server options (message size limits ...). */
  options: grpc.ServerOptions;
  /** the middleware every call goes through, outermost first. */
  middleware: ServerMiddleware<any, any>[];
}

/**
 * HTTP/2 flow-control windows of every sandnode server and client, bytes: per stream (SETTINGS
 * initial window) and per connection. HTTP/2's default of 64 KiB made a bulk stream (a file
 * copy through the server: client -> server -> podd) wait for a WINDOW_UPDATE from a busy peer
 * every 64 KiB. At most this many unread bytes of one stream sit in a receiver's buffers.
 */
export const HTTP2_STREAM_WINDOW_BYTES = 4 * 1024 * 1024;
/** The connection-level window (several bulk streams at once), bytes. */
export const HTTP2_CONNECTION_WINDOW_BYTES = 16 * 1024 * 1024;

/**
 * How long GrpcHost.shutdown waits for accepted connections on a sniffing listener to send
 * their first bytes before its GOAWAY, ms. A client's HTTP/2 preface follows its connect at once;
 * one silent for this long is closed.
 */
export const SHUTDOWN_SNIFF_WAIT_MS = 2000;
/**
 * How long a connection that one of our listeners accepted has, from its start, to make its
 * first call before GrpcHost.shutdown sends GOAWAY, ms. A client becomes ready only when the
 * server's SETTINGS reached it; a GOAWAY before its first HEADERS makes grpc-js fail the
 * waiting call ("Failed to connect", UNAVAILABLE) instead of retrying it elsewhere, and Node
 * closes a session with no stream at once. With the grace the call is served here; the GOAWAY
 * then sends the client's next call to the next server.
 */
export const FRESH_CONNECTION_GRACE_MS = 500;

/** GrpcHost serves registered services on bound addresses and on injected listeners. */
export class GrpcHost {
  readonly server: grpc.Server;
  /** one injector per credentials (insecure for unix sockets, TLS for a TCP listener with certificates) */
  private readonly injectors = new Map<grpc.ServerCredentials, ReturnType<grpc.Server['createConnectionInjector']>>();
  private readonly listeners = new Set<net.Server>();
  /** connections accepted on a sniffing listener whose protocol is not told yet (sniffRaw), with the promise that settles when it is */
  private readonly sniffing = new Map<net.Socket, Promise<void>>();
  /** connections our listeners gave the HTTP/2 server in the last FRESH_CONNECTION_GRACE_MS, with when (ms since epoch) */
  private readonly fresh = new Map<net.Socket, number>();
  private readonly middleware: ServerMiddleware<any, any> | undefined;

  constructor(opts: GrpcHostOptions) {
    this.server = new grpc.Server(opts.options);
    // grpc-js has no server option for HTTP/2 flow control: its http2 servers take
    // `commonServerOptions.settings` (pinned 1.14.7), where the per-stream window is set
    const common = (this.server as unknown as { commonServerOptions?: { settings?: http2.Settings } }).commonServerOptions;
    if (!common) throw new Error('GrpcHost: this @grpc/grpc-js has no Server.commonServerOptions (pinned 1.14.7)');
    common.settings = { ...common.settings, initialWindowSize: HTTP2_STREAM_WINDOW_BYTES };
    this.middleware = opts.middleware.reduce<ServerMiddleware<any, any> | undefined>((acc, m) => (acc ? composeServerMiddleware(acc, m) : m), undefined);
  }

  /** add registers a nice-grpc service implementation. */
  add<D extends CompatServiceDefinition>(def: D, impl: ServiceImplementation<D, any>): void {
    const definition = defs.normalizeServiceDefinition(def);
    // A request that is not a valid message of its type (random bytes, a uint64 above 2^53 with
    // number longs) is bad input: INVALID_ARGUMENT, and the handler never runs (unary and
    // server-streaming calls; a client or bidi stream's bad message ends its call INVALID_ARGUMENT
    // where the handler reads it: grpc-js would answer INTERNAL).
    for (const m of Object.values(definition)) m.requestDeserialize = decodeOrMark(m.requestDeserialize);
    const handlers: Record<string, any> = {};
    for (const [name, m] of Object.entries(definition)) {
      const fn = (impl as Record<string, ((...a: unknown[]) => unknown) | undefined>)[name];
      // An RPC this build does not implement answers UNIMPLEMENTED (it is in a newer contract).
      const bound = fn
        ? m.requestStream
          ? (requests: AsyncIterable<unknown>, ...more: unknown[]) => fn.call(impl, checkedStream(requests, m.path), ...more)
          : fn.bind(impl)
        : m.responseStream
          ? // eslint-disable-next-line require-yield
            async function* () {
              throw new UnimplementedError(`${m.path} is not implemented by this version`);
            }
          : async () => {
              throw new UnimplementedError(`${m.path} is not implemented by this version`);
            };
      const make = !m.requestStream
        ? !m.responseStream
          ? unary.createUnaryMethodHandler
          : serverStream.createServerStreamingMethodHandler
        : !m.responseStream
          ? clientStream.createClientStreamingMethodHandler
          : bidi.createBidiStreamingMethodHandler;
      const handler = make(m, bound, this.middleware);
      handlers[name] = (call: any, ...rest: any[]) => {
        if (isUndecodable(call.request)) {
          const status = { code: grpc.status.INVALID_ARGUMENT, details: boundDetails(`${m.path}: the request is not a valid message of its type (${call.request[UNDECODABLE]}); nothing was done`) };
          if (typeof rest[0] === 'function') rest[0](status);
          else call.emit('error', status);
          return;
        }
        stampDeadline(call);
        stampPeer(call);
        return handler(call, ...rest);
      };
    }
    this.server.addService(defs.toGrpcJsServiceDefinition(definition), handlers);
  }

  /** bind listens on a gRPC address ("unix:///abs.sock" or "host:port"); returns the port. */
  bind(address: string): Promise<number> {
    return new Promise((resolve, reject) => {
      this.server.bindAsync(address, INSECURE, (err, port) => (err ? reject(err) : resolve(port)));
    });
  }

  /**
   * serveListener serves gRPC on connections accepted by a listening net.Server we own (e.g.
   * `net.createServer().listen({ fd })`), with creds (default insecure: plaintext HTTP/2; TLS
   * credentials make each connection a TLS one first). With raw, a connection whose first
   * bytes are raw.magic goes to raw.handle instead (bulk-channel.ts sniffRaw). Returns the net.Server.
   */
  serveListener(listener: net.Server, creds: grpc.ServerCredentials = INSECURE, raw?: RawProtocol): net.Server {
    let injector = this.injectors.get(creds);
    if (!injector) this.injectors.set(creds, (injector = this.server.createConnectionInjector(creds)));
    const inject = (socket: net.Socket) => {
      this.noteFresh(socket);
      injector.injectConnection(socket);
    };
    const sniff = (socket: net.Socket) => {
      const settled = sniffRaw(socket, raw!, inject);
      this.sniffing.set(socket, settled);
      void settled.then(() => this.sniffing.delete(socket));
    };
    listener.on('connection', raw ? sniff : inject);
    this.listeners.add(listener);
    return listener;
  }

  /**
   * stopAccepting closes our own listeners: accepting stops at once; connections they accepted
   * keep running. (net.Server.close's callback waits for every such connection to end, so it
   * is not awaited: that would wait for clients that keep their connection open.)
   */
  stopAccepting(): void {
    for (const l of this.listeners) l.close();
    this.listeners.clear();
  }

  /**
   * settleSniffing waits, up to waitMs, for the connections this host accepted on a sniffing
   * listener to tell their protocol (a gRPC client sends its preface at once), so that each is
   * in the HTTP/2 server before it sends GOAWAY; the ones still silent then are closed. Before,
   * a connection whose preface came after tryShutdown got a session that nothing waited for,
   * and the retiring server exited under it: its call failed ECONNRESET
   * (handover-fresh-conn.it.test.ts, 1 of 250 fresh unix connections in CI).
   */
  private async settleSniffing(waitMs: number): Promise<void> {
    if (this.sniffing.size === 0) return;
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([Promise.all(this.sniffing.values()), new Promise<void>((r) => (timer = setTimeout(r, waitMs)))]);
    clearTimeout(timer);
    for (const socket of this.sniffing.keys()) socket.destroy();
    this.sniffing.clear();
  }

  /** noteFresh records when socket went to the HTTP/2 server (for FRESH_CONNECTION_GRACE_MS); entries past the grace are dropped. */
  private noteFresh(socket: net.Socket): void {
    const now = Date.now();
    // insertion order is time order: the old ones are at the front
    for (const [s, at] of this.fresh) {
      if (now - at < FRESH_CONNECTION_GRACE_MS) break;
      this.fresh.delete(s);
    }
    this.fresh.set(socket, now);
    socket.once('close', () => this.fresh.delete(socket));
  }

  /** graceFresh waits until every open connection on our listeners is FRESH_CONNECTION_GRACE_MS old, waitMs at most. */
  private async graceFresh(waitMs: number): Promise<void> {
    let youngest: number | undefined;
    for (const [s, at] of this.fresh) if (!s.destroyed) youngest = at;
    this.fresh.clear();
    if (youngest === undefined) return;
    const left = Math.min(waitMs, youngest + FRESH_CONNECTION_GRACE_MS - Date.now());
    if (left > 0) await new Promise((r) => setTimeout(r, left));
  }

  /**
   * shutdown: stop accepting; let accepted connections on sniffing listeners tell their protocol
   * (SHUTDOWN_SNIFF_WAIT_MS at most) and give each connection on our listeners
   * FRESH_CONNECTION_GRACE_MS from its start to make its first call, both within drainMs; then
   * GOAWAY on every connection, wait for running calls; force after drainMs.
   */
  async shutdown(drainMs: number): Promise<void> {
    const t0 = Date.now();
    this.stopAccepting();
    await this.settleSniffing(Math.min(drainMs, SHUTDOWN_SNIFF_WAIT_MS));
    await this.graceFresh(drainMs - (Date.now() - t0));
    await new Promise<void>((resolve) => {
      const timer = setTimeout(() => {
        this.server.forceShutdown();
        resolve();
      }, drainMs);
      this.server.tryShutdown(() => {
        clearTimeout(timer);
        resolve();
      });
    });
  }
}
