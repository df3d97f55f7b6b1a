/**
 * Where the egress proxy and the resolver listen: a socket the caller already has (handed over
 * from the previous server, or opened by main.ts), an inherited fd, or host:port (tests).
 */
import dgram from 'node:dgram';
import net from 'node:net';

/** A TCP listening socket: an open net.Server (made with allowHalfOpen: true), an fd, or an address to bind. */
export type TcpListen = { server: net.Server } | { fd: number } | { host: string; port: number };
/** A UDP socket: a bound dgram.Socket, an fd, or an address to bind. */
export type UdpListen = { socket: dgram.Socket } | { fd: number } | { host: string; port: number };

/** Per-sandbox counters of a proxy (for metrics): bytes are payload bytes, both directions. */
export interface SandboxTraffic {
  /** connections (or DNS queries) accepted from the sandbox */
  connections: number;
  /** of those, refused by the policy or a limit */
  refused: number;
  /** open now */
  open: number;
  /** bytes from the sandbox to upstreams */
  bytesOut: number;
  /** bytes from upstreams to the sandbox */
  bytesIn: number;
}

/** newTraffic is a zeroed SandboxTraffic. */
export function newTraffic(): SandboxTraffic {
  return { connections: 0, refused: 0, open: 0, bytesOut: 0, bytesIn: 0 };
}

/** listenTcp returns a listening net.Server for `l` (given servers are returned as they are). Rejects on a bind error. */
export async function listenTcp(l: TcpListen, onConnection: (s: net.Socket) => void): Promise<{ server: net.Server; owned: boolean }> {
  if ('server' in l) {
    l.server.on('connection', onConnection);
    return { server: l.server, owned: false };
  }
  const server = net.createServer({ allowHalfOpen: true, pauseOnConnect: false }, onConnection);
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen('fd' in l ? { fd: l.fd } : { host: l.host, port: l.port }, () => {
      server.off('error', reject);
      resolve();
    });
  });
  return { server, owned: true };
}

/** bindUdp returns a bound udp4 socket for `l`. Rejects on a bind error. */
export async function bindUdp(l: UdpListen): Promise<{ socket: dgram.Socket; owned: boolean }> {
  if ('socket' in l) return { socket: l.socket, owned: false };
  const socket = dgram.createSocket({ type: 'udp4' });
  await new Promise<void>((resolve, reject) => {
    socket.once('error', reject);
    socket.bind('fd' in l ? { fd: l.fd } : { address: l.host, port: l.port }, () => {
      socket.off('error', reject);
      resolve();
    });
  });
  return { socket, owned: true };
}
