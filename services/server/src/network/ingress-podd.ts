/**
 * The ingress's way to services that listen on 127.0.0.1 inside a sandbox: podd's ForwardPort
 * (podd.proto) as a Duplex stream, so the ingress pipes it like a TCP socket. One channel per
 * podd address, kept until close(); the podd's features are asked once per channel.
 */
import { Duplex } from 'node:stream';
import { createSandnodeChannel, createServiceClient, PeerFeatures, PODD_FEATURES, type ServiceClient } from '@sandnode/shared';
import { PoddServiceDefinition, type ForwardPortRequest } from '@sandnode/shared/proto/podd/v1/podd';
import type { Channel } from 'nice-grpc';

/** Largest ForwardPort message taken from a podd, bytes: its 64 KiB data chunks and framing, with room. */
export const MAX_PODD_MESSAGE_BYTES = 128 * 1024;

/** How the ingress opens a relayed connection; undefined when the podd cannot (no feature). */
export interface PoddRelay {
  /**
   * open connects through the podd at poddAddress to 127.0.0.1:port in its sandbox. Resolves
   * undefined when that podd lacks "podd.forward-port.v1" or does not answer; rejects with the
   * podd's ClientError (UNAVAILABLE: nothing listens there).
   */
  open(poddAddress: string, port: number): Promise<Duplex | undefined>;
  close(): void;
}

interface Peer {
  channel: Channel;
  client: ServiceClient<typeof PoddServiceDefinition>;
  features: PeerFeatures;
}

/** poddRelay is the PoddRelay over gRPC to each sandbox's podd socket. */
export function poddRelay(): PoddRelay {
  const peers = new Map<string, Peer>();
  const peer = (address: string): Peer => {
    let p = peers.get(address);
    if (!p) {
      // the podd is the guest's (a sandbox may answer for it): it sends at most 64 KiB of data per
      // message (podd's MAX_FORWARD_CHUNK_BYTES), so a larger one ends the call instead of the
      // server holding gRPC's 4 MiB per message for each of a tunnel's buffered messages
      const channel = createSandnodeChannel(address, undefined, MAX_PODD_MESSAGE_BYTES);
      p = { channel, client: createServiceClient(PoddServiceDefinition, channel, { retryAttempts: 0 }), features: new PeerFeatures(channel, `podd at ${address}`) };
      peers.set(address, p);
    }
    return p;
  };
  return {
    async open(poddAddress, port) {
      if (!poddAddress) return undefined;
      const p = peer(poddAddress);
      const has = await p.features.has(PODD_FEATURES.forwardPort).catch(() => false);
      if (!has) return undefined;
      const stream = new ForwardStream(p.client, port);
      await stream.connected;
      return stream;
    },
    close() {
      for (const p of peers.values()) p.channel.close();
      peers.clear();
    },
  };
}

/** One ForwardPort call as a Duplex: writes become requests, responses become reads. */
class ForwardStream extends Duplex {
  readonly connected: Promise<void>;
  private readonly abort = new AbortController();
  private readonly pending: { req: Partial<ForwardPortRequest>; done?: () => void }[] = [];
  private wakeWriter: (() => void) | undefined;
  private ended = false;
  private wantRead: (() => void) | undefined;

  constructor(client: ServiceClient<typeof PoddServiceDefinition>, port: number) {
    super({ allowHalfOpen: true });
    // a failure before the caller pipes it rejects `connected`; afterwards the pipeline sees it
    this.on('error', () => undefined);
    this.pending.push({ req: { port } });
    const responses = client.forwardPort(this.requests(), { signal: this.abort.signal });
    let onConnected!: () => void;
    let onFailed!: (e: Error) => void;
    this.connected = new Promise<void>((resolve, reject) => {
      onConnected = resolve;
      onFailed = reject;
    });
    (async () => {
      for await (const r of responses) {
        if (r.connected) onConnected();
        if (r.data.length > 0 && !this.push(r.data)) await new Promise<void>((resolve) => (this.wantRead = resolve));
        if (r.eof) this.push(null);
      }
    })().then(
      () => onFailed(new Error('ForwardPort ended before it connected')),
      (err: Error) => {
        onFailed(err);
        this.destroy(err);
      },
    );
  }

  private async *requests(): AsyncGenerator<Partial<ForwardPortRequest>> {
    for (;;) {
      while (this.pending.length) {
        const r = this.pending.shift()!;
        yield r.req;
        // the call took it (nice-grpc pulls the next one once it was written): the writer may go on
        r.done?.();
      }
      if (this.ended) return;
      await new Promise<void>((resolve) => (this.wakeWriter = resolve));
      this.wakeWriter = undefined;
    }
  }

  private enqueue(req: Partial<ForwardPortRequest>, done?: () => void): void {
    this.pending.push({ req, done });
    this.wakeWriter?.();
  }

  override _write(chunk: Buffer, _enc: BufferEncoding, cb: (e?: Error | null) => void): void {
    this.enqueue({ data: chunk }, () => cb());
  }

  override _final(cb: (e?: Error | null) => void): void {
    this.enqueue({ closeWrite: true });
    this.ended = true;
    this.wakeWriter?.();
    cb();
  }

  override _read(): void {
    const w = this.wantRead;
    this.wantRead = undefined;
    w?.();
  }

  // what http.Agent calls on a pooled connection (a relayed one has no TCP options of its own)
  setKeepAlive(): this {
    return this;
  }
  setNoDelay(): this {
    return this;
  }
  setTimeout(): this {
    return this;
  }
  ref(): this {
    return this;
  }
  unref(): this {
    return this;
  }

  override _destroy(err: Error | null, cb: (e?: Error | null) => void): void {
    this.abort.abort();
    this.ended = true;
    this.wakeWriter?.();
    cb(err);
  }
}
