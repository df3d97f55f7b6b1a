/**
 * The sandboxes' DNS resolver (feature server.dns.v1, docs/network.md "DNS"): the node's
 * prerouting chain redirects a sandbox's udp/tcp 53 (to any address) to `dnsPort` here. A
 * query is looked up by its source address (NetworkDirectory.byAddress: unknown sources are
 * dropped, or their TCP connection closed), its one question is checked with the shared
 * nameAllowed, and an allowed one is forwarded unchanged (but for a fresh id) to the node's
 * upstreams; the answer goes back with the sandbox's id and is not rewritten. A refused name is
 * answered NXDOMAIN (why not REFUSED: docs/network.md). Malformed messages are dropped.
 */
import type dgram from 'node:dgram';
import type net from 'node:net';
import dnsPacket from 'dns-packet';
import { nameAllowed, type Logger } from '@sandnode/shared';
import type { NetworkDirectory, SandboxNetworkView } from '../core/network-directory';
import { bindUdp, listenTcp, newTraffic, type SandboxTraffic, type TcpListen, type UdpListen } from './sockets';
import type { UpstreamDns } from './upstream-dns';

/** Queries one sandbox may have waiting for an upstream at once; more are answered SERVFAIL. */
export const DEFAULT_DNS_MAX_INFLIGHT = 64;
/** A TCP connection with no complete query for this long is closed, ms. */
export const DEFAULT_DNS_TCP_IDLE_MS = 10_000;
/** Open TCP connections per sandbox. */
export const DEFAULT_DNS_MAX_TCP_PER_SANDBOX = 16;
/**
 * Answers a TCP connection may leave unread in the server's memory (beyond the kernel's socket
 * buffers), bytes; more and the connection is closed. Answers of refused names come at once, so
 * the in-flight limit does not bound a client that pipelines queries and never reads.
 */
export const DNS_TCP_MAX_UNREAD_BYTES = 256 * 1024;

const RCODE = { SERVFAIL: 2, NXDOMAIN: 3, NOTIMP: 4 } as const;
const QR = 0x8000;
const RD = 0x0100;
const RA = 0x0080;

/** Options of {@link startDnsResolver}. */
export interface DnsResolverOptions {
  directory: NetworkDirectory;
  upstream: UpstreamDns;
  udp: UdpListen;
  tcp: TcpListen;
  logger: Logger;
  /** per sandbox (default DEFAULT_DNS_MAX_INFLIGHT) */
  maxInflight?: number;
  /** ms (default DEFAULT_DNS_TCP_IDLE_MS) */
  tcpIdleMs?: number;
  /** per sandbox (default DEFAULT_DNS_MAX_TCP_PER_SANDBOX) */
  maxTcpConnections?: number;
}

/** A running resolver. */
export interface DnsResolver {
  /** the bound UDP and TCP addresses */
  udpAddress(): { address: string; port: number };
  tcpAddress(): { address: string; port: number };
  /** counters of sandboxId (queries as connections; refused = NXDOMAIN/SERVFAIL answers and drops) */
  traffic(sandboxId: string): SandboxTraffic | undefined;
  /** sandboxIds that have counters (for a metrics scrape) */
  sandboxIds(): string[];
  /** forget drops sandboxId's counters (after its delete; not while it has TCP connections or queries in flight) */
  forget(sandboxId: string): void;
  /** close stops listening (sockets it was given are closed too) and ends open TCP connections */
  close(): Promise<void>;
}

/**
 * answerQuery decides one query message from `view`'s sandbox: undefined to drop it (malformed,
 * not a query), or a promise of the answer message. Exported for unit tests.
 */
export function answerQuery(view: SandboxNetworkView, msg: Buffer, upstream: UpstreamDns, tcp: boolean): Promise<Buffer> | undefined {
  let q: dnsPacket.Packet;
  try {
    if (msg.length < 12 || (msg.readUInt16BE(2) & QR) !== 0) return undefined;
    q = dnsPacket.decode(msg);
  } catch {
    return undefined;
  }
  const opcode = (msg.readUInt16BE(2) >> 11) & 0xf;
  const questions = q.questions ?? [];
  if (opcode !== 0) return Promise.resolve(reply(q, RCODE.NOTIMP));
  if (questions.length !== 1) return undefined;
  const verdict = nameAllowed(view.policy, questions[0]!.name);
  if (!verdict.allowed) return Promise.resolve(reply(q, RCODE.NXDOMAIN));
  return upstream.exchange(msg, tcp).catch(() => reply(q, RCODE.SERVFAIL));
}

function reply(q: dnsPacket.Packet, rcode: number): Buffer {
  return dnsPacket.encode({ type: 'response', id: q.id ?? 0, flags: ((q.flags ?? 0) & RD) | RA | rcode, questions: q.questions ?? [] });
}

/** startDnsResolver listens on opts.udp and opts.tcp and serves queries until close(). Rejects on a bind error. */
export async function startDnsResolver(opts: DnsResolverOptions): Promise<DnsResolver> {
  const maxInflight = opts.maxInflight ?? DEFAULT_DNS_MAX_INFLIGHT;
  const idleMs = opts.tcpIdleMs ?? DEFAULT_DNS_TCP_IDLE_MS;
  const maxTcp = opts.maxTcpConnections ?? DEFAULT_DNS_MAX_TCP_PER_SANDBOX;
  const log = opts.logger.child({ component_part: 'dns-resolver' });
  const counters = new Map<string, SandboxTraffic & { inflight: number }>();
  const conns = new Set<net.Socket>();
  const countersOf = (id: string) => {
    let c = counters.get(id);
    if (!c) counters.set(id, (c = { ...newTraffic(), inflight: 0 }));
    return c;
  };

  /** handle runs one query of `view` and calls send with the answer (not at all for a drop). */
  const handle = (view: SandboxNetworkView, msg: Buffer, tcp: boolean, send: (b: Buffer) => void) => {
    const c = countersOf(view.sandboxId);
    c.connections++;
    c.bytesOut += msg.length;
    if (c.inflight >= maxInflight) {
      c.refused++;
      const busy = busyAnswer(msg);
      if (busy) send(busy);
      return;
    }
    const answer = answerQuery(view, msg, opts.upstream, tcp);
    if (!answer) {
      c.refused++;
      return;
    }
    c.inflight++;
    void answer.then((b) => {
      c.inflight--;
      const rcode = b.length >= 4 ? b.readUInt16BE(2) & 0xf : 0;
      if (rcode === RCODE.NXDOMAIN || rcode === RCODE.SERVFAIL) c.refused++;
      c.bytesIn += b.length;
      send(b);
    });
  };

  const { socket: udp, owned: ownsUdp } = await bindUdp(opts.udp);
  udp.on('error', (err) => log.warn({ err }, 'dns udp socket error'));
  udp.on('message', (msg: Buffer, rinfo: dgram.RemoteInfo) => {
    const view = opts.directory.byAddress(rinfo.address);
    if (!view) return; // unknown source: dropped
    handle(view, msg, false, (b) => udp.send(b, rinfo.port, rinfo.address));
  });

  let tcpServer: net.Server;
  try {
    ({ server: tcpServer } = await listenTcp(opts.tcp, (sock) => {
      const view = sock.remoteAddress ? opts.directory.byAddress(sock.remoteAddress.replace(/^::ffff:/, '')) : undefined;
      if (!view) return sock.destroy();
      const c = countersOf(view.sandboxId);
      if (c.open >= maxTcp) {
        c.refused++;
        return sock.destroy();
      }
      c.open++;
      conns.add(sock);
      sock.on('close', () => {
        c.open--;
        conns.delete(sock);
      });
      sock.on('error', () => sock.destroy());
      sock.setTimeout(idleMs, () => sock.destroy());
      let buf = Buffer.alloc(0);
      sock.on('data', (d: Buffer) => {
        buf = Buffer.concat([buf, d]);
        while (!sock.destroyed && buf.length >= 2 && buf.length >= 2 + buf.readUInt16BE(0)) {
          const msg = buf.subarray(2, 2 + buf.readUInt16BE(0));
          buf = buf.subarray(2 + msg.length);
          handle(view, Buffer.from(msg), true, (b) => {
            if (sock.destroyed || b.length > 65535) return;
            const len = Buffer.alloc(2);
            len.writeUInt16BE(b.length);
            sock.write(Buffer.concat([len, b]));
            if (sock.writableLength > DNS_TCP_MAX_UNREAD_BYTES) {
              c.refused++;
              log.debug({ sandbox_id: view.sandboxId, unread: sock.writableLength }, 'dns: tcp client does not read its answers: closed');
              sock.destroy();
            }
          });
        }
      });
    }));
  } catch (err) {
    if (ownsUdp) udp.close();
    throw err;
  }

  return {
    udpAddress: () => udp.address(),
    tcpAddress: () => tcpServer.address() as net.AddressInfo,
    traffic: (id) => {
      const c = counters.get(id);
      return c ? { connections: c.connections, refused: c.refused, open: c.open, bytesOut: c.bytesOut, bytesIn: c.bytesIn } : undefined;
    },
    sandboxIds: () => [...counters.keys()],
    forget: (id) => {
      const c = counters.get(id);
      if (c && c.open === 0 && c.inflight === 0) counters.delete(id);
    },
    close: async () => {
      for (const s of conns) s.destroy();
      await Promise.all([new Promise<void>((resolve) => udp.close(() => resolve())), new Promise<void>((resolve) => (tcpServer.listening ? tcpServer.close(() => resolve()) : resolve()))]);
    },
  };
}

function busyAnswer(msg: Buffer): Buffer | undefined {
  try {
    return reply(dnsPacket.decode(msg), RCODE.SERVFAIL);
  } catch {
    return undefined;
  }
}
