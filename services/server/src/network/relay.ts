/**
 * Bulk reads for the proxies' tunnels (egress splice, ingress WebSocket/CONNECT): a socket the
 * proxy dials reads into one large reusable buffer (net.connect's `onread`) instead of a new
 * 64 KiB Buffer per read pushed through a stream, and each read is written to the other side as
 * it is, counted once per read.
 *
 *   read n bytes into B ──▶ write B[0..n) to the peer ──▶ written at once: B is read into again
 *                                                     └▶ queued: B belongs to that write until
 *                                                        its callback; the next read gets a new B
 *   peer over its highWaterMark ──▶ reading stops until 'drain' (backpressure)
 *   EOF ──▶ the socket's 'end' as usual (the caller half-closes the peer)
 *
 * The buffer starts at SMALL_READ_BYTES, grows to BULK_READ_BYTES when a read fills it and
 * shrinks back after a small read, so a quiet tunnel keeps 64 KiB at most.
 *
 * Bytes that arrive before the peer is attached are kept (copied) and written first. A peer that
 * is not a net.Socket gets a copy of every read (its write may keep the chunk after it returns).
 */
import net from 'node:net';
import type { Duplex } from 'node:stream';

/** Size of one read once reads fill the buffer, bytes: fewer syscalls and callbacks per MiB than 64 KiB. */
export const BULK_READ_BYTES = 256 * 1024;
/** Size of one read at first and after small reads, bytes (node's own read size): an idle tunnel holds no more. */
export const SMALL_READ_BYTES = 64 * 1024;
/** A read below this many bytes shrinks a bulk buffer back to SMALL_READ_BYTES. */
const SHRINK_BELOW = 4096;

/** A read side for net.connect({ onread }): attach(peer) starts forwarding to peer. */
export class BulkReader {
  /** pass as net.connect's `onread` */
  readonly onread: net.OnReadOpts;
  private spare: Buffer | undefined;
  private peer: Duplex | undefined;
  private socket: net.Socket | undefined;
  private early: Buffer[] = [];
  private count: (n: number) => void = () => undefined;
  private size: number;

  /** small/bulk: read sizes, bytes (tests make them small) */
  constructor(
    private readonly small = SMALL_READ_BYTES,
    private readonly bulk = BULK_READ_BYTES,
  ) {
    this.size = small;
    this.onread = { buffer: () => this.take(), callback: (n, buf) => this.got(n, buf) };
  }

  /**
   * attach forwards every read of `socket` (made with this.onread) to `peer`, calling count(n)
   * per read (n bytes); bytes read before now are written first (and counted).
   */
  attach(socket: net.Socket, peer: Duplex, count?: (n: number) => void): void {
    this.socket = socket;
    this.peer = peer;
    if (count) this.count = count;
    for (const b of this.early.splice(0)) this.forward(b, false);
  }

  private take(): Buffer {
    this.spare ??= Buffer.allocUnsafe(this.size);
    return this.spare;
  }

  private got(n: number, buf: Uint8Array): boolean {
    const b = Buffer.from(buf.buffer, buf.byteOffset, n);
    const size = n === buf.byteLength ? this.bulk : n < SHRINK_BELOW ? this.small : this.size;
    if (size !== this.size) {
      this.size = size;
      this.spare = undefined; // the next read gets a buffer of the new size (this one is only used by this read's write)
    }
    const reused = buf === this.spare;
    if (!this.peer) {
      this.early.push(Buffer.from(b)); // a copy: buf is read into again
      return true;
    }
    if (!(this.peer instanceof net.Socket)) return this.forward(Buffer.from(b), false);
    return this.forward(b, reused);
  }

  /** forward writes b to the peer; `reused`: b lies in this.spare, which must not be read into while a write holds it. */
  private forward(b: Buffer, reused: boolean): boolean {
    const peer = this.peer!;
    if (peer.destroyed || peer.writableEnded) return false;
    this.count(b.length);
    if (peer.destroyed) return false; // count may end the relay (a policy that now refuses it)
    const whole = this.spare;
    const ok = peer.write(b, () => {
      if (reused && this.spare === undefined && whole?.length === this.size) this.spare = whole; // the write let go of it
    });
    if (reused && peer.writableLength > 0) this.spare = undefined; // queued: the kernel has not copied it yet
    if (!ok && this.socket) {
      const s = this.socket;
      s.pause();
      peer.once('drain', () => s.resume());
    }
    return true;
  }
}
