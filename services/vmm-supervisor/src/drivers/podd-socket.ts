/**
 * The podd socket of a VM, bound on the host by the supervisor (never by the sandbox):
 *
 *   <podd_socket_dir>/podd.sock   the listening unix socket (0600); its fd is handed to the VM
 *   <podd_socket_dir>/guest/      the only part of the dir the VM sees (runc: /run/sandnode; a
 *                                 symlink to the VM's guest run dir tmpfs, see vm-tmpfs.ts)
 *
 * The sandbox cannot see, replace or redirect `podd.sock`: it holds an fd of the socket, not
 * a path. The supervisor binds a hidden temp name, hands the fd to the VM, then links the
 * final name and closes its own copy in one tick (closing unlinks only the temp name), so no
 * connection is ever accepted by the supervisor itself.
 */
import { randomBytes } from 'node:crypto';
import { chmodSync, linkSync, lstatSync, mkdirSync, readdirSync, renameSync, rmSync, symlinkSync, unlinkSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';

/** File name of podd's socket in podd_socket_dir. */
export const PODD_SOCKET_NAME = 'podd.sock';
/** Sub dir of podd_socket_dir that the VM sees (podd writes its log there). */
export const PODD_GUEST_DIR = 'guest';
/** The fd number podd's listening socket has inside the VM. */
export const PODD_LISTEN_FD = 3;
/** The env var that tells the VM's init which fd is podd's listening socket. */
export const PODD_LISTEN_FD_ENV = 'SANDNODE_PODD_LISTEN_FD';

/** Temp bind names (`.p` + 7 hex) and their staging links (`<tmp>.final`). */
const TMP_NAME_RE = /^\.p[0-9a-f]{7}$/;
const TMP_FINAL_RE = /^\.p[0-9a-f]{7}\.final$/;

/** PoddSocket is a bound, listening podd socket not yet published under its final name. */
export interface PoddSocket {
  /** fd of the listening socket, to hand to the VM. */
  readonly fd: number;
  /** Final host path `<dir>/podd.sock` (exists only after publish()). */
  readonly path: string;
  /**
   * publish links the final name to the socket (atomically replacing a stale one) and closes
   * the supervisor's copy. Synchronous from link to close: no accept can run in between.
   */
  publish(): void;
  /** discard closes the supervisor's copy without publishing (create failed). */
  discard(): void;
}

/**
 * preparePoddDirs creates podd_socket_dir (0755) and returns the guest dir: without guestMount
 * its guest/ sub dir (a real directory; anything else there, e.g. a symlink, is removed
 * first); with guestMount (the VM's guest run dir tmpfs, vm-tmpfs.ts) guest/ becomes a symlink
 * to it, replacing whatever was there (a sandbox-written dir of an older VM is removed, never
 * followed), and guestMount is returned.
 */
export function preparePoddDirs(poddSocketDir: string, guestMount?: string): string {
  mkdirSync(poddSocketDir, { recursive: true, mode: 0o755 });
  const guest = path.join(poddSocketDir, PODD_GUEST_DIR);
  if (guestMount !== undefined) {
    rmSync(guest, { recursive: true, force: true });
    symlinkSync(guestMount, guest);
  } else {
    try {
      if (!lstatSync(guest).isDirectory()) rmSync(guest, { force: true });
    } catch {
      /* missing */
    }
    mkdirSync(guest, { recursive: true, mode: 0o755 });
  }
  // Temp names left by a supervisor killed between bind and publish.
  for (const name of readdirSync(poddSocketDir)) {
    if (TMP_NAME_RE.test(name) || TMP_FINAL_RE.test(name)) rmSync(path.join(poddSocketDir, name), { force: true });
  }
  return guestMount ?? guest;
}

/**
 * bindPoddSocket binds and listens on a temp name in poddSocketDir (mode 0600) and returns the
 * socket; call publish() once the VM holds the fd, discard() otherwise.
 */
export async function bindPoddSocket(poddSocketDir: string): Promise<PoddSocket> {
  const finalPath = path.join(poddSocketDir, PODD_SOCKET_NAME);
  // As long as "podd.sock", so any dir whose podd.sock fits a socket address can bind it.
  const tmpPath = path.join(poddSocketDir, `.p${randomBytes(4).toString('hex').slice(0, 7)}`);
  const server = net.createServer();
  // A connection can only reach the temp name, which nobody knows; close them if one does.
  server.on('connection', (c) => c.destroy());
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(tmpPath, () => {
      server.off('error', reject);
      resolve();
    });
  });
  chmodSync(tmpPath, 0o600);
  const fd = (server as unknown as { _handle?: { fd?: number } })._handle?.fd;
  if (typeof fd !== 'number' || fd < 0) {
    server.close();
    throw new Error('cannot get the fd of the podd socket');
  }
  let closed = false;
  const close = () => {
    if (closed) return;
    closed = true;
    server.close(); // unlinks tmpPath only
    try {
      unlinkSync(tmpPath);
    } catch {
      /* already unlinked by close */
    }
  };
  return {
    fd,
    path: finalPath,
    publish() {
      const staging = `${tmpPath}.final`;
      linkSync(tmpPath, staging);
      renameSync(staging, finalPath);
      close();
    },
    discard: close,
  };
}
