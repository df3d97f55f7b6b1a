/**
 * ForwardPort (podd.proto): one TCP connection to 127.0.0.1:<port> inside the sandbox, relayed
 * over a gRPC bidi stream, for services that listen on loopback only (the host's ingress
 * cannot reach them at the sandbox address). Requests carry bytes to the connection, responses
 * what it sends back, at most MAX_FORWARD_CHUNK_BYTES each. Backpressure both ways: a request
 * is taken only once the previous one was written (socket drained); the connection is read
 * only as fast as the responses are taken.
 */
import type net from 'node:net';
import { connectTcp, InvalidArgumentError, ResourceExhaustedError, UnavailableError } from '@sandnode/shared';

/** Default (and contract) limit of ForwardPort streams podd relays at once. */
export const DEFAULT_MAX_FORWARDS = 256;
/** Largest data of one ForwardPortResponse, bytes (64 KiB). */
export const MAX_FORWARD_CHUNK_BYTES = 64 * 1024;
/** How long the connect to 127.0.0.1:<port> may take, ms. */
export const FORWARD_CONNECT_TIMEOUT_MS = 5000;

export interface ForwardRequest {
  port: number;
  data: Uint8Array;
  closeWrite: boolean;
}

export interface ForwardResponse {
  connected: boolean;
  data: Buffer;
  eof: boolean;
}

/** PortForwarder relays ForwardPort streams, at most `max` at once. */
export class PortForwarder {
  private open = 0;

  constructor(private readonly max = DEFAULT_MAX_FORWARDS) {}

  /** How many forwards run now. */
  get running(): number {
    return this.open;
  }

  /**
   * forward relays one stream (see the file header). Errors: INVALID_ARGUMENT (port 0 or above
   * 65535, data before the port, or no first request), RESOURCE_EXHAUSTED (max forwards run),
   * UNAVAILABLE (connection refused or reset, or the connect timed out). The connection is
   * destroyed when the caller goes away (signal) or anything fails.
   */
  async *forward(requests: AsyncIterable<ForwardRequest>, signal: AbortSignal): AsyncGenerator<ForwardResponse> {
    const it = requests[Symbol.asyncIterator]();
    const first = await it.next();
    if (first.done) throw new InvalidArgumentError('ForwardPort: the stream ended before the first request (which names the port)');
    const { port, data } = first.value;
    if (data.length > 0) throw new InvalidArgumentError('ForwardPort: the first request names the port and carries no data');
    if (!Number.isInteger(port) || port < 1 || port > 65535) throw new InvalidArgumentError(`ForwardPort: port must be 1..65535, got ${port}`);
    if (this.open >= this.max) throw new ResourceExhaustedError(`ForwardPort: ${this.max} forwards are open already (podd's limit); close one and retry`);
    this.open++;
    let sock: net.Socket | undefined;
    const onAbort = () => sock?.destroy();
    signal.addEventListener('abort', onAbort);
    try {
      sock = await connect(port);
      let writeDone = first.value.closeWrite;
      if (writeDone) sock.end();
      // the host's side: requests -> connection (errors end up destroying the socket, seen by the read loop)
      const s = sock;
      const pump = (async () => {
        while (!writeDone) {
          const r = await it.next();
          if (r.done) {
            writeDone = true;
            s.end();
            break;
          }
          if (r.value.data.length > 0 && !s.write(r.value.data)) await drained(s);
          if (r.value.closeWrite) {
            writeDone = true;
            s.end();
          }
        }
      })();
      pump.catch(() => s.destroy());
      yield { connected: true, data: Buffer.alloc(0), eof: false };
      for await (const chunk of sock as AsyncIterable<Buffer>) {
        for (let off = 0; off < chunk.length; off += MAX_FORWARD_CHUNK_BYTES) {
          yield { connected: false, data: chunk.subarray(off, off + MAX_FORWARD_CHUNK_BYTES), eof: false };
        }
      }
      yield { connected: false, data: Buffer.alloc(0), eof: true };
      // both sides done: the stream ends once the host half-closed too
      await pump;
    } catch (err) {
      if (err instanceof InvalidArgumentError) throw err;
      const code = (err as NodeJS.ErrnoException).code;
      if (code === 'ECONNREFUSED') throw new UnavailableError(`ForwardPort: nothing listens on 127.0.0.1:${port} in the sandbox (connection refused)`);
      if (signal.aborted) return; // the host went away: nothing to answer
      throw new UnavailableError(`ForwardPort: the connection to 127.0.0.1:${port} failed: ${(err as Error).message}`);
    } finally {
      signal.removeEventListener('abort', onAbort);
      sock?.destroy();
      this.open--;
    }
  }
}

/** connect dials 127.0.0.1:port (FORWARD_CONNECT_TIMEOUT_MS at most: UnavailableError); later socket errors reach the read loop (the socket's async iterator rejects), never an uncaught 'error'. */
async function connect(port: number): Promise<net.Socket> {
  const s = await connectTcp(
    { host: '127.0.0.1', port, allowHalfOpen: true },
    FORWARD_CONNECT_TIMEOUT_MS,
    () => new UnavailableError(`ForwardPort: the connect to 127.0.0.1:${port} took more than ${FORWARD_CONNECT_TIMEOUT_MS} ms`),
  );
  s.on('error', () => undefined);
  return s;
}

function drained(s: net.Socket): Promise<void> {
  return new Promise((resolve, reject) => {
    const done = () => {
      s.off('drain', done);
      s.off('close', closed);
      resolve();
    };
    const closed = () => {
      s.off('drain', done);
      reject(new Error('connection closed while writing'));
    };
    s.once('drain', done);
    s.once('close', closed);
  });
}
