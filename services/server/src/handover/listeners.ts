/**
 * The server's public listeners as sockets we own (not bound by grpc-js), so that a handover
 * can pass them to the next server (SCM_RIGHTS) and no connection is refused: the listening
 * socket never closes, only the process that accepts on it changes.
 *
 * A unix listener is bound at a temporary name and hard-linked to its real name, so that
 * closing it in the old server (Node unlinks the bound path on close) removes only the
 * temporary name and the real one keeps pointing at the live socket.
 *
 * A process accepts a connection only once it serves it: Node accepts as soon as a net.Server
 * listens, and a connection accepted before a 'connection' handler is attached is never served
 * (its client waits for the HTTP/2 settings until its deadline). So the caller passes the
 * net.Server with its handler attached (GrpcHost.serveListener) and the listening starts only
 * then (openListeners); until that moment new connections wait in the kernel's backlog of the
 * listening socket, which both servers of a handover share. In a handover the new server
 * starts accepting before the old one stops (both serve what they accept, for a few ms), so
 * no connection waits for the switch.
 */
import { chmodSync, linkSync, lstatSync, rmSync } from 'node:fs';
import net from 'node:net';
import type { ReceivedNamed } from './named-listeners';

export interface OwnedListener {
  /** gRPC address: "unix:///abs.sock" or "host:port" */
  address: string;
  server: net.Server;
  /** the listening socket's fd (to pass on) */
  fd: number;
  /** the bound TCP port (0 for unix) */
  port: number;
}

function fdOf(server: net.Server): number {
  const fd = (server as unknown as { _handle?: { fd?: number } })._handle?.fd;
  if (typeof fd !== 'number' || fd < 0) throw new Error('listener has no fd');
  return fd;
}

/**
 * Where a server's public listeners come from: the listening sockets a handover passed on
 * (address and fd each, and the named listeners: named-listeners.ts), or fresh binds of these
 * addresses (named listeners then bind fresh too).
 */
export type ListenerSource = { received: { address: string; fd: number }[]; named?: ReceivedNamed[] } | { fresh: string[] };

/** The addresses of a source, for reports. */
export function sourceAddresses(src: ListenerSource): string[] {
  return 'fresh' in src ? src.fresh : src.received.map((r) => r.address);
}

/**
 * openListeners starts accepting on every listener of src, each on a net.Server that prepare
 * has made ready to serve (its 'connection' handler attached, for its address: TLS or not)
 * before it listens. Errors: those of bind (EADDRINUSE ...) and listen on a received fd.
 */
export async function openListeners(src: ListenerSource, prepare: (server: net.Server, address: string) => void): Promise<OwnedListener[]> {
  const out: OwnedListener[] = [];
  const ready = (address: string) => {
    const s = net.createServer();
    prepare(s, address);
    return s;
  };
  // all at once (each listen is a round trip through the event loop): a handover's switch waits for the slowest, not the sum
  const opening = 'fresh' in src ? src.fresh.map((a) => bindListener(a, ready(a))) : src.received.map((r) => adoptListener(r.address, r.fd, ready(r.address)));
  const got = await Promise.allSettled(opening);
  const failed = got.find((g): g is PromiseRejectedResult => g.status === 'rejected');
  for (const g of got) if (g.status === 'fulfilled') out.push(g.value);
  if (failed) {
    // the ones that opened close again (not awaited: close waits for accepted connections): the caller gets none
    for (const l of out) l.server.close();
    throw failed.reason;
  }
  return out;
}

/**
 * bindListener binds address ("unix:///abs.sock" or "host:port") with server (its handlers
 * attached). A unix path already taken by a socket (a dead server's leftover) or a symlink (never
 * followed) is replaced; anything else there (a directory, a file) is refused with an Error naming
 * the path. On every failure the temporary name is removed and server is closed. Errors: those
 * of bind and listen (EADDRINUSE ...).
 */
export async function bindListener(address: string, server = net.createServer()): Promise<OwnedListener> {
  if (address.startsWith('unix://')) {
    const p = address.slice('unix://'.length);
    const tmp = `${p}.${process.pid}.tmp`;
    try {
      rmSync(tmp, { force: true });
      await listen(server, tmp);
      chmodSync(tmp, 0o600);
      const there = lstatSync(p, { throwIfNoEntry: false });
      if (there && !there.isSocket() && !there.isSymbolicLink()) {
        throw new Error(`cannot bind ${p}: a ${there.isDirectory() ? 'directory' : 'file that is not a socket'} is there; remove it and start again`);
      }
      if (there) rmSync(p, { force: true }); // a dead server's socket, or a symlink (removed, not followed)
      linkSync(tmp, p);
      rmSync(tmp, { force: true });
    } catch (err) {
      rmSync(tmp, { force: true });
      await closeServer(server);
      throw err;
    }
    return { address, server, fd: fdOf(server), port: 0 };
  }
  const idx = address.lastIndexOf(':');
  const host = address.slice(0, idx);
  const port = Number(address.slice(idx + 1));
  try {
    await listen(server, { host, port, exclusive: true });
  } catch (err) {
    await closeServer(server);
    throw err;
  }
  const bound = (server.address() as net.AddressInfo).port;
  return { address: `${host}:${bound}`, server, fd: fdOf(server), port: bound };
}

/** adoptListener listens with server (its handlers attached) on a listening socket fd received from the previous server. */
export async function adoptListener(address: string, fd: number, server = net.createServer()): Promise<OwnedListener> {
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen({ fd }, () => resolve());
  });
  const a = server.address();
  const port = a && typeof a === 'object' ? a.port : 0;
  return { address, server, fd, port };
}

function listen(server: net.Server, where: string | net.ListenOptions): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(where, () => resolve());
  });
}

/** closeServer closes server if it listens (a failed bind leaves no listener behind). */
function closeServer(server: net.Server): Promise<void> {
  return new Promise<void>((resolve) => (server.listening ? server.close(() => resolve()) : resolve()));
}
