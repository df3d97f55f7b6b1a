/**
 * The bulk channel of `sandbox cp` (features "server.files.bulk.v1", "podd.files.bulk.v1";
 * files.proto PrepareBulkTransferRequest): raw bytes between the CLI and the sandbox's podd,
 * with no server and no gRPC framing in the data path. A gRPC transfer moves every byte through
 * the server (decode, encode, HTTP/2 windows) and stayed near 120 MB/s on this machine; the
 * bulk channel moves it through one unix socket, CLI <-> podd.
 *
 * 1. The CLI calls SandboxService.PrepareBulkTransfer (auth, path and state checked as for
 *    UploadFile / DownloadFile) and gets a one-time token bound to its SO_PEERCRED uid and pid.
 * 2. It connects to the server's unix socket and writes BULK_MAGIC + token + "\n". The server's
 *    listener tells such a connection from HTTP/2 by its first bytes (sniffRaw).
 * 3. The server takes the token (single use, expires, same uid and pid), connects to the
 *    sandbox's podd socket, writes BULK_MAGIC + the request line (PoddBulkRequest: what the
 *    server checked, not what the CLI says), and passes that connection's fd to the CLI over
 *    SCM_RIGHTS (one byte "K" with the fd; or one JSON line {"error":{code,message}}), then
 *    closes both its ends.
 * 4. CLI and podd speak the framing of files.proto over the passed socket. Idea of passing a
 *    connected socket so a broker leaves the data path: systemd's socket passing and
 *    OpenSSH's privilege separation (the monitor hands the child its fds), unix(7) SCM_RIGHTS.
 *
 * Hostility: the podd runs in the sandbox, so the CLI reads every line bounded
 * (BULK_MAX_LINE_BYTES) and never takes more bytes than announced; the podd is sent only a
 * socket whose peer is the CLI's process, with a request the server wrote.
 */
import type net from 'node:net';
import { peerCred } from './peer-cred';

/** The first bytes of a bulk connection (to the server and to podd). */
export const BULK_MAGIC = Buffer.from('SNBULK1\n');
/** Longest line either side takes (a token, a request, a reply), bytes. */
export const BULK_MAX_LINE_BYTES = 64 * 1024;
/** How long a side waits for a line it expects before the connection, ms. */
export const BULK_LINE_TIMEOUT_MS = 10_000;

/** A protocol beside gRPC on a listener, told apart by its first bytes. */
export interface RawProtocol {
  magic: Buffer;
  /** handle takes a connection that began with magic (already read); its next bytes are readable from socket. */
  handle(socket: net.Socket): void;
}

/**
 * How long a connection on a sniffing listener may take to tell its protocol (its first bytes:
 * BULK_MAGIC or not), ms; then it is closed. The same as ServerGuards' handshake timeout
 * (DEFAULT_GUARD_LIMITS.handshakeTimeoutMs), which a connection reaches only once it is HTTP/2.
 */
export const SNIFF_TIMEOUT_MS = 10_000;
/**
 * Most connections one uid (SO_PEERCRED) may have undecided at once on the sniffing listeners
 * of a process; one more is closed at once. The same as ServerGuards' maxConnectionsPerPeer,
 * which counts a connection only once it is HTTP/2.
 */
export const SNIFF_MAX_PENDING_PER_UID = 256;
/** undecided connections by peer key (uid, or "?" when the socket has no peer credentials) */
const sniffPending = new Map<string, number>();

/** sniffKey names the peer of socket for SNIFF_MAX_PENDING_PER_UID: its uid. */
function sniffKey(socket: net.Socket): string {
  try {
    return `uid:${peerCred(socket).uid}`;
  } catch {
    return '?';
  }
}

/**
 * sniffRaw reads the first bytes of socket: when they are raw.magic, raw.handle gets the socket
 * (magic consumed), else grpc does with every byte it sent unshifted (Node's HTTP/2 session
 * takes bytes buffered in the socket first). An HTTP/2 client's preface ("PRI * ...") differs
 * at its first byte, so a gRPC connection waits for nothing more than its first read.
 * Hostility: a connection that sends nothing, or a prefix of raw.magic, and stalls reaches
 * neither side's limits; it is closed after timeoutMs (SNIFF_TIMEOUT_MS), and one beyond
 * SNIFF_MAX_PENDING_PER_UID undecided connections of its uid is closed at once (before: held
 * for good, uncounted; attack-bulk-sniff.it.test.ts).
 * Returns a promise that settles once the connection is decided (handed to raw.handle or grpc,
 * or closed): GrpcHost.shutdown waits for it, so that a connection this process accepted is
 * given to its HTTP/2 server before the GOAWAY and not after the process chose to exit.
 */
export function sniffRaw(socket: net.Socket, raw: RawProtocol, grpc: (s: net.Socket) => void, timeoutMs = SNIFF_TIMEOUT_MS, maxPendingPerUid = SNIFF_MAX_PENDING_PER_UID): Promise<void> {
  const key = sniffKey(socket);
  const pending = sniffPending.get(key) ?? 0;
  if (pending >= maxPendingPerUid) {
    socket.destroy();
    return Promise.resolve();
  }
  sniffPending.set(key, pending + 1);
  let got: Buffer = Buffer.alloc(0);
  let decided = false;
  let settle!: () => void;
  const settled = new Promise<void>((r) => (settle = r));
  const done = () => {
    decided = true;
    settle();
    clearTimeout(timer);
    const m = (sniffPending.get(key) ?? 1) - 1;
    if (m > 0) sniffPending.set(key, m);
    else sniffPending.delete(key);
    socket.off('data', onData);
    socket.off('end', onEnd);
    socket.off('error', onEnd);
    socket.off('close', onEnd);
    socket.pause();
  };
  const onEnd = () => {
    if (decided) return;
    done();
    socket.destroy();
  };
  const timer = setTimeout(onEnd, timeoutMs);
  const onData = (d: Buffer) => {
    got = got.length ? Buffer.concat([got, d]) : d;
    const n = Math.min(got.length, raw.magic.length);
    const prefix = got.subarray(0, n).equals(raw.magic.subarray(0, n));
    if (prefix && got.length < raw.magic.length) return;
    done();
    if (prefix) {
      if (got.length > raw.magic.length) socket.unshift(got.subarray(raw.magic.length));
      raw.handle(socket);
    } else {
      socket.unshift(got);
      grpc(socket);
    }
  };
  socket.on('data', onData);
  socket.on('end', onEnd);
  socket.on('error', onEnd);
  socket.on('close', onEnd);
  return settled;
}

/**
 * readLine reads one "\n"-ended line of at most max bytes from socket (paused mode) and unshifts
 * what came after it. Rejects on a longer line, an end before "\n", an error, or after
 * timeoutMs.
 */
export function readLine(socket: net.Socket, max = BULK_MAX_LINE_BYTES, timeoutMs = BULK_LINE_TIMEOUT_MS): Promise<string> {
  return new Promise((resolve, reject) => {
    let got: Buffer = Buffer.alloc(0);
    const finish = (err: Error | undefined, line?: string) => {
      clearTimeout(timer);
      socket.off('readable', onReadable);
      socket.off('end', onEnd);
      socket.off('error', onError);
      if (err) reject(err);
      else resolve(line ?? '');
    };
    const timer = setTimeout(() => finish(new Error(`no line within ${timeoutMs} ms`)), timeoutMs);
    const onEnd = () => finish(new Error(`the connection ended before a line (${got.length} bytes)`));
    const onError = (e: Error) => finish(e);
    const onReadable = () => {
      for (let c = socket.read() as Buffer | null; c; c = socket.read() as Buffer | null) {
        got = got.length ? Buffer.concat([got, c]) : c;
        const nl = got.indexOf(10);
        if (nl >= 0 && nl <= max) {
          if (nl + 1 < got.length) socket.unshift(got.subarray(nl + 1));
          finish(undefined, got.subarray(0, nl).toString('utf8'));
          return;
        }
        if (got.length > max) {
          finish(new Error(`a line longer than ${max} bytes`));
          return;
        }
      }
    };
    socket.on('readable', onReadable);
    socket.on('end', onEnd);
    socket.on('error', onError);
    onReadable();
  });
}

/** What the server tells podd to do on a bulk connection (one JSON line after BULK_MAGIC). */
export type PoddBulkRequest =
  { op: 'upload'; path: string; offset: number; mode: number; inPlace: boolean; beneath: string; sizeBytes: number } | { op: 'download'; path: string; offset: number; beneath: string };

/** An error line of the channel: code is a gRPC status number. */
export interface BulkErrorLine {
  error: { code: number; message: string };
}

/**
 * parseBulkLine parses a JSON object line from a peer that may be hostile; an Error when it is
 * not an object.
 */
export function parseBulkLine(line: string): Record<string, unknown> {
  const v = JSON.parse(line) as unknown;
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw new Error('not a JSON object');
  return v as Record<string, unknown>;
}

/** isSize: n is a byte count (a non-negative safe integer). */
export const isSize = (n: unknown): n is number => typeof n === 'number' && Number.isSafeInteger(n) && n >= 0;

/** nextChunk is the next chunk read from socket (paused mode), null at its end (or once it closed). */
export async function nextChunk(socket: net.Socket): Promise<Buffer | null> {
  for (;;) {
    const c = socket.read() as Buffer | null;
    if (c) return c;
    if (socket.readableEnded || socket.destroyed) return null;
    await new Promise<void>((resolve) => {
      const f = () => {
        socket.off('readable', f);
        socket.off('end', f);
        socket.off('close', f);
        resolve();
      };
      socket.on('readable', f);
      socket.on('end', f);
      socket.on('close', f);
    });
  }
}

/** writeOrDrain writes b to socket and waits for 'drain' when its buffer is full; rejects when the socket closes first. */
export function writeOrDrain(socket: net.Socket, b: Uint8Array | string): Promise<void> {
  if (socket.write(b)) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const done = () => {
      socket.off('close', closed);
      resolve();
    };
    const closed = () => {
      socket.off('drain', done);
      reject(new Error('the connection closed while writing'));
    };
    socket.once('drain', done);
    socket.once('close', closed);
  });
}

/** errorLine is the channel's error line of err (code: its gRPC status when it has one, else INTERNAL = 13). */
export function errorLine(err: unknown): string {
  const code = typeof (err as { code?: unknown }).code === 'number' ? (err as { code: number }).code : 13;
  const line: BulkErrorLine = { error: { code, message: String((err as Error).message ?? err).slice(0, 4000) } };
  return `${JSON.stringify(line)}\n`;
}
