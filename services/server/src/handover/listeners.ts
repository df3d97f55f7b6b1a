/**
 * The server's public listeners as sockets we own (not bound by grpc-js), so that a handover
 * can pass them to the next server (SCM_RIGHTS) and no connection is refused: the listening
 * socket never closes, only the process that accepts on it changes.
 *
 * A unix listener is bound at a temporary name and hard-linked to its real name, so that
 * closing it in the old server (Node unlinks the bound path on close) removes only the
 * temporary name and the real one keeps pointing at the live socket.
 */
import { chmodSync, existsSync, linkSync, rmSync } from 'node:fs';
import net from 'node:net';

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

/** bindListener binds address ("unix:///abs.sock" or "host:port"). */
export async function bindListener(address: string): Promise<OwnedListener> {
  const server = net.createServer({ pauseOnConnect: false });
  if (address.startsWith('unix://')) {
    const p = address.slice('unix://'.length);
    const tmp = `${p}.${process.pid}.tmp`;
    rmSync(tmp, { force: true });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(tmp, () => resolve());
    });
    chmodSync(tmp, 0o600);
    if (existsSync(p)) rmSync(p, { force: true }); // stale socket of a dead server
    linkSync(tmp, p);
    rmSync(tmp, { force: true });
    return { address, server, fd: fdOf(server), port: 0 };
  }
  const idx = address.lastIndexOf(':');
  const host = address.slice(0, idx);
  const port = Number(address.slice(idx + 1));
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen({ host, port, exclusive: true }, () => resolve());
  });
  const bound = (server.address() as net.AddressInfo).port;
  return { address: `${host}:${bound}`, server, fd: fdOf(server), port: bound };
}

/** adoptListener serves on a listening socket fd received from the previous server. */
export async function adoptListener(address: string, fd: number): Promise<OwnedListener> {
  const server = net.createServer();
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen({ fd }, () => resolve());
  });
  const a = server.address();
  const port = a && typeof a === 'object' ? a.port : 0;
  return { address, server, fd, port };
}
