/**
 * What both ingress engines (ingress-raw.ts, ingress-node-http.ts; chosen by config
 * `ingressEngine`) share, so they behave alike: the limits and options, the per-sandbox count,
 * the client-connection cap, the upstream dial (direct, else podd ForwardPort, else 502), the
 * auto-resume wake, the check a relay makes before each chunk, the upstream request head
 * (hop-by-hop fields dropped per RFC 9110 7.6.1, `sandnode-*` fields dropped, X-Forwarded-*
 * set, overwriting what the client sent) and the WebSocket/CONNECT tunnel.
 *
 *   tunnel: route (wake when paused) -> per-sandbox slot -> dial -> [CONNECT: 200 to the client |
 *           upgrade: the rewritten head upstream] -> bytes both ways (bulk reads from a direct
 *           upstream, relay.ts), each chunk checked and counted as activity -> either side's end,
 *           error or idle timeout closes both and frees the slot
 */
import http from 'node:http';
import net from 'node:net';
import { pipeline, type Duplex } from 'node:stream';
import { connectTcp, type Logger } from '@sandnode/shared';
import type { NetworkDirectory, SandboxNetworkView } from '../core/network-directory';
import type { PoddRelay } from './ingress-podd';
import { ACCESS_TOKEN_HEADER, route, SANDBOX_ID_HEADER, SANDBOX_PORT_HEADER, tokenMatches } from './ingress-route';
import { BulkReader } from './relay';

/** The ingress engines (config key ingressEngine): raw sockets (default) or node:http. */
export type IngressEngine = 'raw' | 'node-http';
export const INGRESS_ENGINES: readonly IngressEngine[] = ['raw', 'node-http'];

/** Bounds of the ingress (config keys ingressMaxConnections, ingressMaxConnectionsPerSandbox, ...). */
export interface IngressLimits {
  /** client connections at once (default 4096) */
  maxConnections: number;
  /** forwarded requests, WebSockets and tunnels per sandbox at once (default 512) */
  maxPerSandbox: number;
  /** largest request head, bytes (default 16 KiB); a larger one is answered 431 */
  maxHeaderBytes: number;
  /** time to receive a request head, ms (default 10000); then 408 */
  headersTimeoutMs: number;
  /** a client connection or tunnel without traffic is closed after this, ms (default 120000) */
  idleTimeoutMs: number;
  /**
   * a client that closed its side (FIN) while its answer is on the way: the exchange ends when
   * no byte passed for this long, ms (default 5000; at most idleTimeoutMs). A FIN cannot tell a
   * client gone from one that half-closed and still reads: a flowing answer goes on, a silent
   * one (long poll, SSE between beats) no longer holds the sandbox's slot for idleTimeoutMs
   * (512 such requests, every client gone, kept a sandbox's ingress at 429 for 2 min: attacker)
   */
  halfClosedIdleMs: number;
  /** upstream connect (direct or through podd), ms (default 5000) */
  connectTimeoutMs: number;
}

export const DEFAULT_INGRESS_LIMITS: IngressLimits = {
  maxConnections: 4096,
  maxPerSandbox: 512,
  maxHeaderBytes: 16 * 1024,
  headersTimeoutMs: 10_000,
  idleTimeoutMs: 120_000,
  halfClosedIdleMs: 5000,
  connectTimeoutMs: 5000,
};

export interface IngressOptions {
  directory: NetworkDirectory;
  /** ingressDomain: hosts are `<port>-<sandbox_id>.<domain>` */
  domain: string;
  log: Logger;
  limits?: Partial<IngressLimits>;
  /** ForwardPort through the sandbox's podd for ports only 127.0.0.1 inside listens on; none: 502 */
  podd?: PoddRelay;
  /** idle actions (core/idle.ts): requests and chunks are activity; a request to a sandbox that is not RUNNING wakes it first */
  idle?: IngressIdle;
  /** which engine serves (config ingressEngine; default 'raw') */
  engine?: IngressEngine;
}

/** What the ingress tells the idle actions, and asks of them (core/idle.ts IdleController). */
export interface IngressIdle {
  /** activity of sandbox id (a request, a chunk either way) */
  activity(id: string): void;
  /** wake auto-resumes id and waits (bounded); the answer to give when it does not come up (409 auto_resume off, 503 + Retry-After) */
  wake(id: string): Promise<{ ok: true } | { ok: false; status: number; reason: string; retryAfterS?: number }>;
}

export interface Ingress {
  /** the listening server with every handler attached (an http.Server for 'node-http', a net.Server for 'raw'); the caller makes it listen */
  readonly server: net.Server;
  /** the engine serving */
  readonly engine: IngressEngine;
  /** forwarded connections open now, per sandbox id */
  openPerSandbox(sandboxId: string): number;
  /** close stops accepting and ends every connection (clients and tunnels). */
  close(): Promise<void>;
}

/** Header fields as parsed: lower-cased name -> value(s). */
export type Headers = Record<string, string | string[] | undefined>;

/** Fields never sent upstream as the client sent them (RFC 9110 7.6.1, plus Host and X-Forwarded-*, which the ingress sets). */
const CONNECTION_FIELDS = new Set(['connection', 'keep-alive', 'proxy-connection', 'proxy-authenticate', 'proxy-authorization', 'te', 'upgrade']);
const OWN = new Set([ACCESS_TOKEN_HEADER, SANDBOX_ID_HEADER, SANDBOX_PORT_HEADER, 'x-forwarded-for', 'x-forwarded-proto', 'x-forwarded-host']);

export class PortClosedError extends Error {}

/** one: the first value of a header. */
export function one(h: string | string[] | undefined): string | undefined {
  return Array.isArray(h) ? h[0] : h;
}

const NO_TOKENS: ReadonlySet<string> = new Set();
/** The Connection values nearly every message carries, as they are sent by most clients and servers. */
const ONE_TOKEN: Record<'keep-alive' | 'close' | 'upgrade', ReadonlySet<string>> = { 'keep-alive': new Set(['keep-alive']), close: new Set(['close']), upgrade: new Set(['upgrade']) };

/** connectionTokens: the lower-cased tokens of the Connection field(s) (a set shared between calls: read it, never change it). */
export function connectionTokens(h: Headers): ReadonlySet<string> {
  const v = h.connection;
  if (v === undefined) return NO_TOKENS;
  if (v === 'keep-alive' || v === 'close' || v === 'upgrade') return ONE_TOKEN[v];
  const all = Array.isArray(v) ? v.join(',') : (v ?? '');
  return new Set(
    all
      .toLowerCase()
      .split(',')
      .map((s) => s.trim())
      .filter(Boolean),
  );
}

/**
 * forwardedFields: the [name, value] pairs sent upstream for a request with fields `raw` (as
 * received) from `peer`: connection-specific fields and those the Connection field names are
 * dropped (kept: Connection/Upgrade of an upgrade; Content-Length; Transfer-Encoding and Trailer
 * only when `keepFraming`: a body relayed as it came), sandnode's own fields and the client's X-Forwarded-*
 * dropped; first Host (the client's, else `localhost:<port>`), X-Forwarded-For (the peer),
 * -Proto (http), -Host (the client's Host), then the client's fields in their order.
 */
export function forwardedFields(raw: readonly (readonly [string, string])[], h: Headers, peer: string, port: number, o: { upgrade: boolean; keepFraming: boolean }): [string, string][] {
  const conn = connectionTokens(h);
  const out: [string, string][] = [];
  let host: string | undefined;
  for (const [name, value] of raw) {
    const k = name.toLowerCase();
    if (OWN.has(k)) continue;
    if (k === 'host') {
      host ??= value;
      continue;
    }
    if (o.upgrade && (k === 'connection' || k === 'upgrade')) {
      if (k === 'connection') out.push([name, 'Upgrade']);
      else out.push([name, value]);
      continue;
    }
    if (CONNECTION_FIELDS.has(k) || (conn.has(k) && k !== 'transfer-encoding' && k !== 'content-length')) continue;
    if (!o.keepFraming && (k === 'transfer-encoding' || k === 'trailer')) continue; // re-framed by node:http (Content-Length it keeps)
    out.push([name, value]);
  }
  const first: [string, string][] = [
    ['Host', host ?? `localhost:${port}`],
    ['X-Forwarded-For', peer],
    ['X-Forwarded-Proto', 'http'],
  ];
  if (host !== undefined) first.push(['X-Forwarded-Host', host]);
  return [...first, ...out];
}

/** requestHead: `METHOD target HTTP/1.1` and the fields, as bytes to write upstream (ends with the blank line). */
export function requestHead(method: string, target: string, fields: readonly (readonly [string, string])[]): string {
  let s = `${method} ${target} HTTP/1.1\r\n`;
  for (const [k, v] of fields) s += `${k}: ${v}\r\n`;
  return `${s}\r\n`;
}

/** rawAnswer writes a whole plain-text answer and ends the socket (Connection: close). */
export function rawAnswer(sock: Duplex, status: number, reason: string, retryAfterS?: number): void {
  sock.end(answerBytes(status, reason, retryAfterS, true));
}

/** answerBytes: a plain-text answer `reason\n` with status; `close` adds Connection: close. */
export function answerBytes(status: number, reason: string, retryAfterS: number | undefined, close: boolean): string {
  const body = `${reason}\n`;
  const extra = retryAfterS !== undefined ? `Retry-After: ${retryAfterS}\r\n` : '';
  return `HTTP/1.1 ${status} ${http.STATUS_CODES[status] ?? ''}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\n${extra}${close ? 'Connection: close\r\n' : ''}\r\n${body}`;
}

/**
 * tunnelRevoked gives the check a relay makes before each chunk: the directory's view of the
 * relay's sandbox is still `opened` (unchanged), or still the same sandbox at the same address
 * that is public or whose token is `token`; otherwise it calls `close` (once). Each chunk is
 * activity of the sandbox for idle (when given).
 */
export function tunnelRevoked(dir: NetworkDirectory, opened: SandboxNetworkView, token: string | undefined, close: () => void, idle?: IngressIdle): () => void {
  let seen: SandboxNetworkView | undefined = opened;
  let closed = false;
  return () => {
    if (closed) return;
    idle?.activity(opened.sandboxId);
    const now = dir.bySandboxId(opened.sandboxId);
    if (now === seen) return;
    seen = now;
    if (now && now.address === opened.address && (now.public || tokenMatches(token, now.accessTokenSha256))) return;
    closed = true;
    close();
  };
}

/** A client connection's place under maxConnections: busy > 0 while a request or tunnel is in flight. */
export interface ClientSlot {
  busy: number;
}

/** A WebSocket upgrade or CONNECT to relay (see the file header). */
export interface TunnelRequest {
  client: Duplex;
  /** bytes the client sent after the request head */
  rest: Buffer;
  headers: Headers;
  /** CONNECT: the authority (request target); undefined for an upgrade */
  connect?: string;
  /** upgrade: the head to write upstream for the routed port */
  upstreamHead: (port: number) => string;
}

/** The shared parts of one ingress (file header), made once per createIngress. */
export class IngressCore {
  readonly limits: IngressLimits;
  readonly log: Logger;
  readonly tunnels = new Set<Duplex>();
  private readonly open = new Map<string, number>();
  // insertion order: oldest first
  private readonly clients = new Map<Duplex, ClientSlot>();

  constructor(readonly o: IngressOptions) {
    this.limits = { ...DEFAULT_INGRESS_LIMITS, ...o.limits };
    this.log = o.log.child({ part: 'ingress', engine: o.engine ?? 'raw' });
  }

  /**
   * admit places a new client connection under maxConnections: when full, it takes the place of
   * the oldest connection with nothing in flight (silent, mid-head, or kept alive between
   * requests), so one client holding idle connections cannot lock every other client out; only
   * when every connection is busy is the new one closed (undefined).
   */
  admit(sock: Duplex): ClientSlot | undefined {
    if (this.clients.size >= this.limits.maxConnections) {
      let idle: Duplex | undefined;
      for (const [c, st] of this.clients) {
        if (st.busy === 0) {
          idle = c;
          break;
        }
      }
      if (!idle) {
        sock.destroy();
        return undefined;
      }
      this.clients.delete(idle);
      idle.destroy();
    }
    const st = { busy: 0 };
    this.clients.set(sock, st);
    sock.once('close', () => this.clients.delete(sock));
    return st;
  }

  /** slot: the ClientSlot of an admitted connection. */
  slot(sock: Duplex): ClientSlot | undefined {
    return this.clients.get(sock);
  }

  /** take counts one more forwarded connection to id; false at maxPerSandbox. */
  take(id: string): boolean {
    const n = this.open.get(id) ?? 0;
    if (n >= this.limits.maxPerSandbox) return false;
    this.open.set(id, n + 1);
    return true;
  }

  give(id: string): void {
    const n = (this.open.get(id) ?? 1) - 1;
    if (n <= 0) this.open.delete(id);
    else this.open.set(id, n);
  }

  openPerSandbox(id: string): number {
    return this.open.get(id) ?? 0;
  }

  tooMany(id: string): string {
    return `too many connections to sandbox ${id} (${this.limits.maxPerSandbox})`;
  }

  /** handle: the Ingress of an engine's server; close() stops accepting, ends the tunnels, then calls endAll (the engine's connections and pool). */
  handle(server: net.Server, endAll: () => void): Ingress {
    return {
      server,
      engine: this.o.engine ?? 'raw',
      openPerSandbox: (id) => this.openPerSandbox(id),
      close: () =>
        new Promise<void>((resolve) => {
          server.close(() => resolve());
          for (const t of this.tunnels) t.destroy();
          endAll();
        }),
    };
  }

  /** dial: sandbox address:port (reading through `onread` when given), else (refused) podd ForwardPort, else PortClosedError. */
  async dial(view: SandboxNetworkView, port: number, onread?: net.OnReadOpts): Promise<Duplex> {
    try {
      return await connectTcp({ host: view.address, port, noDelay: true, allowHalfOpen: true, ...(onread ? { onread } : {}) }, this.limits.connectTimeoutMs);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ECONNREFUSED') throw err;
    }
    if (this.o.podd) {
      const relayed = await withTimeout(this.o.podd.open(view.poddAddress, port), this.limits.connectTimeoutMs).catch((err: unknown) => {
        this.log.debug({ err, sandbox_id: view.sandboxId, port }, 'podd ForwardPort failed');
        throw new PortClosedError();
      });
      if (relayed) return relayed;
    }
    throw new PortClosedError();
  }

  /** dialError: the answer to a failed dial (502 naming the port and sandbox). */
  dialError(err: unknown, view: SandboxNetworkView, port: number): { status: number; reason: string } {
    return err instanceof PortClosedError || (err as NodeJS.ErrnoException).code === 'ECONNREFUSED'
      ? { status: 502, reason: `nothing listens on port ${port} of sandbox ${view.sandboxId}` }
      : { status: 502, reason: `could not connect to port ${port} of sandbox ${view.sandboxId}: ${(err as Error).message}` };
  }

  /** awake: the idle wake of id; a failure of the wake itself is a 503. */
  awake(id: string): Promise<{ ok: true } | { ok: false; status: number; reason: string; retryAfterS?: number }> {
    return this.o.idle!.wake(id).catch((err: unknown) => ({ ok: false as const, status: 503, reason: `sandbox ${id} could not be resumed: ${(err as Error).message}`, retryAfterS: 1 }));
  }

  /** revoked: tunnelRevoked for this ingress's directory and idle. */
  revoked(view: SandboxNetworkView, headers: Headers, close: () => void): () => void {
    return tunnelRevoked(this.o.directory, view, one(headers[ACCESS_TOKEN_HEADER]), close, this.o.idle);
  }

  /** tunnel relays a WebSocket upgrade or a CONNECT (file header); the client's slot stays busy until it closes. */
  tunnel(t: TunnelRequest, woken = false): void {
    const { client } = t;
    client.on('error', () => undefined);
    const r = route(t.headers as http.IncomingHttpHeaders, this.o.directory, this.o.domain, t.connect);
    if (!r.ok && r.notRunning && this.o.idle && !woken) {
      return void this.awake(r.notRunning).then((w) => (w.ok ? this.tunnel(t, true) : rawAnswer(client, w.status, w.reason, w.retryAfterS)));
    }
    if (!r.ok) return rawAnswer(client, r.status, r.reason, r.retryAfterS);
    const { view, port } = r;
    this.o.idle?.activity(view.sandboxId);
    if (!this.take(view.sandboxId)) return rawAnswer(client, 429, this.tooMany(view.sandboxId));
    const reader = new BulkReader();
    this.dial(view, port, reader.onread).then(
      (sock) => {
        if (client.destroyed) {
          this.give(view.sandboxId);
          return void sock.destroy();
        }
        sock.on('error', () => undefined);
        this.tunnels.add(client);
        if (t.connect !== undefined) client.write('HTTP/1.1 200 Connection Established\r\n\r\n');
        else sock.write(t.upstreamHead(port), 'latin1'); // the head's bytes as the client sent them (its strings are latin1)
        if (t.rest.length) sock.write(t.rest);
        if (client instanceof net.Socket) client.setTimeout(this.limits.idleTimeoutMs, () => client.destroy());
        let done = false;
        const end = () => {
          if (done) return;
          done = true;
          this.tunnels.delete(client);
          this.give(view.sandboxId);
          client.destroy();
          sock.destroy();
        };
        // checked when it opened; before a chunk is passed on either way it is checked again
        // against the directory in force, so a sandbox made private (a tunnel without its token)
        // or deleted (its address perhaps another sandbox's now) is not reached any more
        const revoked = this.revoked(view, t.headers, () => {
          this.log.info({ sandbox_id: view.sandboxId, port }, 'ingress: tunnel closed: the sandbox is gone or no longer lets it in');
          end();
        });
        client.on('data', revoked);
        pipeline(client, sock, end);
        if (sock instanceof net.Socket) {
          // dialled directly: bulk reads (relay.ts) to the client; its end ends the client, then both close
          reader.attach(sock, client, revoked);
          sock.once('end', () => client.end(end));
          sock.once('close', end);
        } else {
          sock.on('data', revoked);
          pipeline(sock, client, end);
        }
      },
      (err: unknown) => {
        this.give(view.sandboxId);
        const e = this.dialError(err, view, port);
        rawAnswer(client, e.status, e.reason);
      },
    );
  }
}

function withTimeout<T>(p: Promise<T>, ms: number): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`timed out after ${ms} ms`)), ms);
    p.then(
      (v) => {
        clearTimeout(t);
        resolve(v);
      },
      (e: unknown) => {
        clearTimeout(t);
        reject(e as Error);
      },
    );
  });
}
