/**
 * The raw-socket ingress engine (config `ingressEngine: raw`, the default): HTTP/1.1 on
 * net.Socket with its own strict head parser (http1.ts). Only the request head is read and
 * rewritten (routing, hop-by-hop fields, X-Forwarded-*, the token stripped); body bytes are
 * passed between the client socket and the upstream socket as they came (no re-framing), their
 * framing only tracked to find where a message ends.
 *
 * Per client connection, one exchange at a time (pipelined requests wait in `pending`, bounded):
 *
 *   IDLE ──head──▶ route ──▶ [not RUNNING: wake] ──▶ slot ──▶ dial / pooled upstream
 *    ▲               │ error: answer (kept alive when the request has no body, else close)
 *    │               │ CONNECT / Upgrade: the shared tunnel (ingress-common.ts), never back here
 *    │               ▼
 *    │      request head + body ──▶ upstream       response head (rewritten) + body ──▶ client
 *    └──── both ends seen: the upstream back to the pool (when reusable), the next pending head
 *
 * Pipelined heads are taken in a loop (never one call per request, so a packet of thousands
 * cannot grow the stack) and only while the client reads its answers (writableNeedDrain stops
 * the loop until 'drain'). Backpressure both ways: a full upstream pauses the client socket, a
 * full client pauses the upstream, and `pending` over PENDING_LIMIT pauses the client.
 * Answers: 400 (bad head, smuggling forms, bad chunk), 431 (head over maxHeaderBytes), 408
 * (head not complete in headersTimeoutMs), 502 (a bad or cut response head from the sandbox);
 * routing answers as the node:http engine's (ingress-route.ts).
 */
import type { IncomingHttpHeaders } from 'node:http';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import type { SandboxNetworkView } from '../core/network-directory';
import { route, type TokenMemo } from './ingress-route';
import { answerBytes, connectionTokens, forwardedFields, IngressCore, requestHead, type ClientSlot, type Headers, type Ingress, type IngressOptions } from './ingress-common';
import { BULK_READ_BYTES, SMALL_READ_BYTES } from './relay';
import { BodyTracker, findHeadEnd, HttpParseError, parseHead, requestFraming, responseFraming, type Framing, type MessageHead } from './http1';

/** How long a free upstream connection is kept, ms (below the usual 5 s keep-alive of servers): an older one is not reused. */
const FREE_UPSTREAM_MS = 4000;
/** How often free upstream connections older than FREE_UPSTREAM_MS are closed, ms (one timer per pool, not one per request). */
const FREE_SWEEP_MS = 1000;
/** Free upstream connections kept per sandbox address:port. */
const MAX_FREE_PER_KEY = 64;
/** Largest response head taken from a sandbox, bytes. */
const MAX_RESPONSE_HEAD = 64 * 1024;

const EMPTY = Buffer.alloc(0);

/** One upstream connection; its listeners are attached once and call the exchange using it. */
interface Upstream {
  sock: Duplex;
  key: string;
  free: boolean;
  /** when it was put back free (performance.now() ms: monotonic, a wall clock stepped back kept connections for good: attacker) */
  freeSince: number;
  /** the exchange's reader: `b` is valid during the call only (a copy is kept when more is needed), unless `held` is set */
  onData?: (b: Buffer) => void;
  onEnd?: () => void;
  /** set by onData when a write still holds b (queued): the read buffer is not reused */
  held: boolean;
  /** a read of the socket (free: the connection is dropped) */
  dispatch: (b: Buffer) => void;
}

/**
 * UpstreamReads: net.connect's `onread` for a direct upstream connection: reads go into one
 * reusable buffer (64 KiB, 256 KiB once reads fill it, as relay.ts's BulkReader) and to the
 * exchange, instead of a new Buffer per read through the stream machinery; a buffer a queued
 * write still holds is let go (the next read gets a new one).
 */
class UpstreamReads {
  up: Upstream | undefined;
  readonly onread: net.OnReadOpts;
  private spare: Buffer | undefined;
  private size = SMALL_READ_BYTES;

  constructor() {
    this.onread = { buffer: () => (this.spare ??= Buffer.allocUnsafe(this.size)), callback: (n, buf) => this.got(n, buf as Buffer) };
  }

  private got(n: number, buf: Buffer): boolean {
    const up = this.up;
    if (!up) return false;
    const size = n === buf.length ? BULK_READ_BYTES : n < 4096 ? SMALL_READ_BYTES : this.size;
    if (size !== this.size) {
      this.size = size;
      this.spare = undefined;
    }
    up.held = false;
    up.dispatch(buf.subarray(0, n));
    if (up.held) this.spare = undefined;
    return true;
  }
}

/** Kept-alive upstream connections per sandbox id + address + port (a deleted sandbox's are never reused for the next owner of its address). */
class UpstreamPool {
  private readonly free = new Map<string, Upstream[]>();
  private sweeper: NodeJS.Timeout | undefined;

  /** get: a free connection for key (the most recently used) kept less than FREE_UPSTREAM_MS, or undefined. */
  get(key: string): Upstream | undefined {
    const list = this.free.get(key);
    const up = list?.pop();
    if (list && list.length === 0) this.free.delete(key);
    if (!up) return undefined;
    up.free = false;
    if (performance.now() - up.freeSince < FREE_UPSTREAM_MS) return up;
    // the most recent is too old: so are the rest of its list
    up.sock.destroy();
    this.sweep(key);
    return undefined;
  }

  /** wrap attaches the listeners of a new upstream connection; `reads`: the onread it was dialled with (a direct connection), else 'data' events are read. */
  wrap(sock: Duplex, key: string, reads?: UpstreamReads): Upstream {
    const up: Upstream = { sock, key, free: false, freeSince: 0, held: false, dispatch: (b) => (up.free ? this.drop(up) : up.onData?.(b)) };
    if (reads && sock instanceof net.Socket) reads.up = up;
    else sock.on('data', up.dispatch);
    sock.on('end', () => (up.free ? this.drop(up) : up.onEnd?.()));
    sock.on('close', () => {
      if (up.free) this.drop(up);
      else up.onEnd?.();
    });
    sock.on('error', () => undefined);
    return up;
  }

  /** put keeps up for the next request to the same key (FREE_UPSTREAM_MS at most). */
  put(up: Upstream): void {
    up.onData = undefined;
    up.onEnd = undefined;
    const list = this.free.get(up.key) ?? [];
    if (up.sock.destroyed || list.length >= MAX_FREE_PER_KEY) return void up.sock.destroy();
    up.free = true;
    up.freeSince = performance.now();
    list.push(up);
    this.free.set(up.key, list);
    if (!this.sweeper) {
      this.sweeper = setInterval(() => this.sweep(), FREE_SWEEP_MS);
      this.sweeper.unref();
    }
  }

  /** sweep closes the free connections (of key, else of every key) kept FREE_UPSTREAM_MS or longer; the timer stops when none is left. */
  private sweep(key?: string): void {
    const now = performance.now();
    for (const [k, list] of key === undefined ? this.free : [[key, this.free.get(key) ?? []] as const]) {
      // lists are in put order: the old ones first
      let n = 0;
      while (n < list.length && now - list[n]!.freeSince >= FREE_UPSTREAM_MS) n++;
      for (const up of list.splice(0, n)) {
        up.free = false;
        up.sock.destroy();
      }
      if (list.length === 0) this.free.delete(k);
    }
    if (this.free.size === 0 && this.sweeper) {
      clearInterval(this.sweeper);
      this.sweeper = undefined;
    }
  }

  private drop(up: Upstream): void {
    const list = this.free.get(up.key);
    const i = list?.indexOf(up) ?? -1;
    if (list && i >= 0) list.splice(i, 1);
    if (list && list.length === 0) this.free.delete(up.key);
    up.sock.destroy();
  }

  close(): void {
    for (const list of this.free.values()) for (const up of list) up.sock.destroy();
    this.free.clear();
    clearInterval(this.sweeper);
    this.sweeper = undefined;
  }
}

/** One request/response exchange of a client connection. */
interface Exchange {
  head: MessageHead;
  framing: Framing;
  reqBody: BodyTracker;
  view?: SandboxNetworkView;
  port?: number;
  up?: Upstream;
  revoked: () => void;
  respState: 'head' | 'body' | 'done';
  respBuf: Buffer;
  respBody?: BodyTracker;
  /** the upstream may serve the next request */
  reusable: boolean;
  reqEnded: boolean;
  taken: boolean;
}

/** createRawIngress builds the raw engine (file header). */
export function createRawIngress(o: IngressOptions): Ingress {
  const core = new IngressCore({ ...o, engine: 'raw' });
  const pool = new UpstreamPool();
  const conns = new Set<ClientConn>();
  const server = net.createServer({ allowHalfOpen: true, noDelay: true }, (sock) => {
    const slot = core.admit(sock);
    if (!slot) return;
    const c = new ClientConn(core, pool, sock, slot);
    conns.add(c);
    sock.once('close', () => conns.delete(c));
  });
  return core.handle(server, () => {
    for (const c of conns) c.teardown();
    pool.close();
  });
}

/** A client connection (file header). */
class ClientConn {
  private pending: Buffer = EMPTY;
  private ex: Exchange | undefined;
  private closed = false;
  private tunneled = false;
  private closeAfter = false;
  private pumping = false;
  private again = false;
  private upFull = false;
  private clientFull = false;
  private headTimer: NodeJS.Timeout | undefined;
  private readonly pendingLimit: number;
  private readonly peer: string;
  /** the access token this connection last proved (route() skips the hash for the same one) */
  private readonly tokenMemo: TokenMemo = {};
  /** the upstream pool key of this connection's last request (a new string per request costs a hash) */
  private lastKey: { view: SandboxNetworkView; port: number; key: string } | undefined;
  private readonly onData = (b: Buffer) => this.data(b);

  constructor(
    private readonly core: IngressCore,
    private readonly pool: UpstreamPool,
    private readonly sock: net.Socket,
    private readonly slot: ClientSlot,
  ) {
    this.pendingLimit = Math.max(core.limits.maxHeaderBytes, 64 * 1024);
    this.peer = sock.remoteAddress ?? '';
    sock.on('data', this.onData);
    sock.on('end', () => this.clientEnded());
    sock.on('error', () => undefined);
    sock.once('close', () => this.teardown());
    sock.on('drain', () => {
      if (!this.tunneled) this.pump();
    });
    sock.setTimeout(core.limits.idleTimeoutMs, () => sock.destroy());
  }

  private data(b: Buffer): void {
    if (this.closed) return;
    const ex = this.ex;
    try {
      if (ex?.up && !ex.reqBody.done && this.pending.length === 0) {
        // the common case of a body: straight through, no copy
        const n = ex.reqBody.feed(b);
        if (n) this.toUpstream(ex, n === b.length ? b : b.subarray(0, n));
        if (n < b.length) this.pending = b.subarray(n);
        if (ex.reqBody.done) this.reqDone(ex);
      } else this.pending = this.pending.length ? Buffer.concat([this.pending, b]) : b;
    } catch (err) {
      return this.fail(err);
    }
    this.pump();
  }

  /** pump takes pending bytes: the current request's body, else the next heads, in a loop (never recursing per request). */
  private pump(): void {
    if (this.pumping) {
      this.again = true;
      return;
    }
    this.pumping = true;
    try {
      do {
        this.again = false;
        this.step();
      } while (this.again && !this.closed && !this.tunneled);
    } catch (err) {
      this.fail(err);
    } finally {
      this.pumping = false;
    }
    this.reading();
  }

  private step(): void {
    const { maxHeaderBytes } = this.core.limits;
    while (!this.closed && !this.tunneled) {
      const ex = this.ex;
      if (ex) {
        if (!ex.up || ex.reqBody.done || this.pending.length === 0) return;
        const b = this.pending;
        const n = ex.reqBody.feed(b);
        this.pending = b.subarray(n);
        if (n) this.toUpstream(ex, b.subarray(0, n));
        if (ex.reqBody.done) this.reqDone(ex);
        if (this.ex === ex) return;
        continue;
      }
      if (this.closeAfter) return void this.sock.end();
      if (this.sock.writableNeedDrain) return; // the client does not read its answers: wait for 'drain'
      let skip = 0; // empty lines before a request line are ignored (RFC 9112 2.2)
      while (this.pending[skip] === 0x0d && this.pending[skip + 1] === 0x0a) skip += 2;
      if (skip) this.pending = this.pending.subarray(skip);
      if (this.pending.length === 0) return;
      const end = findHeadEnd(this.pending);
      if (end < 0 || end > maxHeaderBytes) {
        if (this.pending.length > maxHeaderBytes || end > maxHeaderBytes) throw new HttpParseError(431, `request head over ${maxHeaderBytes} bytes`);
        this.headTimer ??= setTimeout(() => this.fail(new HttpParseError(408, `request head not complete in ${this.core.limits.headersTimeoutMs} ms`)), this.core.limits.headersTimeoutMs);
        return;
      }
      clearTimeout(this.headTimer);
      this.headTimer = undefined;
      const head = parseHead(this.pending, end, true);
      this.pending = this.pending.subarray(end);
      this.begin(head);
    }
  }

  /** reading pauses or resumes the client socket by the pending bound and the upstream's backpressure. */
  private reading(): void {
    if (this.closed || this.tunneled) return;
    const want = this.pending.length < this.pendingLimit && !this.upFull;
    if (want && this.sock.isPaused()) this.sock.resume();
    else if (!want && !this.sock.isPaused()) this.sock.pause();
  }

  private begin(head: MessageHead): void {
    const h = head.headers as Headers;
    const conn = connectionTokens(h);
    if (head.method === 'CONNECT' || (h.upgrade !== undefined && conn.has('upgrade'))) return this.tunnel(head);
    const framing = requestFraming(head);
    if (head.minor === 0 || conn.has('close')) this.closeAfter = true;
    const ex: Exchange = {
      head,
      framing,
      reqBody: new BodyTracker(framing, this.core.limits.maxHeaderBytes),
      revoked: () => undefined,
      respState: 'head',
      respBuf: EMPTY,
      reusable: true,
      reqEnded: framing.kind === 'none',
      taken: false,
    };
    this.ex = ex;
    this.slot.busy++;
    this.routed(ex, false);
  }

  private routed(ex: Exchange, woken: boolean): void {
    const { o } = this.core;
    const r = route(ex.head.headers as IncomingHttpHeaders, o.directory, o.domain, undefined, this.tokenMemo);
    if (!r.ok && r.notRunning && o.idle && !woken) {
      void this.core.awake(r.notRunning).then((w) => {
        if (this.ex !== ex || this.closed) return;
        if (w.ok) this.routed(ex, true);
        else this.answer(ex, w.status, w.reason, w.retryAfterS);
        this.pump();
      });
      return;
    }
    if (!r.ok) return this.answer(ex, r.status, r.reason, r.retryAfterS);
    const { view, port } = r;
    o.idle?.activity(view.sandboxId);
    if (!this.core.take(view.sandboxId)) return this.answer(ex, 429, this.core.tooMany(view.sandboxId));
    ex.taken = true;
    ex.view = view;
    ex.port = port;
    ex.revoked = this.core.revoked(view, ex.head.headers as Headers, () => {
      this.core.log.info({ sandbox_id: view.sandboxId, port }, 'ingress: request cut: the sandbox is gone or no longer lets it in');
      this.teardown();
    });
    const last = this.lastKey;
    const key = last && last.view === view && last.port === port ? last.key : `${view.sandboxId}|${view.address}|${port}`;
    if (key !== last?.key) this.lastKey = { view, port, key };
    const pooled = this.pool.get(key);
    if (pooled) return this.attach(ex, pooled);
    const reads = new UpstreamReads();
    this.core.dial(view, port, reads.onread).then(
      (sock) => {
        const up = this.pool.wrap(sock, key, reads);
        if (this.ex !== ex || this.closed) return void sock.destroy();
        this.attach(ex, up);
        this.pump();
      },
      (err: unknown) => {
        if (this.ex !== ex || this.closed) return;
        const e = this.core.dialError(err, view, port);
        this.answer(ex, e.status, e.reason);
        this.pump();
      },
    );
  }

  /** attach sends the request head upstream and starts the exchange on `up`. */
  private attach(ex: Exchange, up: Upstream): void {
    ex.up = up;
    up.onData = (b) => this.fromUpstream(ex, b);
    up.onEnd = () => this.upstreamEnded(ex);
    const fields = forwardedFields(ex.head.raw, ex.head.headers as Headers, this.peer, ex.port!, { upgrade: false, keepFraming: true });
    // latin1: the head was read byte for byte as latin1, so 8-bit bytes go on as they came (as UTF-8 0xE9 became 0xC3 0xA9: attacker)
    up.sock.write(requestHead(ex.head.method, ex.head.target, fields), 'latin1');
    if (ex.reqEnded) return;
    // the body bytes already here go with the head in one write
    up.sock.cork();
    this.pump();
    process.nextTick(() => up.sock.uncork());
  }

  private toUpstream(ex: Exchange, b: Buffer): void {
    ex.revoked();
    const up = ex.up!;
    if (this.closed || up.sock.destroyed) return;
    if (!up.sock.write(b) && !this.upFull) {
      this.upFull = true;
      up.sock.once('drain', () => {
        this.upFull = false;
        this.reading();
      });
    }
  }

  private reqDone(ex: Exchange): void {
    ex.reqEnded = true;
    if (ex.respState === 'done') this.finish(ex);
  }

  private fromUpstream(ex: Exchange, b: Buffer): void {
    if (this.ex !== ex || this.closed) return;
    ex.revoked();
    if (this.closed) return;
    try {
      if (ex.respState === 'head') return this.responseHead(ex, b);
      if (ex.respState === 'body') {
        const n = ex.respBody!.feed(b);
        if (n) this.toClient(ex, n === b.length ? b : b.subarray(0, n));
        if (n < b.length) ex.reusable = false; // bytes after the response: that connection is not trusted again
        if (ex.respBody!.done) this.respDone(ex);
        return;
      }
      ex.reusable = false;
    } catch (err) {
      this.badUpstream(ex, (err as Error).message);
    }
  }

  private responseHead(ex: Exchange, b: Buffer): void {
    ex.respBuf = ex.respBuf.length ? Buffer.concat([ex.respBuf, b]) : b;
    for (;;) {
      const end = findHeadEnd(ex.respBuf);
      if (end < 0) {
        if (ex.respBuf.length > MAX_RESPONSE_HEAD) throw new Error(`response head over ${MAX_RESPONSE_HEAD} bytes`);
        if (ex.respBuf.buffer === b.buffer) ex.respBuf = Buffer.from(ex.respBuf); // part of the reader's buffer, read into again
        return;
      }
      // the bound holds however the head was read (a head whose end came in the read that passed it was relayed whole: attacker)
      if (end > MAX_RESPONSE_HEAD) throw new Error(`response head over ${MAX_RESPONSE_HEAD} bytes`);
      const head = parseHead(ex.respBuf, end, false);
      if (head.status === 101) throw new Error('101 to a request that asked for no upgrade');
      const upConn = connectionTokens(head.headers as Headers);
      if (head.status < 200) {
        // 100 Continue, 103 Early Hints: passed on as HTTP/1.1 without hop-by-hop fields (never to an
        // HTTP/1.0 client: RFC 9110 15.2), the final response follows
        if (ex.head.minor === 1) this.toClient(ex, clientResponse(ex.respBuf, head, end, upConn, false, 0));
        ex.respBuf = ex.respBuf.subarray(end);
        continue;
      }
      const framing = responseFraming(head, ex.head.method);
      if (upConn.has('close') || head.minor === 0 || framing.kind === 'close') ex.reusable = false;
      if (framing.kind === 'close') this.closeAfter = true;
      const buf = ex.respBuf;
      const rest = buf.subarray(end);
      ex.respBuf = EMPTY;
      ex.respState = 'body';
      ex.respBody = new BodyTracker(framing);
      const n = ex.respBody.feed(rest);
      if (n < rest.length) ex.reusable = false;
      // the head goes out with the body bytes that came with it (one write)
      this.toClient(ex, clientResponse(buf, head, end, upConn, this.closeAfter, n));
      if (ex.respBody.done) this.respDone(ex);
      return;
    }
  }

  private toClient(ex: Exchange, b: Buffer): void {
    const ok = this.sock.write(b);
    if (ex.up && this.sock.writableLength > 0) ex.up.held = true; // queued: the write holds b
    if (!ok && !this.clientFull && ex.up) {
      this.clientFull = true;
      const up = ex.up;
      up.sock.pause();
      this.sock.once('drain', () => {
        this.clientFull = false;
        up.sock.resume();
      });
    }
  }

  private respDone(ex: Exchange): void {
    ex.respState = 'done';
    if (ex.reqEnded) return this.finish(ex);
    // answered before the request body ended (e.g. 413): that body is not read on; both close after
    ex.reusable = false;
    this.closeAfter = true;
    this.finish(ex);
  }

  /** finish ends an exchange: the upstream pooled (reusable) or closed, the slot freed, the next head taken. */
  private finish(ex: Exchange): void {
    if (this.ex !== ex) return;
    this.ex = undefined;
    this.release(ex);
    const up = ex.up;
    if (up) {
      up.onData = undefined;
      up.onEnd = undefined;
      if (this.clientFull) up.sock.resume();
      if (ex.reusable && ex.reqEnded) this.pool.put(up);
      else up.sock.destroy();
    }
    this.clientFull = false;
    this.upFull = false;
    if (this.closeAfter) return void this.sock.end();
    if (!this.pumping) this.pump();
    else this.again = true;
  }

  private release(ex: Exchange): void {
    this.slot.busy--;
    if (ex.taken && ex.view) this.core.give(ex.view.sandboxId);
    ex.taken = false;
  }

  /** upstreamEnded: the sandbox closed its side during the exchange. */
  private upstreamEnded(ex: Exchange): void {
    if (this.ex !== ex || this.closed) return;
    if (ex.respState === 'head') return this.badUpstream(ex, 'closed the connection before a whole response head');
    if (ex.respState === 'body' && ex.respBody && !ex.respBody.done) {
      if (ex.respBody.endOfInput()) {
        ex.reusable = false;
        return this.respDone(ex);
      }
      // cut short: the client sees the connection break, never a clean end
      return this.teardown();
    }
  }

  /** answer gives an ingress answer to the exchange (kept alive when the request has no body). */
  private answer(ex: Exchange, status: number, reason: string, retryAfterS?: number): void {
    if (ex.framing.kind !== 'none') this.closeAfter = true;
    this.sock.write(answerBytes(status, reason, retryAfterS, this.closeAfter));
    ex.reusable = false;
    ex.respState = 'done';
    ex.reqEnded = true;
    this.finish(ex);
  }

  private badUpstream(ex: Exchange, why: string): void {
    this.core.log.info({ sandbox_id: ex.view?.sandboxId, port: ex.port, why }, 'ingress: bad response from a sandbox');
    if (ex.respState !== 'head') return this.teardown();
    this.closeAfter = true;
    this.answer(ex, 502, `port ${ex.port} of sandbox ${ex.view?.sandboxId} broke the response: ${why}`);
  }

  /** fail answers a bad request (400/408/431 with the reason) and closes; mid-response it only closes. */
  private fail(err: unknown): void {
    if (this.closed) return;
    const ex = this.ex;
    if (!(err instanceof HttpParseError) || (ex && ex.respState !== 'head')) {
      if (!(err instanceof HttpParseError)) this.core.log.warn({ err }, 'ingress: connection failed');
      return this.teardown();
    }
    const reason = err.status === 431 ? `request head too large: ${err.message}` : err.status === 408 ? `request head too slow: ${err.message}` : `bad request: ${err.message}`;
    this.closed = true;
    clearTimeout(this.headTimer);
    if (ex) {
      this.ex = undefined;
      this.release(ex);
      ex.up?.sock.destroy();
    }
    this.sock.end(answerBytes(err.status, reason, undefined, true));
    this.sock.setTimeout(1000, () => this.sock.destroy());
  }

  private clientEnded(): void {
    if (this.closed || this.tunneled) return;
    const ex = this.ex;
    if (ex && !ex.reqEnded) return this.teardown(); // the request body is cut short
    this.closeAfter = true;
    if (!ex) return void this.sock.end();
    // the answer is on the way: it goes on while bytes pass (a half-closed client still reads; a
    // write to a closed one fails at once), a silent one ends after halfClosedIdleMs (IngressLimits)
    const { halfClosedIdleMs, idleTimeoutMs } = this.core.limits;
    this.sock.setTimeout(Math.min(halfClosedIdleMs, idleTimeoutMs), () => this.teardown());
  }

  /** tunnel hands the connection to the shared WebSocket/CONNECT tunnel (ingress-common.ts). */
  private tunnel(head: MessageHead): void {
    this.tunneled = true;
    clearTimeout(this.headTimer);
    this.sock.off('data', this.onData);
    this.sock.pause();
    this.sock.setTimeout(0);
    this.slot.busy++; // a tunnel stays busy until it closes
    const rest = this.pending;
    this.pending = EMPTY;
    const { method, target, raw } = head;
    const h = head.headers as Headers;
    this.core.tunnel({
      client: this.sock,
      rest,
      headers: h,
      connect: method === 'CONNECT' ? target : undefined,
      upstreamHead: (port) => requestHead(method, target, forwardedFields(raw, h, this.peer, port, { upgrade: true, keepFraming: true })),
    });
  }

  /** teardown closes the client and the exchange's upstream, freeing what it holds. Idempotent. */
  teardown(): void {
    if (this.tunneled) return void this.sock.destroy();
    clearTimeout(this.headTimer);
    const ex = this.ex;
    this.ex = undefined;
    if (ex) {
      this.release(ex);
      ex.up?.sock.destroy();
    }
    this.closed = true;
    this.sock.destroy();
  }
}

/** Response fields never passed to the client as the sandbox sent them (hop-by-hop; the ingress's own Connection follows). */
function dropToClient(name: string, upConn: ReadonlySet<string>): boolean {
  return name === 'connection' || name === 'keep-alive' || name === 'proxy-connection' || (upConn.has(name) && name !== 'content-length' && name !== 'transfer-encoding');
}

/**
 * clientResponse: the bytes of a response head (parsed from buf[0..end)) as the client gets it,
 * followed by the `bodyBytes` body bytes that came with it in buf: the sandbox's field lines as
 * they came minus the hop-by-hop ones, the start line as HTTP/1.1, `Connection: close` when the
 * client connection ends after it. When nothing changes, that part of buf itself (no copy).
 */
function clientResponse(buf: Buffer, head: MessageHead, end: number, upConn: ReadonlySet<string>, close: boolean, bodyBytes: number): Buffer {
  // kept byte ranges of buf, two numbers each; the start line is rewritten only for HTTP/1.0
  const ranges: number[] = [];
  const firstField = head.spans.length ? head.spans[0]! : end - 2;
  const prefix = head.minor === 1 ? '' : `HTTP/1.1 ${head.status} ${head.reason}\r\n`;
  let from = head.minor === 1 ? 0 : firstField;
  for (let i = 0; i < head.lower.length; i++) {
    if (!dropToClient(head.lower[i]!, upConn)) continue;
    const lineStart = head.spans[2 * i]!;
    if (lineStart > from) ranges.push(from, lineStart);
    from = head.spans[2 * i + 1]! + 2;
  }
  if (end - 2 > from) ranges.push(from, end - 2);
  const tail = close ? 'Connection: close\r\n\r\n' : '\r\n';
  const contiguous = !prefix && !close && ranges.length === 2 && ranges[0] === 0 && ranges[1] === end - 2;
  if (contiguous) return buf.subarray(0, end + bodyBytes);
  let size = prefix.length + tail.length + bodyBytes;
  for (let i = 0; i < ranges.length; i += 2) size += ranges[i + 1]! - ranges[i]!;
  const out = Buffer.allocUnsafe(size);
  let at = out.write(prefix, 0, 'latin1');
  for (let i = 0; i < ranges.length; i += 2) at += buf.copy(out, at, ranges[i]!, ranges[i + 1]!);
  at += out.write(tail, at, 'latin1');
  buf.copy(out, at, end, end + bodyBytes);
  return out;
}
