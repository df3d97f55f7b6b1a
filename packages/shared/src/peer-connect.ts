/**
 * Calls to a peer that is restarting (kill -9, then start): the channel sits in grpc-js's
 * reconnect backoff (up to grpc.max_reconnect_backoff_ms) after the peer is back, and a call
 * made then fails at once UNAVAILABLE "No connection established" without ever leaving the
 * process. Such a call is safe to send again whatever its idempotency, so a client made with a
 * {@link PeerConnect} waits for the channel to be READY and retries a call that was never sent,
 * both within one bound per call: min(the call's deadline, first time the peer was seen
 * unreachable + waitMs). Once a wait ran out, later calls fail at once while nothing listens at
 * the address (ENOENT/ECONNREFUSED), so a retrying caller does not wait a bound per attempt. A call that may have reached the peer (the connection dropped under
 * it) is not retried here: only the retry middleware retries it, and only if it is idempotent.
 * A peer still unreachable at the bound gives UNAVAILABLE naming the component, its address and
 * the connect error ("vmm-supervisor is not reachable (connect: ENOENT; for 3000 ms) ..."), never the
 * socket path (the message reaches public API callers).
 *
 * Two middlewares: {@link connectBoundMiddleware} (outside the deadline and retry middlewares:
 * sees the deadline, turns "unreachable" into the ClientError) and
 * {@link connectAttemptMiddleware} (innermost: one per attempt, waits and resends).
 */
import { createConnection } from 'node:net';
import { connectivityState } from '@grpc/grpc-js';
import { delay } from 'abort-controller-x';
import type { Channel, ClientMiddleware } from 'nice-grpc';
import { ClientError, Status } from 'nice-grpc-common';
import { UnavailableError } from './errors';

/** Default bound of the wait for a peer's channel to become READY, ms. */
export const DEFAULT_PEER_CONNECT_WAIT_MS = 3000;
/** How long the probe that names the connect error may take, ms. */
const PROBE_TIMEOUT_MS = 250;
/** How long before the call's deadline the wait gives up, ms (the deadline middleware's timer would win a tie). */
const DEADLINE_MARGIN_MS = 25;
/** Pause before sending again a call refused on a READY channel, ms. */
const RESEND_PAUSE_MS = 10;

/** Who a client calls, for the wait and the message when it stays unreachable. */
export interface PeerConnect {
  /** the component, as named to the user: "vmm-supervisor" */
  name: string;
  /** its address: "unix:///abs/path.sock" or "host:port" */
  address: string;
  /**
   * bound of the wait for READY, ms (default DEFAULT_PEER_CONNECT_WAIT_MS); 0 turns the wait off.
   * Keep it above the channel's grpc.max_reconnect_backoff_ms (1000 in createSandnodeChannel):
   * a shorter wait can end inside the backoff, before the channel tries the restarted peer.
   */
  waitMs?: number;
  /** what to do, ending the message (default "is it running? `sandnode up` starts it") */
  hint?: string;
}

/** Per-call state the two middlewares share (option `peerConnectState`). */
interface ConnectState {
  /** the call's deadline, ms since the epoch (Infinity: none) */
  deadlineAt: number;
  waitMs: number;
  /** when this call first found the peer unreachable, ms since the epoch */
  since: number | undefined;
}

/** until is when st's wait ends, ms since the epoch (starting it now if it has not started): just before the deadline, so the caller gets the UNAVAILABLE that names the peer. */
function until(st: ConnectState): number {
  st.since ??= Date.now();
  return Math.min(st.deadlineAt - DEADLINE_MARGIN_MS, st.since + st.waitMs);
}

/** Options the middlewares add to a call. */
export interface PeerConnectCallOptions {
  /** internal: set by connectBoundMiddleware */
  peerConnectState?: ConnectState;
}

/** Thrown by the inner middleware (not a ClientError, so the retry middleware does not retry it); the outer one makes the UNAVAILABLE. */
class PeerUnreachable extends Error {
  constructor(readonly down: Down) {
    super('peer unreachable');
  }
}

/** How a peer was found unreachable: the probe's connect answer and since when, ms since the epoch. */
interface Down {
  how: string;
  sinceMs: number;
}

/**
 * When each channel's peer was first found unreachable past a wait (deleted once READY). While
 * it lasts and a connect is refused outright (ENOENT, ECONNREFUSED: nothing listens), a call
 * fails at once instead of waiting again: a caller that retries (the shared client retries
 * UNAVAILABLE) does not wait a bound per attempt. A peer that listens again is waited for.
 */
const outages = new WeakMap<Channel, number>();

/** refused: the probe found nothing listening. */
const refused = (how: string) => how === 'ENOENT' || how === 'ECONNREFUSED';

/**
 * awaitPeer waits until channel is READY (undefined) or untilMs passes (how it was down); at
 * once when the channel's outage is known and nothing listens. signal's reason when it aborts.
 */
async function awaitPeer(channel: Channel, peer: PeerConnect, untilMs: number, signal?: AbortSignal): Promise<Down | undefined> {
  if (channel.getConnectivityState(false) === connectivityState.READY) {
    outages.delete(channel);
    return undefined;
  }
  const known = outages.get(channel);
  if (known !== undefined) {
    const how = await probeConnect(peer.address);
    if (refused(how)) return { how, sinceMs: known };
  }
  const t0 = Date.now();
  if (await waitReady(channel, untilMs, signal)) {
    outages.delete(channel);
    return undefined;
  }
  const sinceMs = known ?? t0;
  outages.set(channel, sinceMs);
  return { how: await probeConnect(peer.address), sinceMs };
}

/**
 * neverSent says whether err is grpc-js's answer to a call that never left the process: the
 * channel had no connection when the call was picked (pick_first's UNAVAILABLE "No connection
 * established"), or the picked connection closed before the call's stream could be opened
 * (INTERNAL "Failed to start HTTP/2 stream", grpc-js's progress NOT_STARTED).
 */
export function neverSent(err: unknown): boolean {
  if (!(err instanceof ClientError)) return false;
  if (err.code === Status.UNAVAILABLE) return /^(\w+: )?No connection established/.test(err.details);
  return err.code === Status.INTERNAL && err.details.startsWith('Failed to start HTTP/2 stream');
}

/** socketPath is the filesystem path of a "unix://" address, else the address itself. */
function displayAddress(address: string): string {
  return address.startsWith('unix://') ? address.slice('unix://'.length) : address;
}

/**
 * probeConnect connects once to address and says how it went: "ENOENT", "ECONNREFUSED", ...,
 * "accepted, but no gRPC answer" or "no answer within 250 ms". Never throws.
 */
export function probeConnect(address: string): Promise<string> {
  return new Promise((resolve) => {
    let sock;
    if (address.startsWith('unix://')) sock = createConnection({ path: displayAddress(address) });
    else {
      const i = address.lastIndexOf(':');
      sock = createConnection({ host: address.slice(0, i).replace(/^\[|\]$/g, ''), port: Number(address.slice(i + 1)) });
    }
    const done = (what: string) => {
      clearTimeout(timer);
      sock.destroy();
      resolve(what);
    };
    const timer = setTimeout(() => done(`no answer within ${PROBE_TIMEOUT_MS} ms`), PROBE_TIMEOUT_MS);
    sock.once('connect', () => done('accepted, but no gRPC answer'));
    sock.once('error', (err: NodeJS.ErrnoException) => done(err.code ?? err.message));
  });
}

/** unreachableMessage is the UNAVAILABLE text for peer, found unreachable (connect answer `how`) for forMs. */
export function unreachableMessage(peer: PeerConnect, how: string, forMs: number): string {
  // no host path: the message reaches public API callers (`sandnode status` shows the sockets)
  return `${peer.name} is not reachable (connect: ${how}; for ${Math.max(0, Math.round(forMs))} ms); ${peer.hint ?? 'is it running? `sandnode up` starts it'}`;
}

/**
 * waitReady resolves true once channel is READY (or SHUTDOWN: the call then fails as grpc-js
 * says), false when untilMs (ms since the epoch) passes first; rejects with signal's reason
 * when it aborts. Asks the channel to connect.
 */
export async function waitReady(channel: Channel, untilMs: number, signal?: AbortSignal): Promise<boolean> {
  for (;;) {
    signal?.throwIfAborted();
    const state = channel.getConnectivityState(true);
    if (state === connectivityState.READY || state === connectivityState.SHUTDOWN) return true;
    if (Date.now() >= untilMs) return false;
    await new Promise<void>((resolve, reject) => {
      const onAbort = () => reject(signal?.reason as Error);
      signal?.addEventListener('abort', onAbort, { once: true });
      channel.watchConnectivityState(state, new Date(untilMs), () => {
        signal?.removeEventListener('abort', onAbort);
        resolve();
      });
    });
  }
}

/**
 * connectBoundMiddleware (outermost of the two) starts a call's connect state from its
 * `deadline` option and turns the inner middleware's "unreachable" into ClientError
 * UNAVAILABLE with {@link unreachableMessage}.
 */
export function connectBoundMiddleware(peer: PeerConnect): ClientMiddleware<{ deadline?: Date | number }, PeerConnectCallOptions> {
  const waitMs = peer.waitMs ?? DEFAULT_PEER_CONNECT_WAIT_MS;
  return async function* connectBound(call, options) {
    if (waitMs <= 0) return yield* call.next(call.request, options);
    const d = options.deadline;
    const deadlineAt = d === undefined ? Infinity : d instanceof Date ? d.getTime() : Date.now() + d;
    const peerConnectState: ConnectState = { deadlineAt, waitMs, since: undefined };
    try {
      return yield* call.next(call.request, { ...options, peerConnectState });
    } catch (err) {
      if (err instanceof PeerUnreachable) throw new ClientError(call.method.path, Status.UNAVAILABLE, unreachableMessage(peer, err.down.how, Date.now() - err.down.sinceMs));
      throw err;
    }
  };
}

/**
 * connectAttemptMiddleware (innermost: runs for every attempt of the retry middleware) waits
 * for channel to be READY and sends the call; a call grpc-js answers "No connection
 * established" is sent again (unary and server-streaming calls: their request is a message,
 * not a stream that may be half read). Both end at the call's bound (see the file header).
 */
export function connectAttemptMiddleware(channel: Channel, peer: PeerConnect): ClientMiddleware<PeerConnectCallOptions & { signal?: AbortSignal }> {
  return async function* connectAttempt(call, options) {
    const { peerConnectState: st, ...rest } = options;
    if (!st) return yield* call.next(call.request, rest);
    for (;;) {
      const down = await awaitPeer(channel, peer, until(st), rest.signal);
      if (down) throw new PeerUnreachable(down);
      try {
        return yield* call.next(call.request, rest);
      } catch (err) {
        if (call.requestStream || !neverSent(err)) throw err;
        if (Date.now() >= until(st)) throw new PeerUnreachable({ how: await probeConnect(peer.address), sinceMs: st.since ?? Date.now() });
        // grpc-js said "no connection" on a channel it reports READY (a race): not a tight loop
        if (channel.getConnectivityState(false) === connectivityState.READY) await delay(rest.signal ?? new AbortController().signal, RESEND_PAUSE_MS);
      }
    }
  };
}

/**
 * requireReachable waits up to peer.waitMs (default DEFAULT_PEER_CONNECT_WAIT_MS) for channel to
 * be READY; UnavailableError (UNAVAILABLE) with {@link unreachableMessage} when it is not, so a
 * caller can fail before it makes anything. signal's reason when it aborts.
 */
export async function requireReachable(channel: Channel, peer: PeerConnect, signal?: AbortSignal): Promise<void> {
  const waitMs = peer.waitMs ?? DEFAULT_PEER_CONNECT_WAIT_MS;
  if (waitMs <= 0) return;
  const down = await awaitPeer(channel, peer, Date.now() + waitMs, signal);
  if (down) throw new UnavailableError(unreachableMessage(peer, down.how, Date.now() - down.sinceMs));
}
