/**
 * ServerGuards: the limits of every sandnode gRPC server that grpc-js does not have as options
 * (issue 10 §5: 250 held incomplete 4 MB requests grew the server to 1.1 GiB; connections that
 * only sent the HTTP/2 preface were held for the 300 s idle timeout).
 *
 * - Per-method receive limits: each RPC accepts requests up to its largest real message plus a
 *   margin (METHOD_RECEIVE_LIMITS; 64 KiB for every RPC not listed). The gRPC length prefix is
 *   checked when its 5 bytes arrive, before any of the message is buffered: a longer one ends the
 *   call RESOURCE_EXHAUSTED at once.
 * - Held request bytes: the bytes of requests that have begun but not fully arrived are counted
 *   per connection and per server; a stream whose growth takes its connection above
 *   maxHeldRequestBytesPerConnection, or the server above maxHeldRequestBytes, ends
 *   RESOURCE_EXHAUSTED and its bytes are dropped at once (its later DATA is discarded, and the
 *   stream is reset). Requests that arrive whole in one read (every small call) never count. The
 *   decoder gets each DATA frame copied out of node's 64 KiB read buffer, so that the held bytes
 *   are what is held (a slice would keep the whole read buffer alive).
 * - Handshake timeout: a connection that has not opened a stream (sent HEADERS) within
 *   handshakeTimeoutMs of being accepted is sent GOAWAY and closed (nothing sent, only the
 *   preface, SETTINGS never finished).
 * - Per-peer connections: at most maxConnectionsPerPeer connections per peer key at once (TCP:
 *   the remote address; unix: the listening socket, until a peer-credential key is plugged in
 *   with setPeerKey). Each call on a connection above it is answered RESOURCE_EXHAUSTED, then
 *   the connection is closed (GOAWAY): the client sees why, not a silent drop.
 *
 * Hooks (grpc-js 1.14.7 internals, pinned, like grpc-host.ts uses nice-grpc's): a server
 * interceptor (`interceptors` server option) reaches the call's BaseServerInterceptingCall
 * (`nextCall` chain; its `stream`, `decoder`, `handler.path`), and `watch` adds a 'session'
 * listener to each http2 server in the grpc-js Server's private `http2Servers` map.
 */
import http2 from 'node:http2';
import type net from 'node:net';
import * as grpc from '@grpc/grpc-js';
import { HTTP2_CONNECTION_WINDOW_BYTES } from './grpc-host';

/** Receive limit of an RPC not in METHOD_RECEIVE_LIMITS, bytes (64 KiB: ids, names, paths, metadata). */
export const DEFAULT_METHOD_RECEIVE_BYTES = 64 * 1024;
const MiB = 1024 * 1024;

/**
 * METHOD_RECEIVE_LIMITS: receive limits (bytes, the gRPC message without its 5-byte prefix) of
 * the RPCs whose requests can be larger than DEFAULT_METHOD_RECEIVE_BYTES, by method path. The
 * figures are the contract's maxima (proto comments, services/server/src/core/validate.ts,
 * services/podd/src/core/limits.ts) plus a margin. A request above its RPC's limit is
 * RESOURCE_EXHAUSTED; one within it but above a field's contract limit gets the validator's
 * INVALID_ARGUMENT, as before.
 */
export const METHOD_RECEIVE_LIMITS: Readonly<Record<string, number>> = {
  // stdin at most 3 MiB + argv and env at most 1 MiB together, + their field framing
  '/sandnode.server.v1.SandboxService/Exec': 4 * MiB,
  '/sandnode.podd.v1.PoddService/Exec': 4 * MiB,
  // data at most 3 MiB + a path of at most 4 KiB; up to 4 MiB (grpc-js's limit) so that data
  // above 3 MiB still gets the contract's INVALID_ARGUMENT from the validator
  '/sandnode.server.v1.SandboxService/WriteFile': 4 * MiB,
  '/sandnode.podd.v1.PoddService/WriteFile': 4 * MiB,
  // streamed uploads: each data message at most 3 MiB (1 MiB from the CLI), like WriteFile
  '/sandnode.server.v1.SandboxService/UploadFile': 4 * MiB,
  '/sandnode.podd.v1.PoddService/UploadFile': 4 * MiB,
  // ExecStream: the first message carries argv and env (at most 1 MiB together, as Exec), later
  // ones stdin chunks as read (a pipe gives 64 KiB, which with its framing is above the 64 KiB
  // default: the stream was reset, "RST_STREAM with code 0", for any stdin above 64 KiB)
  '/sandnode.server.v1.SandboxService/ExecStream': 4 * MiB,
  '/sandnode.podd.v1.PoddService/ExecStream': 4 * MiB,
  // a VmSpec (drives, env) and a list of every device id of a node: well below 1 MiB
  '/sandnode.vmm.v1.VmService/CreateVm': MiB,
  '/sandnode.ublk.v1.DeviceService/HandoverAll': MiB,
};

/** The guard limits (part of ServerLimits, createServiceServer's `limits`). */
export interface GuardLimits {
  /** a connection that has opened no stream within this long after accept is sent GOAWAY and closed, ms */
  handshakeTimeoutMs: number;
  /** connections one peer (peer key) may have open at once; more are refused RESOURCE_EXHAUSTED */
  maxConnectionsPerPeer: number;
  /** bytes of incomplete requests one connection may hold, bytes */
  maxHeldRequestBytesPerConnection: number;
  /** bytes of incomplete requests the whole server may hold, bytes */
  maxHeldRequestBytes: number;
  /** receive limit of an RPC not in methodReceiveBytes, bytes */
  defaultMethodReceiveBytes: number;
  /** receive limits by method path, bytes (default METHOD_RECEIVE_LIMITS) */
  methodReceiveBytes: Readonly<Record<string, number>>;
}

/** The guard limits unless a component says otherwise. */
export const DEFAULT_GUARD_LIMITS: GuardLimits = {
  handshakeTimeoutMs: 10_000,
  maxConnectionsPerPeer: 256,
  maxHeldRequestBytesPerConnection: 16 * MiB,
  maxHeldRequestBytes: 64 * MiB,
  defaultMethodReceiveBytes: DEFAULT_METHOD_RECEIVE_BYTES,
  methodReceiveBytes: METHOD_RECEIVE_LIMITS,
};

/** PeerKey names the peer of an accepted connection; connections with the same key share maxConnectionsPerPeer. */
export type PeerKey = (socket: net.Socket) => string;

/** defaultPeerKey: `tcp:<remote address>`, or `unix:<listening socket path>` (every local peer of that socket). */
export const defaultPeerKey: PeerKey = (socket) => {
  if (socket.remoteAddress) return `tcp:${socket.remoteAddress}`;
  const addr = (socket as net.Socket & { server?: net.Server }).server?.address?.();
  return `unix:${typeof addr === 'string' ? addr : 'listener'}`;
};

/* eslint-disable @typescript-eslint/no-explicit-any */
/** What we use of grpc-js's StreamDecoder (1.14.7 stream-decoder.js). */
interface Decoder {
  write(data: Buffer): Buffer[];
  maxReadMessageLength: number;
  readState: number;
  readMessageSize: number;
  readMessageRemaining: number;
  readPartialMessage: Buffer[];
}
/** StreamDecoder's ReadState.READING_MESSAGE. */
const READING_MESSAGE = 2;

interface SessionState {
  held: number;
  refused?: string;
}

/** ServerGuards holds the counters of one server; see the file header. */
export class ServerGuards {
  private heldTotal = 0;
  private readonly sessions = new WeakMap<http2.Http2Session, SessionState>();
  private readonly perPeer = new Map<string, number>();
  private readonly watched = new WeakSet<object>();
  private peerKey: PeerKey = defaultPeerKey;

  constructor(private readonly limits: GuardLimits) {}

  /** setPeerKey replaces how a connection's peer is named (e.g. by SO_PEERCRED uid); applies to connections accepted after. */
  setPeerKey(fn: PeerKey): void {
    this.peerKey = fn;
  }

  /** heldBytes: bytes of incomplete requests the server holds now. */
  get heldBytes(): number {
    return this.heldTotal;
  }

  /** receiveLimitOf is the receive limit of the RPC at path, bytes. */
  receiveLimitOf(path: string): number {
    return this.limits.methodReceiveBytes[path] ?? this.limits.defaultMethodReceiveBytes;
  }

  /** watch hooks every http2 server the grpc-js server made so far (bound addresses, the connection injector); call after each bind/inject. */
  watch(server: grpc.Server): void {
    const servers = (server as unknown as { http2Servers?: Map<http2.Http2Server, unknown> }).http2Servers;
    if (!servers) throw new Error('ServerGuards.watch: this @grpc/grpc-js has no Server.http2Servers (pinned 1.14.7)');
    for (const h of servers.keys()) {
      if (this.watched.has(h)) continue;
      this.watched.add(h);
      h.on('session', (s: http2.ServerHttp2Session) => this.onSession(s));
    }
  }

  private onSession(session: http2.ServerHttp2Session): void {
    try {
      session.setLocalWindowSize(HTTP2_CONNECTION_WINDOW_BYTES); // grpc-host.ts: the stream window is a SETTINGS value
    } catch {
      /* a session already closing */
    }
    const st: SessionState = { held: 0 };
    this.sessions.set(session, st);
    const key = this.peerKey(session.socket as net.Socket);
    const n = this.perPeer.get(key) ?? 0;
    if (n >= this.limits.maxConnectionsPerPeer) {
      st.refused = `peer ${key} has ${n} connections open, the most one peer may (server limit maxConnectionsPerPeer); close one and retry`;
    } else {
      this.perPeer.set(key, n + 1);
      session.once('close', () => {
        const m = (this.perPeer.get(key) ?? 1) - 1;
        if (m > 0) this.perPeer.set(key, m);
        else this.perPeer.delete(key);
      });
    }
    const timer = setTimeout(() => closeSession(session, 'no call within the handshake timeout'), this.limits.handshakeTimeoutMs);
    timer.unref();
    session.once('stream', () => clearTimeout(timer));
    session.once('close', () => clearTimeout(timer));
  }

  /** interceptor is the grpc-js server interceptor that applies the per-call limits; put it first in `interceptors`. */
  readonly interceptor: grpc.ServerInterceptor = (method, call) => {
    let base: any = call;
    while (base && !(base.decoder && base.stream)) base = base.nextCall;
    // grpc-js only calls the interface's methods: the call itself goes on (no wrapper per call)
    const same = call as grpc.ServerInterceptingCall;
    if (!base) return same; // not the grpc-js this was written for: grpc-js's own limits still hold
    const stream = base.stream as http2.ServerHttp2Stream;
    const session = stream.session as http2.ServerHttp2Session | undefined;
    const st = session ? this.sessions.get(session) : undefined;
    if (st?.refused) {
      const details = st.refused;
      return new grpc.ServerInterceptingCall(call, {
        start: () => {
          call.sendStatus({ code: grpc.status.RESOURCE_EXHAUSTED, details });
          if (session) setImmediate(() => closeSession(session, 'too many connections from this peer'));
        },
      });
    }
    this.guardDecoder(method.path, base.decoder as Decoder, stream, st);
    return same;
  };

  /** guardDecoder wraps one call's decoder: its per-method limit, and the held-bytes accounting. */
  private guardDecoder(path: string, dec: Decoder, stream: http2.ServerHttp2Stream, st: SessionState | undefined): void {
    const limit = this.receiveLimitOf(path);
    dec.maxReadMessageLength = limit;
    const write = dec.write.bind(dec);
    let held = 0;
    const account = (now: number) => {
      this.heldTotal += now - held;
      if (st) st.held += now - held;
      held = now;
    };
    const refuse = (details: string): never => {
      dec.readPartialMessage = [];
      account(0);
      dec.write = () => []; // what still arrives is dropped (grpc-js discards it once the status is sent)
      setImmediate(() => {
        if (!stream.closed) stream.close(http2.constants.NGHTTP2_NO_ERROR);
      });
      throw new Error(details);
    };
    stream.once('close', () => account(0));
    dec.write = (data: Buffer) => {
      let out: Buffer[];
      try {
        // node's http2 hands out DATA frames as slices of 64 KiB read buffers: a partial
        // message would keep each whole buffer alive (4x its bytes), so the decoder gets a copy
        out = write(data.byteLength === data.buffer.byteLength ? data : Buffer.from(data));
      } catch (err) {
        return refuse(`${path}: a request message is larger than this method accepts (${limit} bytes): ${(err as Error).message}; nothing was done`);
      }
      const now = dec.readState === READING_MESSAGE ? dec.readMessageSize - dec.readMessageRemaining : 0;
      const grew = now > held;
      account(now);
      if (grew && st && st.held > this.limits.maxHeldRequestBytesPerConnection) {
        return refuse(
          `${path}: this connection holds ${st.held} bytes of incomplete requests, more than the server allows (maxHeldRequestBytesPerConnection ${this.limits.maxHeldRequestBytesPerConnection}); nothing was done`,
        );
      }
      if (grew && this.heldTotal > this.limits.maxHeldRequestBytes) {
        return refuse(
          `${path}: the server holds ${this.heldTotal} bytes of incomplete requests, more than it allows (maxHeldRequestBytes ${this.limits.maxHeldRequestBytes}); nothing was done, retry later`,
        );
      }
      return out;
    };
  }
}

/** closeSession sends GOAWAY (NO_ERROR, the reason as debug data), then closes; destroyed after 1 s if the peer does not let it close. */
function closeSession(session: http2.ServerHttp2Session, reason: string): void {
  if (session.closed || session.destroyed) return;
  try {
    session.goaway(http2.constants.NGHTTP2_NO_ERROR, 0, Buffer.from(reason));
  } catch {
    /* already going away */
  }
  session.close();
  setTimeout(() => session.destroy(), 1000).unref();
}
