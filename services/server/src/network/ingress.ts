/**
 * The ingress listener (feature "server.ingress.v1"; docs/network.md "Ingress"): HTTP/1.1 from
 * the host's clients to a port of a sandbox, routed and checked by ingress-route.ts.
 *
 *   request  -> dial sandbox address:port (refused: podd ForwardPort to 127.0.0.1:port when the
 *               podd has the feature, else 502) -> the request streamed upstream, the response
 *               streamed back (no whole body is buffered); the client connection is kept alive
 *   upgrade  -> dial, the request head written raw, then bytes both ways (the 101 comes from
 *               the sandbox's server) — WebSocket
 *   CONNECT  -> dial, `200 Connection Established`, then bytes both ways (raw TCP)
 *
 * Built on node:http: it streams bodies and hands upgrade/CONNECT sockets over raw, which is
 * everything a reverse proxy of one hop needs; a library (http-proxy) would add its own
 * buffering rules and still need the routing and the podd dial written here.
 *
 * Bounds: header bytes (maxHeaderBytes) and time (headersTimeoutMs, checked every second:
 * slowloris), total client connections (maxConnections: beyond, the oldest connection with
 * nothing in flight is closed for the new one; when all are busy, the new one is closed), forwarded connections per sandbox (maxPerSandbox: beyond, 429), idle time of a
 * client or tunnel connection (idleTimeoutMs), upstream connect time (connectTimeoutMs).
 * The `sandnode-access-token` header is never sent upstream.
 *
 * The caller listens (the handover's named listener "ingress": listen on the server only after
 * createIngress attached its handlers).
 */
import http from 'node:http';
import net from 'node:net';
import { pipeline, type Duplex, type Readable, type Writable } from 'node:stream';
import { connectTcp, type Logger } from '@sandnode/shared';
import type { NetworkDirectory, SandboxNetworkView } from '../core/network-directory';
import type { PoddRelay } from './ingress-podd';
import { BulkReader } from './relay';
import { ACCESS_TOKEN_HEADER, route, SANDBOX_ID_HEADER, SANDBOX_PORT_HEADER, tokenMatches } from './ingress-route';

/** Bounds of the ingress (config keys ingressMaxConnections, ingressMaxConnectionsPerSandbox, ...). */
export interface IngressLimits {
  /** client connections at once (default 4096) */
  maxConnections: number;
  /** forwarded requests, WebSockets and tunnels per sandbox at once (default 512) */
  maxPerSandbox: number;
  /** largest request head, bytes (default 16 KiB) */
  maxHeaderBytes: number;
  /** time to receive a request head, ms (default 10000) */
  headersTimeoutMs: number;
  /** a client connection or tunnel without traffic is closed after this, ms (default 120000) */
  idleTimeoutMs: number;
  /** upstream connect (direct or through podd), ms (default 5000) */
  connectTimeoutMs: number;
}

export const DEFAULT_INGRESS_LIMITS: IngressLimits = {
  maxConnections: 4096,
  maxPerSandbox: 512,
  maxHeaderBytes: 16 * 1024,
  headersTimeoutMs: 10_000,
  idleTimeoutMs: 120_000,
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
}

/** What the ingress tells the idle actions, and asks of them (core/idle.ts IdleController). */
export interface IngressIdle {
  /** activity of sandbox id (a request, a chunk either way) */
  activity(id: string): void;
  /** wake auto-resumes id and waits (bounded); the answer to give when it does not come up (409 auto_resume off, 503 + Retry-After) */
  wake(id: string): Promise<{ ok: true } | { ok: false; status: number; reason: string; retryAfterS?: number }>;
}

export interface Ingress {
  /** the HTTP server with every handler attached; the caller makes it listen */
  readonly server: http.Server;
  /** forwarded connections open now, per sandbox id */
  openPerSandbox(sandboxId: string): number;
  /** close stops accepting and ends every connection (clients and tunnels). */
  close(): Promise<void>;
}

const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'proxy-authenticate', 'proxy-authorization', 'te', 'trailer', 'transfer-encoding', 'upgrade', 'host']);
const OWN = new Set([ACCESS_TOKEN_HEADER, SANDBOX_ID_HEADER, SANDBOX_PORT_HEADER]);

class PortClosedError extends Error {}

/** How long a free upstream connection is kept, ms. */
const FREE_UPSTREAM_MS = 4000;

/** createIngress builds the ingress server (file header). */
export function createIngress(o: IngressOptions): Ingress {
  const limits = { ...DEFAULT_INGRESS_LIMITS, ...o.limits };
  const log = o.log.child({ part: 'ingress' });
  const open = new Map<string, number>();
  const tunnels = new Set<net.Socket | Duplex>();
  const server = http.createServer({
    maxHeaderSize: limits.maxHeaderBytes,
    headersTimeout: limits.headersTimeoutMs,
    requestTimeout: 0, // bodies may stream for long; idleTimeoutMs bounds silence instead
    connectionsCheckingInterval: 1000,
    keepAliveTimeout: limits.idleTimeoutMs,
  });
  // at most maxConnections client connections; when full, a new one takes the place of the
  // oldest connection with nothing in flight (silent, mid-head, or kept alive between requests),
  // so one client holding idle connections cannot lock every other client out; only when every
  // connection has a request or tunnel in flight is the new one closed
  const clients = new Map<net.Socket | Duplex, { busy: number }>(); // insertion order: oldest first
  server.on('connection', (sock: net.Socket) => {
    if (clients.size >= limits.maxConnections) {
      let idle: net.Socket | Duplex | undefined;
      for (const [c, st] of clients) {
        if (st.busy === 0) {
          idle = c;
          break;
        }
      }
      if (!idle) return sock.destroy();
      clients.delete(idle);
      idle.destroy();
    }
    clients.set(sock, { busy: 0 });
    sock.once('close', () => clients.delete(sock));
  });
  const busy = (sock: net.Socket | Duplex) => {
    const st = clients.get(sock);
    if (st) st.busy++;
    return st;
  };
  server.on('request', (req: http.IncomingMessage, res: http.ServerResponse) => {
    const st = busy(req.socket);
    if (st) res.once('close', () => st.busy--);
  });
  server.timeout = limits.idleTimeoutMs;

  const take = (id: string): boolean => {
    const n = open.get(id) ?? 0;
    if (n >= limits.maxPerSandbox) return false;
    open.set(id, n + 1);
    return true;
  };
  const give = (id: string) => {
    const n = (open.get(id) ?? 1) - 1;
    if (n <= 0) open.delete(id);
    else open.set(id, n);
  };

  /** dial: sandbox address:port (reading through `onread` when given), else (refused) podd ForwardPort, else PortClosedError. */
  const dial = async (view: SandboxNetworkView, port: number, onread?: net.OnReadOpts): Promise<Duplex> => {
    try {
      return await connectTcp({ host: view.address, port, noDelay: true, allowHalfOpen: true, ...(onread ? { onread } : {}) }, limits.connectTimeoutMs);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ECONNREFUSED') throw err;
    }
    if (o.podd) {
      const relayed = await withTimeout(o.podd.open(view.poddAddress, port), limits.connectTimeoutMs).catch((err: unknown) => {
        log.debug({ err, sandbox_id: view.sandboxId, port }, 'podd ForwardPort failed');
        throw new PortClosedError();
      });
      if (relayed) return relayed;
    }
    throw new PortClosedError();
  };

  /**
   * upstream: the pool of kept-alive connections to sandboxes (one per address:port, named by
   * the agent); a connection it lacks is dialled like a tunnel's (direct, else podd). A free
   * connection is closed after FREE_UPSTREAM_MS, below the usual 5 s keep-alive of servers, so
   * a request rarely meets one the sandbox is closing.
   */
  const upstream = new http.Agent({ keepAlive: true, maxFreeSockets: 64, timeout: FREE_UPSTREAM_MS });
  // pooled by sandbox id too: a connection to a deleted sandbox is never reused for the next owner of its address
  const baseName = upstream.getName.bind(upstream);
  upstream.getName = (opts?: http.AgentOptions & { sandnodeSandboxId?: string }) => `${baseName(opts as http.ClientRequestArgs)}:${opts?.sandnodeSandboxId ?? ''}`;
  upstream.createConnection = ((opts: net.NetConnectOpts & { sandnodeSandboxId?: string; port?: number }, cb: (err: Error | null, s?: Duplex) => void) => {
    const view = o.directory.bySandboxId(String(opts.sandnodeSandboxId));
    if (!view) return void process.nextTick(() => cb(new PortClosedError()));
    dial(view, Number(opts.port)).then(
      (s) => cb(null, s),
      (err: Error) => cb(err),
    );
    return undefined;
  }) as unknown as typeof upstream.createConnection;

  const dialError = (err: unknown, view: SandboxNetworkView, port: number): { status: number; reason: string } =>
    err instanceof PortClosedError
      ? { status: 502, reason: `nothing listens on port ${port} of sandbox ${view.sandboxId}` }
      : { status: 502, reason: `could not connect to port ${port} of sandbox ${view.sandboxId}: ${(err as Error).message}` };

  server.on('request', (req, res) => {
    const r = route(req.headers, o.directory, o.domain);
    if (!r.ok && r.notRunning && o.idle) {
      // a paused or hibernated sandbox is woken (bounded), then the request is routed again
      return void awake(r.notRunning).then((w) => (w.ok ? forward(req, res) : answer(res, w.status, w.reason, w.retryAfterS)));
    }
    forward(req, res, r);
  });
  const forward = (req: http.IncomingMessage, res: http.ServerResponse, routed?: ReturnType<typeof route>) => {
    const r = routed ?? route(req.headers, o.directory, o.domain);
    if (!r.ok) return answer(res, r.status, r.reason, r.retryAfterS);
    const { view, port } = r;
    o.idle?.activity(view.sandboxId);
    if (!take(view.sandboxId)) return answer(res, 429, `too many connections to sandbox ${view.sandboxId} (${limits.maxPerSandbox})`);
    let released = false;
    const release = () => {
      if (!released) give(view.sandboxId);
      released = true;
    };
    res.on('close', release);
    const up = http.request({
      host: view.address,
      port,
      method: req.method,
      path: req.url,
      headers: forwardHeaders(req, port),
      // kept-alive connections per sandbox and address:port; a new one is dialled by upstream.createConnection
      agent: upstream,
      sandnodeSandboxId: view.sandboxId,
    } as http.RequestOptions);
    // a body may stream for long (server-sent events, uploads): checked again before each chunk
    // either way, like a tunnel, so a sandbox made private or deleted stops being reached
    const revoked = tunnelRevoked(
      o.directory,
      view,
      one(req.headers[ACCESS_TOKEN_HEADER]),
      () => {
        log.info({ sandbox_id: view.sandboxId, port }, 'ingress: request cut: the sandbox is gone or no longer lets it in');
        up.destroy();
        res.destroy();
      },
      o.idle,
    );
    req.on('data', revoked);
    up.on('response', (ur) => {
      ur.on('data', revoked);
      const headers: http.OutgoingHttpHeaders = {};
      for (const [k, v] of Object.entries(ur.headers)) if (!HOP_BY_HOP.has(k) && v !== undefined) headers[k] = v;
      res.writeHead(ur.statusCode ?? 502, ur.statusMessage, headers);
      // the head goes out with the first body bytes (one write, one wakeup of the client); a
      // response whose body does not follow in this turn of the loop gets its head at once
      let bodyStarted = false;
      const started = () => (bodyStarted = true);
      ur.once('data', started);
      ur.once('end', started);
      setImmediate(() => {
        if (!bodyStarted && !res.destroyed) res.flushHeaders();
      });
      pipeBody(ur, res, () => ur.complete);
    });
    up.on('error', (err) => {
      if (res.headersSent) return void res.destroy();
      const e = dialError(err, view, port);
      answer(
        res,
        e.status,
        err instanceof PortClosedError || (err as NodeJS.ErrnoException).code === 'ECONNREFUSED' ? e.reason : `port ${port} of sandbox ${view.sandboxId} broke the response: ${err.message}`,
      );
    });
    res.on('close', () => {
      if (!res.writableFinished) up.destroy();
    });
    pipeBody(req, up, () => req.complete);
  };
  /** awake: the idle wake of id; a failure of the wake itself is a 503. */
  const awake = (id: string) =>
    o.idle!.wake(id).catch((err: unknown) => ({ ok: false as const, status: 503, reason: `sandbox ${id} could not be resumed: ${(err as Error).message}`, retryAfterS: 1 }));

  /** tunnel: WebSocket upgrade (head = the raw request) and CONNECT (reply 200 first). */
  const tunnel = (req: http.IncomingMessage, client: Duplex, head: Buffer, connect: boolean, woken = false): void => {
    client.on('error', () => undefined);
    const r = route(req.headers, o.directory, o.domain, connect ? req.url : undefined);
    if (!r.ok && r.notRunning && o.idle && !woken) {
      return void awake(r.notRunning).then((w) => (w.ok ? tunnel(req, client, head, connect, true) : rawAnswer(client, w.status, w.reason, w.retryAfterS)));
    }
    if (!r.ok) return rawAnswer(client, r.status, r.reason, r.retryAfterS);
    const { view, port } = r;
    o.idle?.activity(view.sandboxId);
    if (!take(view.sandboxId)) return rawAnswer(client, 429, `too many connections to sandbox ${view.sandboxId} (${limits.maxPerSandbox})`);
    const reader = new BulkReader();
    dial(view, port, reader.onread).then(
      (sock) => {
        if (client.destroyed) {
          give(view.sandboxId);
          return void sock.destroy();
        }
        sock.on('error', () => undefined);
        tunnels.add(client);
        if (connect) client.write('HTTP/1.1 200 Connection Established\r\n\r\n');
        else sock.write(rawHead(req, port));
        if (head.length) sock.write(head);
        if (client instanceof net.Socket) client.setTimeout(limits.idleTimeoutMs, () => client.destroy());
        let done = false;
        const end = () => {
          if (done) return;
          done = true;
          tunnels.delete(client);
          give(view.sandboxId);
          client.destroy();
          sock.destroy();
        };
        // the tunnel was checked when it opened; before a chunk is passed on either way it is
        // checked again against the directory in force, so a sandbox made private (a tunnel without
        // its token) or deleted (its address perhaps another sandbox's now) is not reached any more
        const revoked = tunnelRevoked(
          o.directory,
          view,
          one(req.headers[ACCESS_TOKEN_HEADER]),
          () => {
            log.info({ sandbox_id: view.sandboxId, port }, 'ingress: tunnel closed: the sandbox is gone or no longer lets it in');
            end();
          },
          o.idle,
        );
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
        give(view.sandboxId);
        const e = dialError(err, view, port);
        rawAnswer(client, e.status, e.reason);
      },
    );
  };
  server.on('upgrade', (req, socket, head) => {
    busy(socket); // a tunnel stays busy until it closes
    tunnel(req, socket, head, false);
  });
  server.on('connect', (req, socket, head) => {
    busy(socket);
    tunnel(req, socket, head, true);
  });
  server.on('clientError', (err, socket) => {
    const code = (err as NodeJS.ErrnoException).code;
    if (socket.writable && !socket.destroyed) {
      const status = code === 'HPE_HEADER_OVERFLOW' ? 431 : code === 'ERR_HTTP_REQUEST_TIMEOUT' ? 408 : 400;
      rawAnswer(socket, status, status === 431 ? 'request head too large' : status === 408 ? 'request head too slow' : 'bad request');
    } else socket.destroy();
  });

  return {
    server,
    openPerSandbox: (id) => open.get(id) ?? 0,
    close: () =>
      new Promise<void>((resolve) => {
        for (const t of tunnels) t.destroy();
        upstream.destroy();
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}

/**
 * tunnelRevoked gives the check a tunnel makes before each chunk: the directory's view of the
 * tunnel's sandbox is still `opened` (unchanged), or still the same sandbox at the same address
 * that is public or whose token is `token`; otherwise it calls `close` (once). Each chunk is
 * activity of the sandbox for idle (when given).
 */
function tunnelRevoked(dir: NetworkDirectory, opened: SandboxNetworkView, token: string | undefined, close: () => void, idle?: IngressIdle): () => void {
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

function one(h: string | string[] | undefined): string | undefined {
  return Array.isArray(h) ? h[0] : h;
}

/**
 * pipeBody streams a message body `src` into `dst` (backpressure; src's end ends dst) and
 * breaks both when either breaks: an error of either, or src closing before `complete()`
 * (a body cut short), destroys the other; dst closing destroys src. What stream.pipeline
 * does for two streams, without its per-call AbortController and end-of-stream watchers (a
 * measurable share of the CPU per proxied request).
 */
function pipeBody(src: Readable, dst: Writable, complete: () => boolean): void {
  src.on('error', (err) => dst.destroy(err));
  src.once('close', () => {
    if (!complete() && !dst.destroyed) dst.destroy();
  });
  dst.on('error', (err) => src.destroy(err));
  dst.once('close', () => {
    if (!src.destroyed && !src.readableEnded) src.destroy();
  });
  src.pipe(dst);
}

/** forwardHeaders: the client's headers without hop-by-hop ones and sandnode's own, plus X-Forwarded-*. */
function forwardHeaders(req: http.IncomingMessage, port: number): http.OutgoingHttpHeaders {
  const out: http.OutgoingHttpHeaders = {};
  const connTokens = new Set(
    String(req.headers.connection ?? '')
      .toLowerCase()
      .split(',')
      .map((s) => s.trim()),
  );
  for (const [k, v] of Object.entries(req.headers)) if (v !== undefined && !HOP_BY_HOP.has(k) && !OWN.has(k) && !connTokens.has(k)) out[k] = v;
  out.host = req.headers.host ?? `localhost:${port}`;
  const xff = req.headers['x-forwarded-for'];
  const peer = req.socket.remoteAddress ?? '';
  out['x-forwarded-for'] = xff ? `${String(xff)}, ${peer}` : peer;
  out['x-forwarded-proto'] = 'http';
  if (req.headers.host) out['x-forwarded-host'] = req.headers.host;
  return out;
}

/** rawHead: the request line and headers of an upgrade as sent upstream (without sandnode's own headers). */
function rawHead(req: http.IncomingMessage, port: number): string {
  let s = `${req.method} ${req.url} HTTP/1.1\r\n`;
  let host = false;
  for (let i = 0; i < req.rawHeaders.length; i += 2) {
    const k = req.rawHeaders[i] ?? '';
    if (OWN.has(k.toLowerCase())) continue;
    if (k.toLowerCase() === 'host') host = true;
    s += `${k}: ${req.rawHeaders[i + 1] ?? ''}\r\n`;
  }
  if (!host) s += `Host: localhost:${port}\r\n`;
  return `${s}\r\n`;
}

function answer(res: http.ServerResponse, status: number, reason: string, retryAfterS?: number): void {
  if (res.headersSent) return void res.destroy();
  const headers: http.OutgoingHttpHeaders = { 'content-type': 'text/plain; charset=utf-8' };
  if (retryAfterS !== undefined) headers['retry-after'] = String(retryAfterS);
  res.writeHead(status, headers);
  res.end(`${reason}\n`);
}

function rawAnswer(sock: Duplex, status: number, reason: string, retryAfterS?: number): void {
  const body = `${reason}\n`;
  const extra = retryAfterS !== undefined ? `Retry-After: ${retryAfterS}\r\n` : '';
  sock.end(
    `HTTP/1.1 ${status} ${http.STATUS_CODES[status] ?? ''}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\n${extra}Connection: close\r\n\r\n${body}`,
  );
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

/** ingressLimitsFromConfig: the IngressLimits of the server keys ingressMaxConnections, ingressMaxConnectionsPerSandbox, ingressHeadersTimeoutMs, ingressIdleTimeoutMs. */
export function ingressLimitsFromConfig(c: {
  ingressMaxConnections: number;
  ingressMaxConnectionsPerSandbox: number;
  ingressHeadersTimeoutMs: number;
  ingressIdleTimeoutMs: number;
}): Partial<IngressLimits> {
  return { maxConnections: c.ingressMaxConnections, maxPerSandbox: c.ingressMaxConnectionsPerSandbox, headersTimeoutMs: c.ingressHeadersTimeoutMs, idleTimeoutMs: c.ingressIdleTimeoutMs };
}
