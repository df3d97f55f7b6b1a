/**
 * Passing listening sockets between unrelated processes with SCM_RIGHTS (unix(7)), through the
 * `usocket` package. The receiver listens on a unix socket; the sender connects, writes one
 * length-prefixed JSON message with the fds attached, and ends.
 */
import { rmSync } from 'node:fs';

const usocket = require('usocket') as {
  UServer: new () => {
    listen(path: string, cb?: () => void): void;
    on(ev: 'connection', cb: (s: USock) => void): void;
    on(ev: 'error', cb: (e: Error) => void): void;
    close(): void;
  };
  USocket: new () => USock;
};

interface USock {
  connect(path: string, cb?: () => void): void;
  on(ev: string, cb: (...a: unknown[]) => void): void;
  read(size: number, fds?: number): { data?: Buffer; fds?: number[] } | Buffer | null;
  write(msg: { data: Buffer; fds?: number[]; callback?: () => void }): void;
  end(msg?: { data: Buffer; fds?: number[]; callback?: () => void }): void;
  destroy(): void;
}

/** What travels with the fds. */
export interface FdMessage<T> {
  meta: T;
  fds: number[];
}

/**
 * receiveFds listens at path and resolves with the first message (meta + fds), or rejects
 * after timeoutMs. The socket file is removed afterwards.
 */
export function receiveFds<T>(path: string, timeoutMs: number): { ready: Promise<void>; message: Promise<FdMessage<T>> } {
  rmSync(path, { force: true });
  const server = new usocket.UServer();
  let onReady!: () => void;
  const ready = new Promise<void>((r) => (onReady = r));
  const message = new Promise<FdMessage<T>>((resolve, reject) => {
    const timer = setTimeout(() => {
      server.close();
      rmSync(path, { force: true });
      reject(new Error(`no sockets arrived at ${path} within ${timeoutMs} ms`));
    }, timeoutMs);
    server.on('error', reject);
    server.on('connection', (sock) => {
      let header: number | undefined;
      let fdCount = 0;
      sock.on('readable', () => {
        if (header === undefined) {
          const h = sock.read(8) as Buffer | null;
          if (!h) return;
          header = h.readUInt32BE(0);
          fdCount = h.readUInt32BE(4);
        }
        const body = sock.read(header, fdCount) as { data?: Buffer; fds?: number[] } | null;
        if (!body) return;
        clearTimeout(timer);
        server.close();
        rmSync(path, { force: true });
        sock.end();
        resolve({ meta: JSON.parse((body.data ?? Buffer.alloc(0)).toString()) as T, fds: body.fds ?? [] });
      });
    });
    server.listen(path, () => onReady());
  });
  return { ready, message };
}

/** sendFds connects to path and sends meta with fds (duplicated into the receiver). */
export function sendFds<T>(path: string, meta: T, fds: number[], timeoutMs = 5000): Promise<void> {
  return new Promise((resolve, reject) => {
    const sock = new usocket.USocket();
    const timer = setTimeout(() => {
      sock.destroy();
      reject(new Error(`could not send sockets to ${path} within ${timeoutMs} ms`));
    }, timeoutMs);
    sock.on('error', (e) => {
      clearTimeout(timer);
      reject(e as Error);
    });
    sock.connect(path, () => {
      const body = Buffer.from(JSON.stringify(meta));
      const head = Buffer.alloc(8);
      head.writeUInt32BE(body.length, 0);
      head.writeUInt32BE(fds.length, 4);
      sock.write({ data: head });
      sock.end({
        data: body,
        fds,
        callback: () => {
          clearTimeout(timer);
          resolve();
        },
      });
    });
  });
}
