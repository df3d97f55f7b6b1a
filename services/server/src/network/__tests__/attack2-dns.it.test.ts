/**
 * Second attack round on the DNS resolver (issue 12): a sandbox that pipelines TCP queries and
 * never reads the answers. The answers of refused names come back at once (NXDOMAIN, no
 * upstream), so the per-sandbox in-flight limit does not bound them; without backpressure the
 * server queues every answer in its own memory for as long as the sandbox sends. The resolver
 * must close such a connection once its unread answers pass a bound, before the sandbox has
 * sent `FLOOD_BYTES` of queries.
 */
import net from 'node:net';
import dnsPacket from 'dns-packet';
import { createLogger, parseEgressPolicy } from '@sandnode/shared';
import { MapNetworkDirectory } from '../../core/network-directory';
import { startDnsResolver, type DnsResolver } from '../dns-resolver';
import { UpstreamDns } from '../upstream-dns';

jest.setTimeout(120_000);

/** queries the flood may send before the resolver must have closed it, bytes */
const FLOOD_BYTES = 24 * 1024 * 1024;

describe('attack2: a TCP DNS client that never reads its answers', () => {
  let resolver: DnsResolver;
  const dir = new MapNetworkDirectory();
  beforeAll(async () => {
    dir.set({
      sandboxId: 'sb-dnsflood',
      state: 'RUNNING',
      slot: 1,
      address: '127.0.0.1',
      gateway: '127.0.0.2',
      policy: parseEgressPolicy({ allowOut: [], denyOut: [], blockAll: true }),
      public: false,
      accessTokenSha256: '0'.repeat(64),
      poddAddress: '',
    });
    resolver = await startDnsResolver({
      directory: dir,
      // never asked: every name is refused (block_all), answered NXDOMAIN at once
      upstream: new UpstreamDns({ upstreams: [{ address: '127.0.0.1', port: 9 }], timeoutMs: 200, retries: 0 }),
      udp: { host: '127.0.0.1', port: 0 },
      tcp: { host: '127.0.0.1', port: 0 },
      logger: createLogger('dns-attack2', '0', 'silent'),
    });
  });
  afterAll(async () => {
    await resolver?.close();
  });

  it('is closed by the resolver before it has sent FLOOD_BYTES of queries', async () => {
    const q = dnsPacket.encode({ type: 'query', id: 7, flags: dnsPacket.RECURSION_DESIRED, questions: [{ type: 'A', name: 'refused.example' }] });
    const framed = Buffer.alloc(2 + q.length);
    framed.writeUInt16BE(q.length);
    q.copy(framed, 2);
    const batch = Buffer.concat(Array.from({ length: 2048 }, () => framed));
    const sock = net.connect(resolver.tcpAddress().port, '127.0.0.1');
    sock.on('error', () => undefined);
    await new Promise<void>((r) => sock.once('connect', () => r()));
    sock.pause(); // never reads an answer
    let closed = false;
    const closedP = new Promise<void>((r) => sock.once('close', () => r()));
    void closedP.then(() => (closed = true));
    let sent = 0;
    while (!closed && sent < FLOOD_BYTES) {
      sent += batch.length;
      if (!sock.write(batch)) await Promise.race([new Promise<void>((r) => sock.once('drain', () => r())), closedP]);
    }
    // the last writes may still be on their way: the resolver answers what it read, then decides
    if (!closed) await Promise.race([closedP, new Promise<void>((r) => setImmediate(r))]);
    const answered = resolver.traffic('sb-dnsflood')?.connections ?? 0;
    sock.destroy();
    expect({ closed, answeredAll: answered * framed.length >= FLOOD_BYTES }).toEqual({ closed: true, answeredAll: false });
  });
});
