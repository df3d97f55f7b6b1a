/**
 * The node:http ingress engine (config `ingressEngine: node-http`; the raw engine,
 * ingress-raw.ts, is the default). Routing, limits, the dial and the tunnels are the shared ones
 * (ingress-common.ts); this file is the HTTP exchange on node:http:
 *
 *   request  -> route -> dial through an http.Agent pool (direct, else podd) -> the request
 *               streamed upstream, the response streamed back (re-framed by node: no whole body
 *               is buffered); the client connection is kept alive
 *   upgrade / CONNECT -> the shared tunnel (the 101 comes from the sandbox's server)
 *   bad head -> 400 / 431 / 408 (node's parser: clientError)
 */
import http from 'node:http';
import type net from 'node:net';
import type { Duplex, Readable, Writable } from 'node:stream';
import { route } from './ingress-route';
import { forwardedFields, IngressCore, PortClosedError, rawAnswer, requestHead, type Headers, type Ingress, type IngressOptions } from './ingress-common';

const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'proxy-authenticate', 'proxy-authorization', 'te', 'trailer', 'transfer-encoding', 'upgrade']);

/** How long a free upstream connection is kept, ms (below the usual 5 s keep-alive of servers). */
export const FREE_UPSTREAM_MS = 4000;

/** createNodeHttpIngress builds the node:http engine (file header). */
export function createNodeHttpIngress(o: IngressOptions): Ingress {
  const core = new IngressCore({ ...o, engine: 'node-http' });
  const { limits, log } = core;
  const server = http.createServer({
    maxHeaderSize: limits.maxHeaderBytes,
    headersTimeout: limits.headersTimeoutMs,
    requestTimeout: 0, // bodies may stream for long; idleTimeoutMs bounds silence instead
    connectionsCheckingInterval: 1000,
    keepAliveTimeout: limits.idleTimeoutMs,
  });
  server.on('connection', (sock: net.Socket) => void core.admit(sock));
  const busy = (sock: Duplex) => {
    const st = core.slot(sock);
    if (st) st.busy++;
    return st;
  };
  server.on('request', (req: http.IncomingMessage, res: http.ServerResponse) => {
    const st = busy(req.socket);
    if (st) res.once('close', () => st.busy--);
  });
  server.timeout = limits.idleTimeoutMs;

  /**
   * upstream: the pool of kept-alive connections to sandboxes (one per address:port, named by
   * the agent, and by sandbox id: a connection to a deleted sandbox is never reused for the next
   * owner of its address); a connection it lacks is dialled like a tunnel's (direct, else podd).
   */
  const upstream = new http.Agent({ keepAlive: true, maxFreeSockets: 64, timeout: FREE_UPSTREAM_MS });
  const baseName = upstream.getName.bind(upstream);
  upstream.getName = (opts?: http.AgentOptions & { sandnodeSandboxId?: string }) => `${baseName(opts as http.ClientRequestArgs)}:${opts?.sandnodeSandboxId ?? ''}`;
  upstream.createConnection = ((opts: net.NetConnectOpts & { sandnodeSandboxId?: string; port?: number }, cb: (err: Error | null, s?: Duplex) => void) => {
    const view = o.directory.bySandboxId(String(opts.sandnodeSandboxId));
    if (!view) return void process.nextTick(() => cb(new PortClosedError()));
    core.dial(view, Number(opts.port)).then(
      (s) => cb(null, s),
      (err: Error) => cb(err),
    );
    return undefined;
  }) as unknown as typeof upstream.createConnection;

  server.on('request', (req, res) => {
    const r = route(req.headers, o.directory, o.domain);
    if (!r.ok && r.notRunning && o.idle) {
      // a paused or hibernated sandbox is woken (bounded), then the request is routed again
      return void core.awake(r.notRunning).then((w) => (w.ok ? forward(req, res) : answer(res, w.status, w.reason, w.retryAfterS)));
    }
    forward(req, res, r);
  });
  const forward = (req: http.IncomingMessage, res: http.ServerResponse, routed?: ReturnType<typeof route>) => {
    const r = routed ?? route(req.headers, o.directory, o.domain);
    if (!r.ok) return answer(res, r.status, r.reason, r.retryAfterS);
    const { view, port } = r;
    o.idle?.activity(view.sandboxId);
    if (!core.take(view.sandboxId)) return answer(res, 429, core.tooMany(view.sandboxId));
    let released = false;
    res.on('close', () => {
      if (!released) core.give(view.sandboxId);
      released = true;
    });
    const headers: http.OutgoingHttpHeaders = {};
    for (const [k, v] of forwardedFields(pairs(req.rawHeaders), req.headers, req.socket.remoteAddress ?? '', port, { upgrade: false, keepFraming: false })) {
      const key = k.toLowerCase();
      const had = headers[key];
      headers[key] = had === undefined ? v : Array.isArray(had) ? [...had, v] : [String(had), v];
    }
    const up = http.request({
      host: view.address,
      port,
      method: req.method,
      path: req.url,
      headers,
      agent: upstream,
      sandnodeSandboxId: view.sandboxId,
    } as http.RequestOptions);
    // a body may stream for long (server-sent events, uploads): checked again before each chunk
    // either way, like a tunnel, so a sandbox made private or deleted stops being reached
    const revoked = core.revoked(view, req.headers, () => {
      log.info({ sandbox_id: view.sandboxId, port }, 'ingress: request cut: the sandbox is gone or no longer lets it in');
      up.destroy();
      res.destroy();
    });
    req.on('data', revoked);
    up.on('response', (ur) => {
      ur.on('data', revoked);
      const out: http.OutgoingHttpHeaders = {};
      for (const [k, v] of Object.entries(ur.headers)) if (!HOP_BY_HOP.has(k) && v !== undefined) out[k] = v;
      res.writeHead(ur.statusCode ?? 502, ur.statusMessage, out);
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
      const e = core.dialError(err, view, port);
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

  const tunnel = (req: http.IncomingMessage, socket: Duplex, head: Buffer, connect: boolean) => {
    busy(socket); // a tunnel stays busy until it closes
    const peer = req.socket.remoteAddress ?? '';
    core.tunnel({
      client: socket,
      rest: head,
      headers: req.headers as Headers,
      connect: connect ? req.url : undefined,
      upstreamHead: (port) => requestHead(req.method ?? 'GET', req.url ?? '/', forwardedFields(pairs(req.rawHeaders), req.headers, peer, port, { upgrade: true, keepFraming: true })),
    });
  };
  server.on('upgrade', (req, socket, head) => tunnel(req, socket, head, false));
  server.on('connect', (req, socket, head) => tunnel(req, socket, head, true));
  server.on('clientError', (err, socket) => {
    const code = (err as NodeJS.ErrnoException).code;
    if (socket.writable && !socket.destroyed) {
      const status = code === 'HPE_HEADER_OVERFLOW' ? 431 : code === 'ERR_HTTP_REQUEST_TIMEOUT' ? 408 : 400;
      rawAnswer(socket, status, status === 431 ? 'request head too large' : status === 408 ? 'request head too slow' : 'bad request');
    } else socket.destroy();
  });

  return core.handle(server, () => {
    upstream.destroy();
    server.closeAllConnections();
  });
}

/** pairs: node's rawHeaders [k, v, k, v, ...] as [k, v] pairs. */
function pairs(raw: string[]): [string, string][] {
  const out: [string, string][] = [];
  for (let i = 0; i + 1 < raw.length; i += 2) out.push([raw[i]!, raw[i + 1]!]);
  return out;
}

/**
 * pipeBody streams a message body `src` into `dst` (backpressure; src's end ends dst) and
 * breaks both when either breaks: an error of either, or src closing before `complete()`
 * (a body cut short), destroys the other; dst closing destroys src. What stream.pipeline
 * does for two streams, without its per-call AbortController and end-of-stream watchers.
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

function answer(res: http.ServerResponse, status: number, reason: string, retryAfterS?: number): void {
  if (res.headersSent) return void res.destroy();
  const headers: http.OutgoingHttpHeaders = { 'content-type': 'text/plain; charset=utf-8' };
  if (retryAfterS !== undefined) headers['retry-after'] = String(retryAfterS);
  res.writeHead(status, headers);
  res.end(`${reason}\n`);
}
