/**
 * createServiceClient: the one way a sandnode component calls another. Every call has a
 * deadline (unary calls get DEFAULT_CALL_TIMEOUT_MS unless the caller passes one; streams get
 * none by default because they run as long as their command), and idempotent calls (those
 * marked `idempotency_level` in the proto) are retried on UNAVAILABLE with backoff by the
 * nice-grpc retry middleware. A call whose request has a `request_id` field (CreateSandbox,
 * ForkSandbox) is idempotent only by that key: it is retried when request_id is set and never
 * when it is empty, whatever the proto's option says ({@link requestIdRetryMiddleware}).
 * A client made with `peer` (peer-connect.ts) also waits, within a bound, for a restarting peer
 * and sends again a call that never left (any RPC), and names the peer when it stays away.
 */
import { createChannel, createClientFactory } from 'nice-grpc';
import type { Channel, Client, ClientMiddleware, CompatServiceDefinition } from 'nice-grpc';
import { deadlineMiddleware, type DeadlineOptions } from 'nice-grpc-client-middleware-deadline';
import { retryMiddleware, type RetryOptions } from 'nice-grpc-client-middleware-retry';
import { Status } from 'nice-grpc-common';
import { hasFeature, requireFeature } from './features';
import { VersionServiceDefinition, type GetVersionResponse } from './gen/sandnode/common/v1/version';
import { MAX_MESSAGE_BYTES } from './server';
import { HTTP2_STREAM_WINDOW_BYTES } from './grpc-host';
import { epochClientMiddleware } from './epoch-fence';
import { bearerMiddleware, channelCredentials, type ClientAuth } from './client-auth';
import { clientMetricsMiddleware } from './grpc-metrics';
import { connectAttemptMiddleware, connectBoundMiddleware, type PeerConnect } from './peer-connect';

/** Default deadline of a unary call, in ms. */
export const DEFAULT_CALL_TIMEOUT_MS = 30_000;
/** Default number of attempts for an idempotent call (first try + retries). */
export const DEFAULT_RETRY_ATTEMPTS = 5;
/** Base backoff between retries, in ms (doubles each attempt, with jitter). */
export const DEFAULT_RETRY_BASE_DELAY_MS = 50;

export type SandnodeCallOptions = DeadlineOptions & RetryOptions;
export type ServiceClient<D extends CompatServiceDefinition> = Client<D, SandnodeCallOptions>;

/**
 * createSandnodeChannel opens a channel to "unix:///abs.sock" or "host:port" (TLS when auth names
 * a CA: client-auth.ts). maxReceiveBytes: the largest message taken from the peer (default
 * MAX_MESSAGE_BYTES); a larger one fails its call with RESOURCE_EXHAUSTED.
 */
export function createSandnodeChannel(address: string, auth?: ClientAuth, maxReceiveBytes = MAX_MESSAGE_BYTES): Channel {
  return createChannel(address, channelCredentials(auth), {
    'grpc.max_receive_message_length': maxReceiveBytes,
    'grpc.max_send_message_length': MAX_MESSAGE_BYTES,
    // the receive window of a bulk stream (a download), as the servers' (grpc-host.ts)
    'grpc-node.flow_control_window': HTTP2_STREAM_WINDOW_BYTES,
    // Peers on a node restart in well under a second (upgrades, slot moves): reconnect fast
    // instead of grpc's default backoff of up to 120 s.
    'grpc.initial_reconnect_backoff_ms': 100,
    'grpc.max_reconnect_backoff_ms': 1000,
  });
}

export interface ServiceClientOptions {
  /** Deadline of unary calls in ms (default DEFAULT_CALL_TIMEOUT_MS). */
  timeoutMs?: number;
  /** Attempts for idempotent calls (default DEFAULT_RETRY_ATTEMPTS). */
  retryAttempts?: number;
  /** The caller's epoch, sent as `sandnode-epoch` on every call (the active server's). */
  epoch?: () => number;
  /** a bearer token sent on every call (client-auth.ts) */
  token?: string;
  /**
   * the peer behind channel: calls wait up to min(deadline, peer.waitMs) for a restarting peer,
   * a call that never left is sent again, and one that still finds no peer is UNAVAILABLE naming
   * it (peer-connect.ts). Without it calls fail as grpc-js says.
   */
  peer?: PeerConnect;
}

// grpc_client_* metrics (grpc-metrics.ts) after retries: one count per attempt, as go-grpc-prometheus
const factory = createClientFactory().use(retryMiddleware).use(deadlineMiddleware).use(clientMetricsMiddleware);

/** peerFactory is factory with the connect middlewares of peer-connect.ts: one per attempt inside the retries, the bound outside the deadline. */
function peerFactory(channel: Channel, peer: PeerConnect): typeof factory {
  return createClientFactory()
    .use(connectAttemptMiddleware(channel, peer))
    .use(retryMiddleware)
    .use(deadlineMiddleware)
    .use(clientMetricsMiddleware)
    .use(connectBoundMiddleware(peer)) as unknown as typeof factory;
}

/**
 * requestIdMethods lists the paths ("/pkg.Service/Method") of def's unary methods whose
 * request message has a `requestId` field (ts-proto definitions; other shapes list none).
 */
export function requestIdMethods(def: CompatServiceDefinition): Set<string> {
  const out = new Set<string>();
  const d = def as { fullName?: string; methods?: Record<string, { name?: string; requestStream?: boolean; responseStream?: boolean; requestType?: { fromPartial?: (o: object) => object } }> };
  if (typeof d.fullName !== 'string' || !d.methods) return out;
  for (const m of Object.values(d.methods)) {
    if (m.requestStream || m.responseStream || !m.name || typeof m.requestType?.fromPartial !== 'function') continue;
    if ('requestId' in m.requestType.fromPartial({})) out.add(`/${d.fullName}/${m.name}`);
  }
  return out;
}

/**
 * requestIdRetryMiddleware makes retries of the listed methods depend on the request's
 * request_id: with a non-empty one the call is retried (unless the caller passes `retry:
 * false`), with none it is sent once, even when the proto marks the method IDEMPOTENT (a second
 * attempt could create a second sandbox).
 */
export function requestIdRetryMiddleware(paths: ReadonlySet<string>): ClientMiddleware<object, RetryOptions> {
  return async function* requestIdRetry(call, options) {
    if (!paths.has(call.method.path)) return yield* call.next(call.request, options);
    const requestId = (call.request as { requestId?: unknown }).requestId;
    const keyed = typeof requestId === 'string' && requestId !== '';
    return yield* call.next(call.request, { ...options, retry: keyed && options.retry !== false });
  };
}

/** createServiceClient makes a client of def on channel with the common middleware. */
export function createServiceClient<D extends CompatServiceDefinition>(def: D, channel: Channel, opts: ServiceClientOptions = {}): ServiceClient<D> {
  const methods = (typeof def === 'object' && 'methods' in def ? (def as { methods: Record<string, { responseStream: boolean }> }).methods : def) as Record<string, { responseStream?: boolean }>;
  const defaults: Record<string, SandnodeCallOptions> = {};
  for (const [name, m] of Object.entries(methods)) {
    defaults[name] = {
      retryMaxAttempts: opts.retryAttempts ?? DEFAULT_RETRY_ATTEMPTS,
      retryBaseDelayMs: DEFAULT_RETRY_BASE_DELAY_MS,
      retryMaxDelayMs: 1000,
      retryableStatuses: [Status.UNAVAILABLE],
      ...(m.responseStream ? {} : { deadline: opts.timeoutMs ?? DEFAULT_CALL_TIMEOUT_MS }),
    };
  }
  const keyed = requestIdMethods(def);
  const base = opts.peer ? peerFactory(channel, opts.peer) : factory;
  const f0 = keyed.size > 0 ? base.use(requestIdRetryMiddleware(keyed)) : base;
  const f1 = opts.epoch ? f0.use(epochClientMiddleware(opts.epoch)) : f0;
  const f = opts.token ? f1.use(bearerMiddleware(opts.token)) : f1;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  return f.create(def, channel, defaults as any) as ServiceClient<D>;
}

/**
 * PeerFeatures learns a peer's features once per connection (GetVersion) and answers
 * `require(feature)`: a FAILED_PRECONDITION that names the peer, its version and the missing
 * feature when the peer lacks it. Never infer features from version numbers.
 */
export class PeerFeatures {
  private version: Promise<GetVersionResponse> | undefined;
  private readonly client: ServiceClient<typeof VersionServiceDefinition>;

  /**
   * peer: as ServiceClientOptions.peer (wait for a restarting peer, name it when it stays away).
   * mapError: what a failed GetVersion rejects with instead of the ClientError (a caller's own
   * peer-error mapping, so that GetVersion fails like the peer's other calls).
   */
  constructor(
    channel: Channel,
    private readonly peerName: string,
    peer?: PeerConnect,
    private readonly mapError?: (err: unknown) => unknown,
  ) {
    this.client = createServiceClient(VersionServiceDefinition, channel, { timeoutMs: 5000, ...(peer ? { peer } : {}) });
  }

  /** get returns the peer's GetVersion answer, asking once. */
  get(): Promise<GetVersionResponse> {
    if (!this.version) {
      const map = this.mapError;
      this.version = map ? this.client.getVersion({}).catch((err: unknown) => Promise.reject(map(err))) : this.client.getVersion({});
      this.version.catch(() => {
        this.version = undefined; // ask again next time
      });
    }
    return this.version;
  }

  /** has says whether the peer lists feature. */
  async has(feature: string): Promise<boolean> {
    return hasFeature(await this.get(), feature);
  }

  /** require throws FailedPreconditionError unless the peer lists feature. */
  async require(feature: string): Promise<void> {
    const v = await this.get();
    requireFeature({ ...v, component: this.peerName }, feature);
  }

  /** reset forgets the cached answer (call after reconnecting to a restarted peer). */
  reset(): void {
    this.version = undefined;
  }
}

/**
 * askVersion asks whatever serves address for GetVersion, over a channel of its own that is
 * closed afterwards. Throws the ClientError when nothing answers within timeoutMs.
 */
export async function askVersion(address: string, opts: { timeoutMs?: number; retryAttempts?: number } = {}): Promise<GetVersionResponse> {
  const ch = createSandnodeChannel(address);
  try {
    return await createServiceClient(VersionServiceDefinition, ch, { timeoutMs: opts.timeoutMs ?? 2000, retryAttempts: opts.retryAttempts ?? 1 }).getVersion({});
  } finally {
    ch.close();
  }
}
