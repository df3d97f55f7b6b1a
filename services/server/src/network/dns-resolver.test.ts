import dgram from 'node:dgram';
import net from 'node:net';
import dnsPacket from 'dns-packet';
import { createLogger } from '@sandnode/shared';
import { MapNetworkDirectory } from '../core/network-directory';
import { loopbackView } from './__tests__/loopback-view';
import { startDnsResolver, type DnsResolver } from './dns-resolver';
import { UpstreamDns } from './upstream-dns';

jest.setTimeout(20_000);

/** A fake upstream on 127.0.0.1: answers A queries from `table` (ttl 60), holds names in `hold`, counts what it got. */
async function fakeUpstream(table: Record<string, string>) {
  const seen: { name: string; tcp: boolean }[] = [];
  const hold = new Set<string>();
  /** names answered with TC over UDP (the full answer over TCP) */
  const truncate = new Set<string>();
  /** names for which a spoofed answer (another source port, address 6.6.6.6) is sent first */
  const spoof = new Set<string>();
  const spoofer = dgram.createSocket('udp4');
  await new Promise<void>((r) => spoofer.bind(0, '127.0.0.1', r));
  const answer = (msg: Buffer, tcp: boolean): Buffer | undefined => {
    const q = dnsPacket.decode(msg);
    const name = q.questions![0]!.name;
    seen.push({ name, tcp });
    if (hold.has(name)) return undefined;
    const a = table[name];
    const tc = !tcp && truncate.has(name) ? 0x0200 : 0;
    return dnsPacket.encode({ type: 'response', id: q.id, flags: (a ? 0x0180 : 0x0183) | tc, questions: q.questions, answers: a && !tc ? [{ type: 'A', name, ttl: 60, data: a }] : [] });
  };
  const udp = dgram.createSocket('udp4');
  udp.on('message', (m, r) => {
    const q = dnsPacket.decode(m);
    if (spoof.has(q.questions![0]!.name)) {
      const fake = dnsPacket.encode({ type: 'response', id: q.id, flags: 0x0180, questions: q.questions, answers: [{ type: 'A', name: q.questions![0]!.name, ttl: 60, data: '6.6.6.6' }] });
      spoofer.send(fake, r.port, r.address);
    }
    const b = answer(m, false);
    if (b) setTimeout(() => udp.send(b, r.port, r.address), spoof.size > 0 ? 20 : 0);
  });
  await new Promise<void>((r) => udp.bind(0, '127.0.0.1', r));
  const port = udp.address().port;
  const tcp = net.createServer((s) => {
    s.once('data', (d: Buffer) => {
      const b = answer(d.subarray(2), true);
      if (!b) return;
      const l = Buffer.alloc(2);
      l.writeUInt16BE(b.length);
      s.end(Buffer.concat([l, b]));
    });
  });
  await new Promise<void>((r) => tcp.listen(port, '127.0.0.1', r));
  return { port, seen, hold, truncate, spoof, close: () => (udp.close(), spoofer.close(), tcp.close()) };
}

const view = loopbackView;

describe('DNS resolver', () => {
  let up: Awaited<ReturnType<typeof fakeUpstream>>;
  let resolver: DnsResolver;
  let client: dgram.Socket;
  const dir = new MapNetworkDirectory();
  const inbox: Buffer[] = [];
  let waiters: (() => void)[] = [];

  beforeAll(async () => {
    up = await fakeUpstream({ 'allowed.test': '198.51.100.7', 'other.test': '198.51.100.8' });
    resolver = await startDnsResolver({
      directory: dir,
      upstream: new UpstreamDns({ upstreams: [{ address: '127.0.0.1', port: up.port }], timeoutMs: 200, retries: 1 }),
      udp: { host: '127.0.0.1', port: 0 },
      tcp: { host: '127.0.0.1', port: 0 },
      logger: createLogger('test', '0', 'silent'),
      maxInflight: 1,
    });
    client = dgram.createSocket('udp4');
    client.on('message', (m) => {
      inbox.push(m);
      waiters.forEach((w) => w());
      waiters = [];
    });
    await new Promise<void>((r) => client.bind(0, '127.0.0.1', r));
  });
  afterAll(async () => {
    client.close();
    await resolver.close();
    up.close();
  });
  beforeEach(() => {
    inbox.length = 0;
    up.seen.length = 0;
    up.hold.clear();
    up.truncate.clear();
    up.spoof.clear();
  });

  const query = (id: number, name: string, type: dnsPacket.RecordType = 'A') => dnsPacket.encode({ type: 'query', id, flags: dnsPacket.RECURSION_DESIRED, questions: [{ type, name }] });
  const send = (b: Buffer) => client.send(b, resolver.udpAddress().port, '127.0.0.1');
  /** next is the next answer the client got; rcode is not in dns-packet's types, but decode sets it */
  const next = async (): Promise<dnsPacket.DecodedPacket & { rcode: string }> => {
    while (inbox.length === 0) await new Promise<void>((r) => waiters.push(r));
    return dnsPacket.decode(inbox.shift()!) as dnsPacket.DecodedPacket & { rcode: string };
  };

  it('forwards an allowed name and answers with the client id, the A record unchanged', async () => {
    dir.set(view({ allowOut: ['allowed.test'], blockAll: true }));
    send(query(4242, 'allowed.test'));
    const a = await next();
    expect(a.id).toBe(4242);
    expect(a.rcode).toBe('NOERROR');
    expect(a.answers).toMatchObject([{ type: 'A', name: 'allowed.test', data: '198.51.100.7' }]);
  });

  it('under block_all answers NXDOMAIN for a name not allowed, without asking upstream', async () => {
    dir.set(view({ allowOut: ['allowed.test'], blockAll: true }));
    send(query(7, 'other.test'));
    const a = await next();
    expect([a.id, a.rcode, a.answers]).toEqual([7, 'NXDOMAIN', []]);
    expect(up.seen).toEqual([]);
    dir.set(view({ allowOut: ['allowed.test'] })); // without block_all every name is answered
    send(query(8, 'other.test'));
    expect((await next()).answers).toMatchObject([{ data: '198.51.100.8' }]);
  });

  it('drops queries of an unknown source and malformed packets (the next answer is the valid query of a known source)', async () => {
    dir.remove('sb-1');
    send(query(1, 'allowed.test'));
    dir.set(view({}));
    send(Buffer.from('not dns at all'));
    send(query(2, 'allowed.test').subarray(0, 20)); // truncated
    send(query(3, 'allowed.test'));
    expect((await next()).id).toBe(3);
    expect(inbox.length).toBe(0);
    expect(up.seen).toEqual([{ name: 'allowed.test', tcp: false }]);
  });

  it('answers over TCP, forwarding over TCP', async () => {
    dir.set(view({}));
    const s = net.connect(resolver.tcpAddress().port, '127.0.0.1');
    const q = query(99, 'allowed.test');
    const l = Buffer.alloc(2);
    l.writeUInt16BE(q.length);
    s.write(Buffer.concat([l, q]));
    const got = await new Promise<Buffer>((resolve) => {
      let b = Buffer.alloc(0);
      s.on('data', (d: Buffer) => {
        b = Buffer.concat([b, d]);
        if (b.length >= 2 && b.length >= 2 + b.readUInt16BE(0)) resolve(b.subarray(2));
      });
    });
    s.destroy();
    expect(dnsPacket.decode(got)).toMatchObject({ id: 99, answers: [{ data: '198.51.100.7' }] });
    expect(up.seen).toEqual([{ name: 'allowed.test', tcp: true }]);
  });

  it('asks again over TCP when the UDP answer is truncated', async () => {
    dir.set(view({}));
    up.truncate.add('allowed.test');
    send(query(12, 'allowed.test'));
    expect(await next()).toMatchObject({ id: 12, answers: [{ data: '198.51.100.7' }] });
    expect(up.seen).toEqual([
      { name: 'allowed.test', tcp: false },
      { name: 'allowed.test', tcp: true },
    ]);
  });

  it('ignores an answer from another source port (spoofing) and takes the upstream one', async () => {
    dir.set(view({}));
    up.spoof.add('other.test');
    send(query(13, 'other.test'));
    expect(await next()).toMatchObject({ id: 13, answers: [{ data: '198.51.100.8' }] });
  });

  it('answers SERVFAIL after a timeout and one retry, and SERVFAIL at once over the in-flight bound', async () => {
    dir.set(view({}));
    up.hold.add('allowed.test');
    send(query(10, 'allowed.test'));
    send(query(11, 'other.test')); // the one in-flight slot is taken
    const first = await next();
    expect([first.id, first.rcode]).toEqual([11, 'SERVFAIL']);
    const second = await next();
    expect([second.id, second.rcode]).toEqual([10, 'SERVFAIL']);
    expect(up.seen).toEqual([
      { name: 'allowed.test', tcp: false },
      { name: 'allowed.test', tcp: false },
    ]);
    expect(resolver.traffic('sb-1')!.refused).toBeGreaterThanOrEqual(2);
  });
});
