/**
 * The server's half of the bulk channel (feature "server.files.bulk.v1"; the protocol is in
 * @sandnode/shared bulk-channel.ts): one-time tokens that PrepareBulkTransfer issues, and the
 * connections on the public unix socket that begin with BULK_MAGIC. For such a connection the
 * server takes the token (once; unexpired; from the uid and pid it was issued to, read with
 * SO_PEERCRED from this connection), connects to the sandbox's podd, sends it the request the
 * token stands for, and passes that podd connection to the caller (SCM_RIGHTS), then closes its
 * own ends: it copies no byte of the file.
 *
 * Handover: a transfer whose connection was passed runs between the CLI and podd only, so a
 * server handover in the middle of it changes nothing (it finishes). A token issued by the old
 * server is not known to the new one: a bulk connection accepted by the new server with it is
 * refused (UNAUTHENTICATED) and the CLI falls back to the streamed calls.
 */
import net from 'node:net';
import { randomBytes } from 'node:crypto';
import {
  BULK_MAGIC,
  errorLine,
  FailedPreconditionError,
  fdOfSocket,
  InvalidArgumentError,
  libcDup,
  peerCred,
  PermissionDeniedError,
  readLine,
  ResourceExhaustedError,
  UnauthenticatedError,
  type Logger,
  type PeerCred,
  type PoddBulkRequest,
  type RawProtocol,
} from '@sandnode/shared';
import type { SandboxManager } from '../core/sandbox-manager';

/** How long a bulk token is valid, ms. */
export const BULK_TOKEN_TTL_MS = 10_000;
/** Most unused tokens one uid may hold; one more is RESOURCE_EXHAUSTED. */
export const MAX_BULK_TOKENS_PER_UID = 16;
/**
 * Most bulk connections one uid (SO_PEERCRED) may have in the server at once (token line not
 * yet read, or podd being connected); one more is answered RESOURCE_EXHAUSTED at once. Each
 * holds a descriptor for up to BULK_LINE_TIMEOUT_MS + BULK_PODD_CONNECT_MS; before, a caller
 * could open them without bound (attack-bulk-sniff.it.test.ts).
 */
export const MAX_BULK_CONNECTIONS_PER_UID = 32;
/** How long the server waits for the podd's socket to accept, ms. */
export const BULK_PODD_CONNECT_MS = 5000;

/** What a token stands for. */
interface Grant {
  uid: number;
  pid: number;
  sandboxId: string;
  request: PoddBulkRequest;
  expiresAtMs: number;
}

const usocket = require('usocket') as {
  USocket: new (o: { fd: number }) => {
    write(msg: { data: Buffer; fds?: number[]; callback?: () => void }): void;
    on(ev: string, cb: (...a: unknown[]) => void): void;
    destroy(): void;
  };
};

/** BulkChannel holds the tokens and serves the bulk connections (file header). */
export class BulkChannel {
  private readonly grants = new Map<string, Grant>();
  /** bulk connections being served, by uid */
  private readonly serving = new Map<number, number>();
  /** the active server's records (set when it activates) */
  manager: SandboxManager | undefined;

  constructor(
    private readonly log?: Logger,
    readonly ttlMs = BULK_TOKEN_TTL_MS,
    private readonly now: () => number = Date.now,
  ) {}

  /** raw is the listener hook (GrpcHost.serveListener) of the public unix sockets. */
  readonly raw: RawProtocol = {
    magic: BULK_MAGIC,
    handle: (socket) => {
      this.serve(socket).catch((err: unknown) => this.log?.warn({ err }, 'bulk connection failed'));
    },
  };

  /** issue makes a token for request on sandboxId, bound to the caller's uid and pid. Errors: RESOURCE_EXHAUSTED (MAX_BULK_TOKENS_PER_UID unused tokens). */
  issue(caller: { uid: number; pid: number }, sandboxId: string, request: PoddBulkRequest): string {
    this.sweep();
    let held = 0;
    for (const g of this.grants.values()) if (g.uid === caller.uid) held++;
    if (held >= MAX_BULK_TOKENS_PER_UID) throw new ResourceExhaustedError(`uid ${caller.uid} holds ${held} unused bulk tokens (the most); use or let them expire (${this.ttlMs} ms)`);
    const token = randomBytes(32).toString('base64url');
    this.grants.set(token, { uid: caller.uid, pid: caller.pid, sandboxId, request, expiresAtMs: this.now() + this.ttlMs });
    return token;
  }

  /**
   * take removes token and returns its grant when cred is the caller it was issued to. The
   * token is gone after the first try, whoever made it. Errors: UNAUTHENTICATED (unknown, used
   * or expired), PERMISSION_DENIED (another uid or pid).
   */
  take(token: string, cred: Pick<PeerCred, 'uid' | 'pid'>): Grant {
    const g = this.grants.get(token);
    this.grants.delete(token);
    if (!g) throw new UnauthenticatedError('bulk token: unknown or used (a token is good for one connection)');
    if (g.expiresAtMs <= this.now()) throw new UnauthenticatedError(`bulk token: expired (valid ${this.ttlMs} ms)`);
    if (g.uid !== cred.uid || g.pid !== cred.pid) throw new PermissionDeniedError(`bulk token: issued to uid ${g.uid} pid ${g.pid}, presented by uid ${cred.uid} pid ${cred.pid}`);
    return g;
  }

  private sweep(): void {
    const t = this.now();
    for (const [k, g] of this.grants) if (g.expiresAtMs <= t) this.grants.delete(k);
  }

  /**
   * serve runs one bulk connection (magic already read): token line -> checks -> podd connection
   * passed; an error line otherwise. Errors (the line's code): INVALID_ARGUMENT (no token line of
   * at most 128 bytes within BULK_LINE_TIMEOUT_MS), RESOURCE_EXHAUSTED (MAX_BULK_CONNECTIONS_PER_UID),
   * take's, FAILED_PRECONDITION (the sandbox is not RUNNING, its podd does not accept).
   */
  async serve(socket: net.Socket): Promise<void> {
    socket.on('error', () => undefined);
    let podd: net.Socket | undefined;
    let uid: number | undefined;
    try {
      const cred = peerCred(socket);
      const n = this.serving.get(cred.uid) ?? 0;
      if (n >= MAX_BULK_CONNECTIONS_PER_UID) throw new ResourceExhaustedError(`uid ${cred.uid} has ${n} bulk connections being set up (the most); retry when one is done`);
      this.serving.set((uid = cred.uid), n + 1);
      const token = await readLine(socket, 128).catch((e: unknown) => {
        throw new InvalidArgumentError(`bulk connection: no token line (${(e as Error).message})`);
      });
      const grant = this.take(token, cred);
      const rec = this.manager?.get(grant.sandboxId);
      if (!rec || rec.state !== 'RUNNING') throw new FailedPreconditionError(`sandbox ${grant.sandboxId} is ${rec?.state ?? 'not known to this server'}: a bulk transfer needs it RUNNING`);
      podd = await connectUnix(rec.poddAddress.replace(/^unix:\/\//, ''));
      await new Promise<void>((resolve, reject) => podd!.write(Buffer.concat([BULK_MAGIC, Buffer.from(`${JSON.stringify(grant.request)}\n`)]), (e) => (e ? reject(e) : resolve())));
      await passFd(socket, fdOfSocket(podd));
      this.log?.debug({ sandbox_id: grant.sandboxId, op: grant.request.op }, 'bulk connection passed to the caller');
    } catch (err) {
      await new Promise<void>((resolve) => socket.end(errorLine(err), () => resolve()));
    } finally {
      if (uid !== undefined) {
        const m = (this.serving.get(uid) ?? 1) - 1;
        if (m > 0) this.serving.set(uid, m);
        else this.serving.delete(uid);
      }
      podd?.destroy();
      socket.destroy();
    }
  }
}

/** connectUnix connects to the unix socket at p (BULK_PODD_CONNECT_MS at most). */
function connectUnix(p: string): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ path: p });
    const timer = setTimeout(() => {
      s.destroy();
      reject(new FailedPreconditionError(`the sandbox's podd did not accept within ${BULK_PODD_CONNECT_MS} ms`));
    }, BULK_PODD_CONNECT_MS);
    s.once('connect', () => {
      clearTimeout(timer);
      s.pause();
      resolve(s);
    });
    s.once('error', (e) => {
      clearTimeout(timer);
      reject(new FailedPreconditionError(`the sandbox's podd socket: ${e.message}`));
    });
  });
}

/** passFd sends one byte "K" with fd (SCM_RIGHTS) on the caller's connection. */
function passFd(socket: net.Socket, fd: number): Promise<void> {
  const u = new usocket.USocket({ fd: libcDup(fdOfSocket(socket)) });
  return new Promise<void>((resolve, reject) => {
    u.on('error', (e) => reject(e as Error));
    u.write({ data: Buffer.from('K'), fds: [fd], callback: () => resolve() });
  }).finally(() => u.destroy());
}
