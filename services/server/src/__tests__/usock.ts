/** usocket's USocket as the server's tests use it (a unix client that receives fds by SCM_RIGHTS): files-bulk.it and bulk-transfer.test. */

/** The part of usocket's USocket a test uses. */
export interface USock {
  connect(p: string, cb: () => void): void;
  on(ev: string, cb: (e?: Error) => void): void;
  read(size?: number, fds?: number): ({ data?: Buffer; fds?: number[] } & { toString(): string }) | null;
  write(b: Buffer): void;
  removeAllListeners(ev: string): void;
  destroy(): void;
}

/** The usocket module, typed as the tests use it. */
export const usocket = require('usocket') as { USocket: new () => USock };
