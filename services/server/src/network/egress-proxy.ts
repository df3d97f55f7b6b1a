/**
 * The egress proxy (feature server.egress-proxy.v1, docs/network.md "Egress policy"). The
 * node's prerouting chain redirects a sandbox's TCP to the proxied ports (80, 443) here when its
 * policy has domain rules. Per connection:
 *
 *   source address ──byAddress──▶ sandbox (unknown: closed at once)
 *   SO_ORIGINAL_DST ─────────────▶ where it was going (address A, port P)
 *   first bytes (≤ 16 KiB, ≤ 5 s) ▶ TLS SNI or HTTP Host: name N (slow/oversized: closed)
 *   N matches allow_out ─────────▶ resolve N via the node's upstreams; connect to the first
 *                                  address that passes always-denied (never A: an allowed SNI
 *                                  cannot front for another address)
 *   otherwise ───────────────────▶ evaluateEgress on A alone; allowed: connect to A
 *   refused ─────────────────────▶ HTTP: 403 naming the rule; TLS/other: TCP RST
 *   connected ───────────────────▶ write the read bytes, relay both ways (backpressure,
 *                                  half-close; upstream reads are bulk reads, relay.ts),
 *                                  idle timeout; bytes counted per sandbox
 */
import net from 'node:net';
import os from 'node:os';
import { domainMatches, evaluateEgress, normalizeName, openFilesLimit, type Cidr, type EgressVerdict, type Logger } from '@sandnode/shared';
import type { NetworkDirectory, SandboxNetworkView } from '../core/network-directory';
import { originalDestination as readOriginalDst, type Destination } from './original-dst';
import { MAX_PREAMBLE_BYTES, parsePreamble, type Preamble } from './preamble';
import { BulkReader } from './relay';
import { listenTcp, newTraffic, type SandboxTraffic, type TcpListen } from './sockets';
import type { UpstreamDns } from './upstream-dns';

/**
 * Share of the server's soft RLIMIT_NOFILE that all proxied connections of the node together
 * may hold: at most limit / EGRESS_FD_SHARE_DIVISOR connections (each is two descriptors, the
 * sandbox's and the upstream one, so at most half of the server's descriptors). Attacker
 * finding: the per-sandbox cap alone let a few sandboxes put the server at its limit (EMFILE
 * for its API, podd and SQLite); one more connection is reset.
 */
export const EGRESS_FD_SHARE_DIVISOR = 4;

/**
 * Fraction of the node-wide cap from which the proxy shares it out: above it, a sandbox that
 * already has its fair share (cap / sandboxes with open connections, itself counted) is
 * refused, so one sandbox cannot keep the rest of the node out.
 */
export const EGRESS_FAIR_SHARE_FROM = 0.75;

/**
 * egressAdmission decides one new connection of a sandbox with `mine` open ones, the node
 * having `total` open of `cap`, `active` sandboxes with open connections (this one counted)
 * and `largest` open ones for the sandbox holding most: `admit`; `refuse` ('share': it holds its
 * fair share while the node is near the cap; 'cap': the node is at the cap and it holds its
 * share); or `evict` (at the cap, it is below its share and the largest holder is above it: one
 * connection of that holder is reset to make room). Pure.
 */
export function egressAdmission(mine: number, total: number, cap: number, active: number, largest: number): 'admit' | 'evict' | { refuse: 'share' | 'cap' } {
  const share = Math.max(1, Math.floor(cap / Math.max(1, active)));
  if (total >= cap) return mine < share && largest > share ? 'evict' : { refuse: 'cap' };
  if (total >= cap * EGRESS_FAIR_SHARE_FROM && mine >= share) return { refuse: 'share' };
  return 'admit';
}

/** nodeEgressCap is the default node-wide cap: openFilesLimit() / EGRESS_FD_SHARE_DIVISOR (no cap when the limit is unknown). */
export function nodeEgressCap(): number {
  const limit = openFilesLimit();
  return limit === undefined ? Number.POSITIVE_INFINITY : Math.max(1, Math.floor(limit / EGRESS_FD_SHARE_DIVISOR));
}

/** Open connections one sandbox may have through the proxy (server key egressMaxConnections). */
export const DEFAULT_EGRESS_MAX_CONNECTIONS = 1024;
/** A proxied connection with no bytes either way for this long is closed, ms. */
export const DEFAULT_EGRESS_IDLE_MS = 300_000;
/** The first bytes (ClientHello / request head) must arrive within, ms. */
export const DEFAULT_PREAMBLE_TIMEOUT_MS = 5000;
/** Connecting upstream may take, ms (then HTTP 502 / RST). */
export const DEFAULT_UPSTREAM_CONNECT_MS = 10_000;

/** Options of {@link startEgressProxy}. */
export interface EgressProxyOptions {
  directory: NetworkDirectory;
  /** resolves allowed names (the resolver's upstreams) */
  upstream: UpstreamDns;
  listen: TcpListen;
  /** the node's always-denied ranges (rule 1), parsed (shared parseCidrList) */
  alwaysDenied: readonly Cidr[];
  logger: Logger;
  /** per sandbox (default DEFAULT_EGRESS_MAX_CONNECTIONS) */
  maxConnections?: number;
  /** of the whole node, asked at each connection (default nodeEgressCap: a share of the server's RLIMIT_NOFILE) */
  maxTotalConnections?: () => number;
  /** ms (default DEFAULT_EGRESS_IDLE_MS) */
  idleTimeoutMs?: number;
  /** ms (default DEFAULT_PREAMBLE_TIMEOUT_MS) */
  preambleTimeoutMs?: number;
  /** ms (default DEFAULT_UPSTREAM_CONNECT_MS) */
  connectTimeoutMs?: number;
  /** where a connection was going (default SO_ORIGINAL_DST); unit tests without nftables replace it */
  originalDestination?: (socket: net.Socket) => Destination;
}

/** A running egress proxy. */
export interface EgressProxy {
  /** the listening address */
  address(): net.AddressInfo;
  /** counters of sandboxId since start */
  traffic(sandboxId: string): SandboxTraffic | undefined;
  /** sandboxIds that have counters (for a metrics scrape) */
  sandboxIds(): string[];
  /** closeSandbox resets every open connection of sandboxId (its delete, or a policy change that must not spare them) */
  closeSandbox(sandboxId: string): void;
  /** forget drops sandboxId's counters (after its delete; counters of open connections stay) */
  forget(sandboxId: string): void;
  /** close stops listening (a given server is closed too) and destroys every open connection */
  close(): Promise<void>;
}

/** How long the list of the host's own addresses is reused, ms. */
const OWN_ADDRESSES_MS = 1000;
let ownCache: { at: number; addresses: Set<string> } | undefined;

/**
 * isOwnAddress says whether `address` (dotted quad) is an IPv4 address of one of this host's
 * interfaces (the list is read at most every OWN_ADDRESSES_MS). network.proto rule 1 refuses
 * the node's own addresses; the input chain drops a sandbox's direct packets to them, but the
 * proxy connects from the host, so it must refuse them itself. Loopback interfaces are left to
 * the always-denied list (DEFAULT_ALWAYS_DENIED has 127.0.0.0/8).
 */
export function isOwnAddress(address: string): boolean {
  const now = Date.now();
  if (!ownCache || now - ownCache.at > OWN_ADDRESSES_MS) {
    const addresses = new Set<string>();
    for (const list of Object.values(os.networkInterfaces())) for (const i of list ?? []) if (i.family === 'IPv4' && !i.internal) addresses.add(i.address);
    ownCache = { at: now, addresses };
  }
  return ownCache.addresses.has(address);
}

function decideAddress(policy: Parameters<typeof evaluateEgress>[0], alwaysDenied: readonly Cidr[], own: (a: string) => boolean, address: string, name?: string): EgressVerdict {
  if (own(address)) return { allowed: false, rule: `always-denied: the node's own address ${address}` };
  return evaluateEgress(policy, alwaysDenied, address, name);
}

/** How a connection was decided (exported for tests and logs). */
export interface EgressDecision {
  verdict: EgressVerdict;
  /** an allowed name that gave no address to connect to (resolution failed, no A record): not a refusal; HTTP 502, TLS RST */
  unresolved?: boolean;
  /** where to connect when allowed */
  target?: Destination;
  /** the name read from SNI/Host, normalised (undefined: none) */
  name?: string;
}

/**
 * decideEgress applies the policy of docs/network.md to a connection going to `dst` that
 * named `rawName` (SNI/Host, undefined when none): an allowed name is resolved through
 * `upstream` and connected to at the first address that passes rule 1; anything else is
 * decided by the address alone. Rule 1 includes the host's own addresses (`own`, default
 * isOwnAddress). Never rejects: a failed resolution is a refusal naming it.
 */
export async function decideEgress(
  policy: Parameters<typeof evaluateEgress>[0],
  alwaysDenied: readonly Cidr[],
  upstream: Pick<UpstreamDns, 'resolve4'>,
  dst: Destination,
  rawName: string | undefined,
  own: (address: string) => boolean = isOwnAddress,
): Promise<EgressDecision> {
  const name = rawName === undefined ? undefined : normalizeName(rawName);
  if (name !== undefined && policy.allowDomains.some((r) => domainMatches(r, name))) {
    let addresses: string[];
    try {
      addresses = await upstream.resolve4(name);
    } catch (err) {
      return { name, unresolved: true, verdict: { allowed: false, rule: `resolving ${name} failed: ${(err as Error).message}` } };
    }
    let refusal: EgressVerdict | undefined;
    for (const a of addresses) {
      const v = decideAddress(policy, alwaysDenied, own, a, name);
      if (v.allowed) return { name, verdict: v, target: { address: a, port: dst.port } };
      refusal ??= { allowed: false, rule: `${v.rule} (${name} resolves to ${a})` };
    }
    return refusal ? { name, verdict: refusal } : { name, unresolved: true, verdict: { allowed: false, rule: `${name} is allowed but has no IPv4 address` } };
  }
  const v = decideAddress(policy, alwaysDenied, own, dst.address);
  return { name, verdict: v, target: v.allowed ? dst : undefined };
}

/** startEgressProxy listens on opts.listen and proxies until close(). Rejects on a bind error. */
export async function startEgressProxy(opts: EgressProxyOptions): Promise<EgressProxy> {
  const maxConns = opts.maxConnections ?? DEFAULT_EGRESS_MAX_CONNECTIONS;
  const maxTotal = opts.maxTotalConnections ?? nodeEgressCap;
  let totalWarnedAt = 0;
  const limitWarnedAt = new Map<string, number>();
  const idleMs = opts.idleTimeoutMs ?? DEFAULT_EGRESS_IDLE_MS;
  const preambleMs = opts.preambleTimeoutMs ?? DEFAULT_PREAMBLE_TIMEOUT_MS;
  const connectMs = opts.connectTimeoutMs ?? DEFAULT_UPSTREAM_CONNECT_MS;
  const origDst = opts.originalDestination ?? readOriginalDst;
  const log = opts.logger.child({ component_part: 'egress-proxy' });
  const counters = new Map<string, SandboxTraffic>();
  const open = new Map<net.Socket, string>(); // client socket → sandboxId
  const bySandbox = new Map<string, Set<net.Socket>>(); // sandboxId → its open client sockets, oldest first

  const onConnection = (client: net.Socket) => {
    client.allowHalfOpen = true;
    client.on('error', () => client.destroy());
    const src = (client.remoteAddress ?? '').replace(/^::ffff:/, '');
    const view = opts.directory.byAddress(src);
    if (!view) return client.resetAndDestroy();
    let c = counters.get(view.sandboxId);
    if (!c) counters.set(view.sandboxId, (c = newTraffic()));
    const t = c;
    t.connections++;
    if (t.open >= maxConns) {
      t.refused++;
      // at most one line per sandbox per second: a sandbox reconnecting in a loop must not fill the server's log
      const now = Date.now();
      if (now - (limitWarnedAt.get(view.sandboxId) ?? 0) > 1000) {
        limitWarnedAt.set(view.sandboxId, now);
        log.warn({ sandbox_id: view.sandboxId, open: t.open, refused: t.refused }, 'egress: connection limit reached');
      }
      return client.resetAndDestroy();
    }
    const cap = maxTotal();
    if (open.size >= cap * EGRESS_FAIR_SHARE_FROM) {
      let largest: string | undefined;
      for (const [id, set] of bySandbox) if (set.size > (largest === undefined ? 0 : bySandbox.get(largest)!.size)) largest = id;
      const held = largest === undefined ? 0 : bySandbox.get(largest)!.size;
      const active = bySandbox.size + (bySandbox.has(view.sandboxId) ? 0 : 1);
      const d = egressAdmission(t.open, open.size, cap, active, held);
      if (d === 'evict') {
        // the oldest connection of the sandbox most above its share makes room (its descriptors go at its close, on this turn)
        const victim = bySandbox.get(largest!)!.values().next().value as net.Socket;
        counters.get(largest!)!.refused++;
        victim.resetAndDestroy();
        if (Date.now() - totalWarnedAt > 1000) {
          totalWarnedAt = Date.now();
          log.warn(
            { sandbox_id: view.sandboxId, evicted_from: largest, open: open.size },
            'egress: node-wide connection limit reached; a connection of the sandbox holding most was reset for one below its fair share',
          );
        }
      } else if (d !== 'admit') {
        t.refused++;
        if (Date.now() - totalWarnedAt > 1000) {
          totalWarnedAt = Date.now();
          log.warn(
            { sandbox_id: view.sandboxId, open: open.size, mine: t.open },
            d.refuse === 'cap' ? 'egress: node-wide connection limit reached (a share of the server RLIMIT_NOFILE)' : 'egress: near the node-wide limit; a sandbox at its fair share is refused',
          );
        }
        return client.resetAndDestroy();
      }
    }
    t.open++;
    open.set(client, view.sandboxId);
    let mineSet = bySandbox.get(view.sandboxId);
    if (!mineSet) bySandbox.set(view.sandboxId, (mineSet = new Set()));
    const set = mineSet;
    set.add(client);
    let closed = false;
    client.on('close', () => {
      if (closed) return;
      closed = true;
      t.open--;
      open.delete(client);
      set.delete(client);
      if (set.size === 0 && bySandbox.get(view.sandboxId) === set) bySandbox.delete(view.sandboxId);
    });
    let dst: Destination;
    try {
      dst = origDst(client);
    } catch (err) {
      t.refused++;
      log.warn({ sandbox_id: view.sandboxId, err }, 'egress: no original destination');
      return client.resetAndDestroy();
    }
    if (dst.port === client.localPort && dst.address === (client.localAddress ?? '').replace(/^::ffff:/, '')) {
      t.refused++;
      return client.resetAndDestroy(); // a direct connection to the proxy, not a redirected one
    }
    readPreamble(client, preambleMs, (p, head) => {
      if (!p) return client.destroy(); // slow, or closed before deciding
      void proceed(client, src, dst, p, head, t);
    });
  };

  const refuse = (client: net.Socket, p: Preamble, rule: string, status = 403) => {
    if (p.kind === 'http' || (p.kind === 'invalid' && status === 400)) {
      const reason = status === 403 ? 'Forbidden' : status === 400 ? 'Bad Request' : 'Bad Gateway';
      const body = `sandnode egress: ${status === 403 ? 'refused by' : 'error:'} ${rule}\n`;
      client.end(`HTTP/1.1 ${status} ${reason}\r\ncontent-type: text/plain\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`, () => client.destroy());
    } else client.resetAndDestroy();
  };

  const proceed = async (client: net.Socket, src: string, dst: Destination, p: Preamble, head: Buffer, t: SandboxTraffic) => {
    const view = opts.directory.byAddress(src); // the policy in force now (it may have changed during the read)
    if (!view) return client.resetAndDestroy();
    const slog = log.child({ sandbox_id: view.sandboxId });
    if (p.kind === 'invalid') {
      t.refused++;
      slog.debug({ why: p.why, dst }, 'egress: malformed preamble');
      return refuse(client, p, p.why, head[0] === 0x16 ? 403 : 400);
    }
    const rawName = p.kind === 'tls' ? p.sni : p.kind === 'http' ? p.host : undefined;
    const d = await decideEgress(view.policy, opts.alwaysDenied, opts.upstream, dst, rawName);
    if (client.destroyed) return;
    if (!d.verdict.allowed || !d.target) {
      t.refused++;
      slog.debug({ dst, name: d.name, rule: d.verdict.rule }, 'egress: refused');
      return refuse(client, p, d.verdict.rule, d.unresolved ? 502 : 403);
    }
    const target = d.target;
    slog.debug({ dst, name: d.name, target, rule: d.verdict.rule }, 'egress: allowed');
    const reader = new BulkReader();
    const up = net.connect({ host: target.address, port: target.port, allowHalfOpen: true, noDelay: true, onread: reader.onread });
    const onClientGone = () => up.destroy();
    client.once('close', onClientGone);
    const timer = setTimeout(() => up.destroy(new Error(`connect to ${target.address}:${target.port} timed out`)), connectMs);
    up.once('error', (err) => {
      clearTimeout(timer);
      if (up.connecting || up.bytesWritten === 0) {
        slog.debug({ err, target }, 'egress: upstream connect failed');
        if (!client.destroyed) refuse(client, p, `connecting to ${target.address}:${target.port} failed (${err.message})`, 502);
      } else if (!client.destroyed) client.resetAndDestroy();
    });
    // the policy may change while bytes flow (UpdateSandboxNetwork, delete, the address given to
    // another sandbox): a connection the policy in force would refuse now is reset, as the kernel
    // does for direct traffic (it checks every forwarded packet)
    let seen: SandboxNetworkView | undefined = view;
    const stillAllowed = () => {
      const now = opts.directory.byAddress(src);
      if (now === seen) return true;
      seen = now;
      return now !== undefined && now.sandboxId === view.sandboxId && decideAddress(now.policy, opts.alwaysDenied, isOwnAddress, target.address, d.name).allowed;
    };
    up.once('connect', () => {
      clearTimeout(timer);
      client.off('close', onClientGone);
      splice(client, up, reader, head, t, idleMs, stillAllowed);
    });
  };

  const { server } = await listenTcp(opts.listen, onConnection);
  return {
    address: () => server.address() as net.AddressInfo,
    traffic: (id) => {
      const c = counters.get(id);
      return c ? { ...c } : undefined;
    },
    sandboxIds: () => [...counters.keys()],
    closeSandbox: (id) => {
      for (const [s, owner] of open) if (owner === id) s.resetAndDestroy();
    },
    forget: (id) => {
      limitWarnedAt.delete(id);
      if (counters.get(id)?.open === 0) counters.delete(id);
    },
    close: async () => {
      server.off('connection', onConnection);
      await new Promise<void>((resolve) => (server.listening ? server.close(() => resolve()) : resolve()));
      for (const s of open.keys()) s.destroy();
    },
  };
}

/**
 * readPreamble reads from `client` until parsePreamble decides (or MAX_PREAMBLE_BYTES, or
 * `timeoutMs`), then pauses it and calls done with the verdict and the bytes read; done gets
 * no verdict when the client was slow or went away first.
 */
function readPreamble(client: net.Socket, timeoutMs: number, done: (p: Preamble | undefined, head: Buffer) => void): void {
  let head: Buffer = Buffer.alloc(0);
  let finished = false;
  const finish = (p: Preamble | undefined) => {
    if (finished) return;
    finished = true;
    clearTimeout(timer);
    client.off('data', onData);
    client.off('end', onEnd);
    client.pause();
    done(p, head);
  };
  const onData = (d: Buffer) => {
    head = head.length === 0 ? d : Buffer.concat([head, d]);
    const p = parsePreamble(head);
    if (p.kind !== 'more') return finish(p);
    if (head.length >= MAX_PREAMBLE_BYTES) finish({ kind: 'invalid', why: `preamble over ${MAX_PREAMBLE_BYTES} bytes` });
  };
  const onEnd = () => finish(undefined);
  const timer = setTimeout(() => finish(undefined), timeoutMs);
  client.on('data', onData);
  client.on('end', onEnd);
}

/**
 * splice writes `head` upstream and relays both ways with backpressure and half-close: upstream
 * to client through `reader` (up was made with its onread: large reads, counted per read),
 * client to upstream as a stream pipe; errors reset the other side. Before a chunk is passed on
 * either way, stillAllowed() is asked (the policy in force); false resets both sides.
 */
function splice(client: net.Socket, up: net.Socket, reader: BulkReader, head: Buffer, t: SandboxTraffic, idleMs: number, stillAllowed: () => boolean): void {
  up.on('error', () => {
    if (!client.destroyed) client.resetAndDestroy();
  });
  client.on('error', () => {
    if (!up.destroyed) up.resetAndDestroy();
  });
  client.on('close', () => up.destroy());
  up.on('close', () => {
    if (!client.writableEnded) client.destroy();
  });
  const idle = () => {
    client.destroy();
    up.destroy();
  };
  client.setTimeout(idleMs, idle);
  up.setTimeout(idleMs, idle);
  client.setNoDelay(true);
  t.bytesOut += head.length;
  up.write(head);
  const revoked = () => {
    if (stillAllowed()) return false;
    client.unpipe(up);
    client.resetAndDestroy();
    up.resetAndDestroy();
    return true;
  };
  client.on('data', (b: Buffer) => {
    if (!revoked()) t.bytesOut += b.length;
  });
  client.pipe(up);
  reader.attach(up, client, (n) => {
    if (!revoked()) t.bytesIn += n;
  });
  up.on('end', () => client.end());
}
