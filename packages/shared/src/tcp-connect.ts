/** connectTcp: one TCP connect with a deadline, for the proxies and relays that dial on a user's behalf. */
import net from 'node:net';

/**
 * connectTcp connects with `opts` and resolves with the socket once connected (its 'error'
 * listeners removed: the caller adds its own). Rejects with the socket's error (e.g. code
 * ECONNREFUSED), or with `onTimeout()` (default an Error "connect timed out after <ms> ms")
 * after timeoutMs ms, the socket destroyed.
 */
export function connectTcp(opts: net.NetConnectOpts, timeoutMs: number, onTimeout: () => Error = () => new Error(`connect timed out after ${timeoutMs} ms`)): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.connect(opts);
    const timer = setTimeout(() => {
      s.destroy();
      reject(onTimeout());
    }, timeoutMs);
    s.once('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
    s.once('connect', () => {
      clearTimeout(timer);
      s.removeAllListeners('error');
      resolve(s);
    });
  });
}
