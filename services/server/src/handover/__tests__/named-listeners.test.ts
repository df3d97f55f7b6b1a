/** Named listeners: what is sent to which standby, how a received message is split, and that unwanted fds are closed. */
import dgram from 'node:dgram';
import { fstatSync, openSync } from 'node:fs';
import net from 'node:net';
import { namedListenerLosses, namedSpec, namedToSend, openNamedListeners, splitReceived, type NamedListenerName } from '../named-listeners';

const all = (['ingress', 'egress-proxy', 'dns-tcp', 'dns-udp'] as NamedListenerName[]).map((n) => namedSpec(n, '127.0.0.1:0'));

function isOpen(fd: number): boolean {
  try {
    fstatSync(fd);
    return true;
  } catch {
    return false;
  }
}

describe('named listeners', () => {
  it('a 0.2.0 standby (no features) is sent none and told what it loses; a full one gets all', () => {
    expect(namedToSend(all, [])).toEqual([]);
    expect(namedListenerLosses(all, [])).toEqual([
      'the ingress listener (tcp 127.0.0.1:0) stops: the standby lacks server.ingress.v1',
      'the egress-proxy listener (tcp 127.0.0.1:0) stops: the standby lacks server.egress-proxy.v1',
      'the dns-tcp listener (tcp 127.0.0.1:0) stops: the standby lacks server.dns.v1',
      'the dns-udp listener (udp 127.0.0.1:0) stops: the standby lacks server.dns.v1',
    ]);
    expect(namedToSend(all, ['server.ingress.v1']).map((l) => l.name)).toEqual(['ingress']);
    expect(namedListenerLosses(all, ['server.ingress.v1', 'server.egress-proxy.v1', 'server.dns.v1'])).toEqual([]);
  });

  it('splitReceived: a message of an old server (no named) is all gRPC; else the named fds follow the gRPC ones', () => {
    expect(splitReceived({ listeners: ['unix:///a.sock', '127.0.0.1:7070'] }, [10, 11])).toEqual({
      grpc: [
        { address: 'unix:///a.sock', fd: 10 },
        { address: '127.0.0.1:7070', fd: 11 },
      ],
      named: [],
    });
    const s = splitReceived({ listeners: ['unix:///a.sock'], named: [namedSpec('ingress', '127.0.0.1:8480'), namedSpec('dns-udp', '127.0.0.1:15053')] }, [10, 11, 12]);
    expect(s.grpc).toEqual([{ address: 'unix:///a.sock', fd: 10 }]);
    expect(s.named.map((n) => [n.name, n.kind, n.fd])).toEqual([
      ['ingress', 'tcp', 11],
      ['dns-udp', 'udp', 12],
    ]);
  });

  it('opens tcp and udp fresh with the handlers given; closes received fds nobody wants; a port taken fails only that listener', async () => {
    const stray = openSync('/dev/null', 'r');
    const other = openSync('/dev/null', 'r');
    const taken = net.createServer();
    await new Promise<void>((r) => taken.listen(0, '127.0.0.1', r));
    const takenPort = (taken.address() as net.AddressInfo).port;
    const got = await openNamedListeners(
      [namedSpec('ingress', '127.0.0.1:0'), namedSpec('dns-udp', '127.0.0.1:0'), namedSpec('egress-proxy', `127.0.0.1:${takenPort}`)],
      [
        { name: 'future-thing' as NamedListenerName, kind: 'tcp', address: '127.0.0.1:1', fd: stray },
        { ...namedSpec('dns-tcp', '127.0.0.1:0'), fd: other },
      ],
      (spec) => (spec.kind === 'tcp' ? net.createServer((s) => s.end('hi')) : dgram.createSocket('udp4')),
    );
    try {
      expect(got.opened.map((l) => l.name)).toEqual(['ingress', 'dns-udp']);
      expect(got.failed.map((f) => [f.spec.name, (f.err as NodeJS.ErrnoException).code])).toEqual([['egress-proxy', 'EADDRINUSE']]);
      expect(isOpen(stray)).toBe(false);
      expect(isOpen(other)).toBe(false);
      const ingress = got.opened[0]!;
      const text = await new Promise<string>((resolve) => {
        const c = net.connect(ingress.port, '127.0.0.1');
        let s = '';
        c.on('data', (d: Buffer) => (s += d.toString()));
        c.on('close', () => resolve(s));
      });
      expect(text).toBe('hi');
      expect(got.opened[1]!.fd).toBeGreaterThan(2);
    } finally {
      for (const l of got.opened) l.close();
      taken.close();
    }
  });
});
