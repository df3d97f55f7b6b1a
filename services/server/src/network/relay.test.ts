import { createHash } from 'node:crypto';
import net from 'node:net';
import { PassThrough } from 'node:stream';
import { BulkReader } from './relay';

/** pattern: n bytes that differ from read to read (a reused buffer overwritten too early shows) */
function pattern(n: number): Buffer {
  const b = Buffer.allocUnsafe(n);
  for (let i = 0; i < n; i += 4) b.writeUInt32LE(i, i);
  return b;
}
const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');

interface Rig {
  /** the socket made with the reader's onread, connected to `source` */
  up: net.Socket;
  /** the far end of `up`: what it writes, up reads */
  source: Promise<net.Socket>;
  close(): void;
}

async function rig(reader: BulkReader): Promise<Rig> {
  let accepted!: (s: net.Socket) => void;
  const source = new Promise<net.Socket>((r) => (accepted = r));
  const srv = net.createServer({ allowHalfOpen: true }, (s) => accepted(s));
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const up = net.connect({ port: (srv.address() as net.AddressInfo).port, host: '127.0.0.1', allowHalfOpen: true, onread: reader.onread });
  await new Promise<void>((r) => up.once('connect', r));
  return { up, source, close: () => srv.close() };
}

/** a connected pair: `peer` (what the reader writes to) and `sink` (where that arrives) */
async function pair(): Promise<{ peer: net.Socket; sink: net.Socket; close(): void }> {
  let accepted!: (s: net.Socket) => void;
  const sinkP = new Promise<net.Socket>((r) => (accepted = r));
  const srv = net.createServer({ allowHalfOpen: true }, (s) => accepted(s));
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const peer = net.connect({ port: (srv.address() as net.AddressInfo).port, host: '127.0.0.1', allowHalfOpen: true });
  await new Promise<void>((r) => peer.once('connect', r));
  return { peer, sink: await sinkP, close: () => srv.close() };
}

function collect(s: NodeJS.ReadableStream): Promise<Buffer> {
  const parts: Buffer[] = [];
  return new Promise((resolve, reject) => {
    s.on('data', (d: Buffer) => parts.push(d));
    s.on('end', () => resolve(Buffer.concat(parts)));
    s.on('error', reject);
  });
}

describe('BulkReader', () => {
  test('every byte arrives once and in order while the peer is slow (writes queue, buffers are not read into too early); counted per read', async () => {
    const reader = new BulkReader(1024, 8192);
    const r = await rig(reader);
    const p = await pair();
    let counted = 0;
    let reads = 0;
    reader.attach(r.up, p.peer, (n) => {
      counted += n;
      reads++;
    });
    r.up.on('end', () => p.peer.end());
    p.sink.pause(); // the peer's kernel buffers fill, its writes queue, backpressure stops up
    const data = pattern(16 * 1024 * 1024);
    const src = await r.source;
    src.end(data);
    await new Promise((res) => setTimeout(res, 200));
    const got = collect(p.sink);
    p.sink.resume();
    const out = await got;
    expect(out.length).toBe(data.length);
    expect(sha(out)).toBe(sha(data));
    expect(counted).toBe(data.length);
    expect(reads).toBeLessThan(data.length / 1024); // reads grew past the small size
    r.up.destroy();
    p.peer.destroy();
    p.sink.destroy();
    r.close();
    p.close();
  });

  test('bytes that arrive before attach are written first and counted', async () => {
    const reader = new BulkReader(1024, 4096);
    const r = await rig(reader);
    const src = await r.source;
    src.write('early ');
    await new Promise<void>((res) => {
      const check = () => (r.up.bytesRead >= 6 ? res() : setTimeout(check, 5));
      check();
    });
    const p = await pair();
    let counted = 0;
    reader.attach(r.up, p.peer, (n) => (counted += n));
    r.up.on('end', () => p.peer.end());
    const got = collect(p.sink);
    src.end('late');
    expect((await got).toString()).toBe('early late');
    expect(counted).toBe(10);
    r.up.destroy();
    p.sink.destroy();
    r.close();
    p.close();
  });

  test('a peer that is not a socket gets copies (it may keep the chunks it was given)', async () => {
    const reader = new BulkReader(1024, 4096);
    const r = await rig(reader);
    const peer = new PassThrough({ highWaterMark: 64 * 1024 * 1024 });
    reader.attach(r.up, peer);
    r.up.on('end', () => peer.end());
    const data = pattern(2 * 1024 * 1024);
    (await r.source).end(data);
    await new Promise<void>((res) => r.up.once('end', res));
    const out = await collect(peer); // read only now: the chunks were held all along
    expect(sha(out)).toBe(sha(data));
    r.up.destroy();
    r.close();
  });
});
