/**
 * Who may call a sandnode gRPC server (issue 10 §4). Two halves:
 *
 * - stampPeer (called by GrpcHost for every call): finds the call's connection and writes what
 *   the transport proves about the caller into the call's metadata under PEER_METADATA_KEY
 *   (removing any value a client sent): a unix socket's peer credentials (SO_PEERCRED, read
 *   once per connection), or "tcp" / "tls" (a TLS connection got here only with a client
 *   certificate the CA signed: grpc-js ends the handshake otherwise).
 * - authMiddleware(policy): the first thing every call meets after error mapping. A unix peer
 *   must be root or in policy.unixGroups (else PERMISSION_DENIED naming its uid); a plaintext
 *   TCP caller must send `authorization: Bearer <secret>` that policy.verifyToken accepts (else
 *   UNAUTHENTICATED); a TLS caller is an admin unless it sends a token, whose role then applies.
 *   A `read` caller may call only methods marked NO_SIDE_EFFECTS (and Health, Version,
 *   reflection): anything else is PERMISSION_DENIED. The role found is handed to the handler
 *   as the context's callerRole (SandnodeCallContext), so a read caller's calls can be no
 *   activity of a sandbox and never wake one (services/server rpc/idle-hooks.ts). Health checks need no credentials (probes).
 *   Nothing of the service runs for a caller that is refused. A streaming call (Exec) of a token
 *   caller has its token verified again before each message it relays and every
 *   policy.recheckMs (STREAM_TOKEN_RECHECK_MS): once the token is revoked or expired the stream
 *   ends UNAUTHENTICATED and the handler's signal is aborted (an Exec's command is killed).
 *
 * A server without a policy (the default) serves everyone who can reach its socket: the file
 * mode (0600, root) is then the only check.
 */
import { readFileSync } from 'node:fs';
import type net from 'node:net';
import tls from 'node:tls';
import * as grpc from '@grpc/grpc-js';
import type { CallContext, ServerMiddlewareCall } from 'nice-grpc';
import { SandnodeError, Status } from './errors';
import { peerCred } from './peer-cred';

/** The caller is known and may not do this (a unix peer that is not allowed, a read token calling a change). Maps to PERMISSION_DENIED. */
export class PermissionDeniedError extends SandnodeError {
  readonly code = Status.PERMISSION_DENIED;
}
/** The caller has no valid credentials (TCP without a token, an unknown, expired or revoked token). Maps to UNAUTHENTICATED. */
export class UnauthenticatedError extends SandnodeError {
  readonly code = Status.UNAUTHENTICATED;
}

/** The metadata key under which GrpcHost puts the caller's transport identity (JSON of Peer). */
export const PEER_METADATA_KEY = 'sandnode-peer';

/** What the transport proves about a caller. */
export type Peer =
  | { transport: 'unix'; uid: number; gid: number; groups: number[]; pid: number }
  /** credentials could not be read: such a caller is refused */
  | { transport: 'unix-unknown'; error: string }
  | { transport: 'tcp'; address: string }
  | { transport: 'tls'; address: string; subject: string };

/** A caller's role: admin may call everything, read only the methods without side effects. */
export type Role = 'admin' | 'read';

/** What a verified token says. */
export interface TokenIdentity {
  name: string;
  role: Role;
}

export interface AuthPolicy {
  /** gids whose members (primary or supplementary group of the peer process) may call over unix sockets, besides root */
  unixGroups?: number[];
  /** the name of that group, for messages */
  unixGroupName?: string;
  /**
   * verifyToken checks a bearer secret on every call (so a revocation is immediate). Returns
   * the identity, or throws UnauthenticatedError (unknown, expired, revoked). Undefined: no
   * token is accepted (TCP plaintext callers are then all UNAUTHENTICATED).
   */
  verifyToken?: (secret: string) => TokenIdentity;
  /** how often the token of a running streaming call is verified again besides before each message, ms (default STREAM_TOKEN_RECHECK_MS) */
  recheckMs?: number;
}

/** Default AuthPolicy.recheckMs: a revoked token's open stream ends at most this long after the revocation, ms. */
export const STREAM_TOKEN_RECHECK_MS = 1000;
/** Checks in a row that may fail with another error than UNAUTHENTICATED (records.db busy) before a token caller's stream ends with it. */
const RECHECK_TOLERATED_FAILURES = 5;

const peers = new WeakMap<object, Peer>();

interface CallInternals {
  call?: { nextCall?: unknown; stream?: { session?: { socket?: net.Socket } } };
  metadata?: grpc.Metadata;
}

/** sessionOf finds the http2 session of a grpc-js server call (pinned grpc-js 1.14: the intercepting call chain ends in the one that holds the stream). */
function sessionOf(call: CallInternals): { socket?: net.Socket } | undefined {
  let c = call.call as { nextCall?: unknown; stream?: { session?: { socket?: net.Socket } } } | undefined;
  for (let i = 0; c && i < 32; i++) {
    if (c.stream?.session) return c.stream.session;
    c = c.nextCall as typeof c;
  }
  return undefined;
}

/** peerOfSocket: what the transport proves about the caller on socket (read once per connection by stampPeer). */
export function peerOfSocket(socket: net.Socket): Peer {
  if (socket instanceof tls.TLSSocket) {
    const cert = socket.getPeerCertificate();
    return { transport: 'tls', address: `${socket.remoteAddress}:${socket.remotePort}`, subject: String(cert?.subject?.CN ?? '') };
  }
  if (socket.remoteAddress) return { transport: 'tcp', address: `${socket.remoteAddress}:${socket.remotePort}` };
  try {
    return { transport: 'unix', ...peerCred(socket) };
  } catch (err) {
    return { transport: 'unix-unknown', error: (err as Error).message };
  }
}

/**
 * peerKeyOfSocket names a connection's peer for the per-peer connection cap (server-guards.ts):
 * `uid:<n>` for a unix peer (SO_PEERCRED, so every process of one user shares one count, and
 * one user cannot use up another's), `tcp:<address>` for TCP and TLS (the port left out);
 * `unix:unknown` when the credentials cannot be read.
 */
export function peerKeyOfSocket(socket: net.Socket): string {
  if (socket.remoteAddress) return `tcp:${socket.remoteAddress}`;
  try {
    return `uid:${peerCred(socket).uid}`;
  } catch {
    return 'unix:unknown';
  }
}

/** stampPeer writes the caller's Peer into call.metadata (PEER_METADATA_KEY), removing one a client sent; a call whose connection is not found gets none (authMiddleware refuses it). */
export function stampPeer(call: CallInternals): void {
  if (!call.metadata) return;
  call.metadata.remove(PEER_METADATA_KEY);
  const session = sessionOf(call);
  const socket = session?.socket;
  if (!session || !socket) return;
  let peer = peers.get(session);
  if (!peer) peers.set(session, (peer = peerOfSocket(socket)));
  call.metadata.set(PEER_METADATA_KEY, JSON.stringify(peer));
}

/** peerOf reads the Peer that GrpcHost stamped into a call's metadata (undefined: none). */
export function peerOf(context: CallContext): Peer | undefined {
  const v = context.metadata.get(PEER_METADATA_KEY);
  return typeof v === 'string' ? (JSON.parse(v) as Peer) : undefined;
}

const FREE = ['/grpc.health.v1.Health/'];
const READABLE = ['/grpc.health.v1.Health/', '/sandnode.common.v1.VersionService/', '/grpc.reflection.'];

/** mayRead: whether a `read` caller may call this method (NO_SIDE_EFFECTS, or Health/Version/reflection). */
function mayRead(method: { path: string; options?: { idempotencyLevel?: string } }): boolean {
  return method.options?.idempotencyLevel === 'NO_SIDE_EFFECTS' || READABLE.some((p) => method.path.startsWith(p));
}

/** bearerOf: the secret of `authorization: Bearer <secret>`, undefined when absent; UnauthenticatedError when malformed. */
function bearerOf(context: CallContext): string | undefined {
  const v = context.metadata.get('authorization');
  if (v === undefined) return undefined;
  const m = /^Bearer ([A-Za-z0-9._~+/=-]{1,512})$/.exec(String(v));
  if (!m?.[1]) throw new UnauthenticatedError('the authorization header is not "Bearer <secret>"');
  return m[1];
}

/**
 * identify: who the caller is under policy, or the error to answer: PermissionDeniedError
 * (a unix peer that is neither root nor in the group), UnauthenticatedError (TCP without a
 * valid token). secret: the bearer secret that identified the caller (a token caller only).
 */
export function identify(policy: AuthPolicy, context: CallContext, rpc: string): { who: string; role: Role; secret?: string } {
  const peer = peerOf(context);
  if (!peer) throw new PermissionDeniedError(`${rpc}: the caller's connection could not be identified; nothing was done`);
  if (peer.transport === 'unix-unknown') throw new PermissionDeniedError(`${rpc}: the caller's peer credentials could not be read (${peer.error}); nothing was done`);
  if (peer.transport === 'unix') {
    const groups = policy.unixGroups ?? [];
    if (peer.uid === 0 || groups.includes(peer.gid) || peer.groups.some((g) => groups.includes(g))) return { who: `uid ${peer.uid}`, role: 'admin' };
    const allowed = groups.length ? `root and members of group ${policy.unixGroupName ?? groups.join(',')}` : 'root only';
    throw new PermissionDeniedError(`${rpc}: uid ${peer.uid} (gid ${peer.gid}, pid ${peer.pid}) may not call this socket (allowed: ${allowed}); nothing was done`);
  }
  const secret = bearerOf(context);
  if (secret === undefined) {
    if (peer.transport === 'tls') return { who: `client certificate "${peer.subject}"`, role: 'admin' };
    throw new UnauthenticatedError(`${rpc}: a TCP caller needs "authorization: Bearer <token>" (sandnode token create) or a client certificate; nothing was done`);
  }
  if (!policy.verifyToken) throw new UnauthenticatedError(`${rpc}: this server accepts no tokens; nothing was done`);
  const t = policy.verifyToken(secret);
  return { who: `token "${t.name}"`, role: t.role, secret };
}

/** authMiddleware enforces policy before anything else runs (see the file header for the rules and codes). */
export function authMiddleware(policy: AuthPolicy) {
  return async function* auth<Req, Res>(call: ServerMiddlewareCall<Req, Res>, context: CallContext) {
    const method = call.method as { path: string; options?: { idempotencyLevel?: string } };
    if (!FREE.some((p) => method.path.startsWith(p))) {
      const { who, role, secret } = identify(policy, context, method.path);
      if (role === 'read' && !mayRead(method)) throw new PermissionDeniedError(`${method.path}: ${who} has the read role and may not call a method that changes anything; nothing was done`);
      // the handler learns the role from here only (SandnodeCallContext.callerRole)
      const withRole = { ...context, callerRole: role } as CallContext;
      const verify = policy.verifyToken;
      if (secret !== undefined && verify && (call.method.requestStream || call.method.responseStream)) {
        return yield* tokenGuarded(call, withRole, () => verify(secret), policy.recheckMs ?? STREAM_TOKEN_RECHECK_MS);
      }
      return yield* call.next(call.request, withRole);
    }
    return yield* call.next(call.request, context);
  };
}

/**
 * tokenGuarded runs a streaming call of a token caller with its token verified again (verify:
 * throws UnauthenticatedError once it is revoked or expired) before each message relayed and
 * every recheckMs. A failed check ends the call with that error at once, even while the handler
 * waits for its next message, and aborts the signal the handler was given (the caller's signal
 * aborts it too). Another error (records.db busy) is tolerated RECHECK_TOLERATED_FAILURES times
 * in a row, then ends the call as well.
 */
async function* tokenGuarded<Req, Res>(call: ServerMiddlewareCall<Req, Res>, context: CallContext, verify: () => unknown, recheckMs: number) {
  const ac = new AbortController();
  const follow = () => ac.abort(context.signal.reason);
  if (context.signal.aborted) follow();
  else context.signal.addEventListener('abort', follow, { once: true });
  let failures = 0;
  let fail!: (err: unknown) => void;
  const failed = new Promise<never>((_, reject) => (fail = reject));
  failed.catch(() => undefined);
  let failure: unknown;
  const check = () => {
    if (failure !== undefined) return;
    try {
      verify();
      failures = 0;
      return;
    } catch (err) {
      if (!(err instanceof UnauthenticatedError) && ++failures < RECHECK_TOLERATED_FAILURES) return;
      failure = err instanceof UnauthenticatedError ? new UnauthenticatedError(`${call.method.path}: ${err.message}; the stream was ended`) : err;
    }
    ac.abort(failure);
    fail(failure);
  };
  const timer = setInterval(check, recheckMs);
  const it = call.next(call.request, { ...context, signal: ac.signal })[Symbol.asyncIterator]();
  let done = false;
  try {
    for (;;) {
      const r = await Promise.race([it.next(), failed]);
      if (r.done) {
        done = true;
        return r.value;
      }
      check();
      if (failure !== undefined) throw failure;
      yield r.value;
    }
  } catch (err) {
    if (failure === undefined) done = true; // the handler failed: it has ended
    throw err;
  } finally {
    clearInterval(timer);
    context.signal.removeEventListener('abort', follow);
    if (!done) {
      // a handler still waiting for its next message (its signal aborted) is closed once that settles
      const closing = it.return(undefined as never);
      if (failure === undefined) await closing;
      else void closing.catch(() => undefined);
    }
  }
}

/**
 * serverTlsCredentials: mutual-TLS credentials of a TCP listener from PEM files (ca: the CA its
 * clients' certificates must chain to; cert/key: the listener's pair). A client without a
 * certificate the CA signed fails the handshake (its calls are UNAVAILABLE). Errors: an Error
 * naming the config key whose file cannot be read.
 */
export function serverTlsCredentials(files: { tlsCa: string; tlsCert: string; tlsKey: string }): grpc.ServerCredentials {
  const read = (key: keyof typeof files) => {
    try {
      return readFileSync(files[key]);
    } catch (err) {
      throw new Error(`${key}: cannot read ${files[key]} (${(err as Error).message})`, { cause: err });
    }
  };
  return grpc.ServerCredentials.createSsl(read('tlsCa'), [{ private_key: read('tlsKey'), cert_chain: read('tlsCert') }], true);
}
