/**
 * A server's admin socket (`<runDir>/server-<slot or pid>-admin.sock`) is how the CLI finds the
 * active server (node-stack lease.ts). If its path is removed (a tmp cleaner) or replaced by
 * something no one serves, the server would run on unseen: `status` would say "no active
 * server" and every upgrade would fail. So the server looks at the path every
 * ADMIN_SOCKET_CHECK_MS and binds it anew when it is not its own socket any more.
 */
import { lstatSync } from 'node:fs';
import net from 'node:net';
import { bindListener, type OwnedListener } from './listeners';
import { connectRefused } from './slot-lock';

/** How often a server looks at its admin socket's path, ms. */
export const ADMIN_SOCKET_CHECK_MS = 2000;

/** An admin socket we bound, and the inode of its path (to tell our socket from another at that name). */
export interface AdminSocketBinding {
  listener: OwnedListener;
  ino: number;
}

function pathOf(address: string): string {
  return address.slice('unix://'.length);
}

/**
 * bindAdminSocket binds address ("unix:///abs.sock") with a new net.Server that serve has made
 * ready (its 'connection' handler attached) and returns it with the inode of its path. Errors:
 * those of bindListener (a directory at the path ...).
 */
export async function bindAdminSocket(address: string, serve: (server: net.Server) => void): Promise<AdminSocketBinding> {
  const server = net.createServer();
  serve(server);
  const listener = await bindListener(address, server);
  return { listener, ino: lstatSync(pathOf(address)).ino };
}

/** What {@link checkAdminSocket} found. */
export type AdminSocketState = 'ours' | 'rebound' | 'foreign';

/**
 * checkAdminSocket looks at the path of bound: 'ours' when it still names the socket we bound;
 * 'foreign' (left alone) when another socket that accepts connections is there; else (the path
 * is gone, or holds a dead socket or a symlink) it binds the path anew with serve, closes the
 * old listener (connections it accepted go on) and answers 'rebound' with the new binding.
 * Errors: those of bindAdminSocket (the old binding is then kept).
 */
export async function checkAdminSocket(bound: AdminSocketBinding, serve: (server: net.Server) => void): Promise<{ state: AdminSocketState; bound: AdminSocketBinding }> {
  const p = pathOf(bound.listener.address);
  const st = lstatSync(p, { throwIfNoEntry: false });
  if (st?.ino === bound.ino) return { state: 'ours', bound };
  if (st?.isSocket() && !(await connectRefused(p))) return { state: 'foreign', bound };
  const fresh = await bindAdminSocket(bound.listener.address, serve);
  bound.listener.server.close();
  return { state: 'rebound', bound: fresh };
}
