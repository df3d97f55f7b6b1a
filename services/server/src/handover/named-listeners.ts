/**
 * Named listeners: the server's sockets beside the gRPC ones that a handover passes on the same
 * way (listeners.ts: SCM_RIGHTS, and a process accepts only once it serves): the ingress
 * listener, the egress proxy's TCP listener and the DNS resolver's TCP and UDP sockets.
 *
 * On the fd socket they travel after the gRPC listeners: meta `named` (name, kind, address of
 * each) + their fds after the gRPC fds. An older standby (0.2.0) knows no named listener and
 * would take every fd for a gRPC listener, so the old server sends a named listener only to a
 * standby whose HandoverRequest.standby_features lists that listener's feature
 * (NAMED_LISTENER_FEATURES); the others are closed with the old server, and PrepareHandover says
 * so (namedListenerLosses). A new server adopts the named listeners it receives and wants (same
 * name, kind and address), closes the received fds it does not want, and binds the rest fresh.
 */
import type dgram from 'node:dgram';
import { closeSync } from 'node:fs';
import net from 'node:net';
import { SERVER_FEATURES } from '@sandnode/shared';

export type NamedListenerName = 'ingress' | 'egress-proxy' | 'dns-tcp' | 'dns-udp';
export type NamedListenerKind = 'tcp' | 'udp';

/** The feature a standby must list to be sent each named listener. */
export const NAMED_LISTENER_FEATURES: Record<NamedListenerName, string> = {
  ingress: SERVER_FEATURES.ingress,
  'egress-proxy': 'server.egress-proxy.v1',
  'dns-tcp': 'server.dns.v1',
  'dns-udp': 'server.dns.v1',
};

const KIND: Record<NamedListenerName, NamedListenerKind> = { ingress: 'tcp', 'egress-proxy': 'tcp', 'dns-tcp': 'tcp', 'dns-udp': 'udp' };

/** One named listener: which, and where ("host:port", IPv4 or [IPv6]). */
export interface NamedListenerSpec {
  name: NamedListenerName;
  kind: NamedListenerKind;
  address: string;
}

/** namedSpec is the spec of name at address (its kind is fixed by the name). */
export function namedSpec(name: NamedListenerName, address: string): NamedListenerSpec {
  return { name, kind: KIND[name], address };
}

/** A named listener this process accepts (tcp) or receives (udp) on. */
export interface OwnedNamedListener extends NamedListenerSpec {
  socket: net.Server | dgram.Socket;
  /** the socket's fd (to pass on) */
  fd: number;
  /** the bound port */
  port: number;
  /** close stops accepting / receiving here (the socket lives on in a process it was passed to) */
  close(): void;
}

/**
 * What serves a named listener: a net.Server (tcp) or dgram.Socket (udp, of the address's
 * family) with every handler attached and not yet listening, or undefined when this server does
 * not serve that listener now.
 */
export type NamedServe = (spec: NamedListenerSpec) => net.Server | dgram.Socket | undefined;

/** A named listener as it arrived from the old server. */
export interface ReceivedNamed extends NamedListenerSpec {
  fd: number;
}

function splitHostPort(address: string): { host: string; port: number } {
  const idx = address.lastIndexOf(':');
  if (idx <= 0) throw new Error(`named listener address ${JSON.stringify(address)} is not host:port`);
  const host = address.slice(0, idx).replace(/^\[(.*)\]$/, '$1');
  const port = Number(address.slice(idx + 1));
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`named listener address ${JSON.stringify(address)} has a bad port`);
  return { host, port };
}

/** udpFd: the fd of a bound dgram socket (Node keeps the handle behind a symbol). */
function udpFd(s: dgram.Socket): number {
  const sym = Object.getOwnPropertySymbols(s).find((k) => String(k) === 'Symbol(state symbol)');
  const fd = sym ? (s as unknown as Record<symbol, { handle?: { fd?: number } }>)[sym]?.handle?.fd : undefined;
  if (typeof fd !== 'number' || fd < 0) throw new Error('udp socket has no fd');
  return fd;
}

function tcpFd(s: net.Server): number {
  const fd = (s as unknown as { _handle?: { fd?: number } })._handle?.fd;
  if (typeof fd !== 'number' || fd < 0) throw new Error('listener has no fd');
  return fd;
}

/** namedText is a named listener as reports and logs show it: "name kind host:port". */
export function namedText(l: NamedListenerSpec): string {
  return `${l.name} ${l.kind} ${l.address}`;
}

function own(spec: NamedListenerSpec, socket: net.Server | dgram.Socket): OwnedNamedListener {
  if (socket instanceof net.Server) {
    const a = socket.address();
    return { ...spec, socket, fd: tcpFd(socket), port: a && typeof a === 'object' ? a.port : 0, close: () => socket.close() };
  }
  return {
    ...spec,
    socket,
    fd: udpFd(socket),
    port: socket.address().port,
    close: () => {
      try {
        socket.close();
      } catch {
        /* closed already */
      }
    },
  };
}

async function openOne(spec: NamedListenerSpec, socket: net.Server | dgram.Socket, fd?: number): Promise<OwnedNamedListener> {
  const { host, port } = splitHostPort(spec.address);
  await new Promise<void>((resolve, reject) => {
    socket.once('error', reject);
    const done = () => {
      socket.off('error', reject);
      resolve();
    };
    if (socket instanceof net.Server) {
      if (fd !== undefined) socket.listen({ fd }, done);
      else socket.listen({ host, port, exclusive: true }, done);
    } else if (fd !== undefined) socket.bind({ fd }, done);
    else socket.bind({ address: host, port, exclusive: true }, done);
  });
  return own(spec, socket);
}

/**
 * openNamedListeners starts each wanted listener on the socket serve gives for it (handlers
 * attached first: nothing is accepted before they are): the received fd of the same name, kind
 * and address, else a fresh bind. Received fds nobody wants (not wanted, another address, an
 * unknown name, or serve gave nothing) are closed. A listener that cannot open (EADDRINUSE, a
 * bad address ...) is in `failed` with its error; the others open all the same (the gRPC API
 * does not go down because the ingress port is taken). Never throws.
 */
export async function openNamedListeners(
  wanted: readonly NamedListenerSpec[],
  received: readonly ReceivedNamed[],
  serve: NamedServe,
): Promise<{ opened: OwnedNamedListener[]; failed: { spec: NamedListenerSpec; err: Error }[] }> {
  const opened: OwnedNamedListener[] = [];
  const failed: { spec: NamedListenerSpec; err: Error }[] = [];
  const left = new Set(received);
  for (const spec of wanted) {
    const r = [...left].find((x) => x.name === spec.name && x.kind === spec.kind && x.address === spec.address);
    let socket: net.Server | dgram.Socket | undefined;
    try {
      socket = serve(spec);
      if (!socket) continue;
      if (r) left.delete(r);
      opened.push(await openOne(spec, socket, r?.fd));
    } catch (err) {
      if (r && !left.has(r)) closeQuietly(r.fd);
      failed.push({ spec, err: err as Error });
    }
  }
  for (const r of left) closeQuietly(r.fd);
  return { opened, failed };
}

function closeQuietly(fd: number): void {
  try {
    closeSync(fd);
  } catch {
    /* not open */
  }
}

/** namedToSend: the listeners a standby with these features may be sent (see the file header). */
export function namedToSend<T extends NamedListenerSpec>(named: readonly T[], standbyFeatures: readonly string[]): T[] {
  return named.filter((l) => standbyFeatures.includes(NAMED_LISTENER_FEATURES[l.name]));
}

/**
 * namedListenerLosses says, one line each, which of this server's named listeners a standby
 * with these features would not get (for PrepareHandover's reasons and `upgrade --dry-run`);
 * empty when it gets all of them.
 */
export function namedListenerLosses(named: readonly NamedListenerSpec[], standbyFeatures: readonly string[]): string[] {
  const lost = named.filter((l) => !standbyFeatures.includes(NAMED_LISTENER_FEATURES[l.name]));
  return lost.map((l) => `the ${l.name} listener (${l.kind} ${l.address}) stops: the standby lacks ${NAMED_LISTENER_FEATURES[l.name]}`);
}

/** The fd-socket message of a handover: gRPC listener addresses, then the named ones; fds in that order. */
export interface HandoverFdMeta {
  listeners: string[];
  named?: NamedListenerSpec[];
}

/** splitReceived: the gRPC listeners and the named ones of a received fd message (an old server sends no `named`). */
export function splitReceived(meta: HandoverFdMeta, fds: number[]): { grpc: { address: string; fd: number }[]; named: ReceivedNamed[] } {
  const named = meta.named ?? [];
  const nGrpc = Math.max(0, fds.length - named.length);
  return {
    grpc: fds.slice(0, nGrpc).map((fd, i) => ({ address: meta.listeners[i] ?? `fd:${fd}`, fd })),
    // a name this server does not know keeps its kind and address: nothing wants it, so its fd is closed when opening
    named: named.flatMap((n, i) => {
      const fd = fds[nGrpc + i];
      return typeof fd === 'number' ? [{ name: n.name, kind: n.kind, address: n.address, fd }] : [];
    }),
  };
}
