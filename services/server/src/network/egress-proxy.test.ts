import net from 'node:net';
import tls from 'node:tls';
import { waitFor } from '@sandnode/testkit';
import { createLogger, DEFAULT_ALWAYS_DENIED, parseCidrList, parseEgressPolicy, type EgressPolicyInput } from '@sandnode/shared';
import { MapNetworkDirectory } from '../core/network-directory';
import { loopbackView } from './__tests__/loopback-view';
import { decideEgress, egressAdmission, startEgressProxy, type EgressProxy } from './egress-proxy';
import { MAX_PREAMBLE_BYTES } from './preamble';
import type { UpstreamDns } from './upstream-dns';

jest.setTimeout(20_000);

const ALWAYS = parseCidrList(DEFAULT_ALWAYS_DENIED, 'networkAlwaysDenied');
const policy = (p: Partial<EgressPolicyInput>) => parseEgressPolicy({ allowOut: [], denyOut: [], blockAll: false, ...p });
const resolver = (table: Record<string, string[]>): Pick<UpstreamDns, 'resolve4'> => ({
  resolve4: (n: string) => (n in table ? Promise.resolve(table[n]!) : Promise.reject(new Error('timeout'))),
});

describe('decideEgress', () => {
  const dns = resolver({ 'allowed.test': ['198.51.100.10'], 'meta.test': ['169.254.169.254'], 'lan.test': ['10.1.2.3', '198.51.100.11'], 'none.test': [] });
  const dst = { address: '203.0.113.5', port: 443 };

  it('connects an allowed name to its resolved address, never the original destination (no fronting)', async () => {
    const d = await decideEgress(policy({ allowOut: ['allowed.test'], blockAll: true }), ALWAYS, dns, dst, 'Allowed.Test');
    expect(d).toEqual({ name: 'allowed.test', verdict: { allowed: true, rule: 'allow_out allowed.test' }, target: { address: '198.51.100.10', port: 443 } });
  });

  it('refuses an allowed name that resolves into the always-denied ranges, and skips such addresses', async () => {
    const p = policy({ allowOut: ['*.test'], blockAll: true });
    expect((await decideEgress(p, ALWAYS, dns, dst, 'meta.test')).verdict).toEqual({ allowed: false, rule: 'always-denied 169.254.0.0/16 (meta.test resolves to 169.254.169.254)' });
    expect((await decideEgress(p, ALWAYS, dns, dst, 'lan.test')).target).toEqual({ address: '198.51.100.11', port: 443 });
    // an allowed name with nothing to connect to is no refusal: unresolved (HTTP 502, as docs/network.md says; it was a 403 "refused by": newcomer)
    expect(await decideEgress(p, ALWAYS, dns, dst, 'none.test')).toEqual({ name: 'none.test', unresolved: true, verdict: { allowed: false, rule: 'none.test is allowed but has no IPv4 address' } });
    const gone = await decideEgress(p, ALWAYS, dns, dst, 'gone.test');
    expect(gone.unresolved).toBe(true);
    expect(gone.verdict.rule).toMatch(/^resolving gone.test failed/);
    expect((await decideEgress(p, ALWAYS, dns, dst, 'meta.test')).unresolved).toBeUndefined();
  });

  it('decides a name not allowed by the original address alone', async () => {
    expect(await decideEgress(policy({ allowOut: ['allowed.test'], blockAll: true }), ALWAYS, dns, dst, 'denied.test')).toEqual({
      name: 'denied.test',
      verdict: { allowed: false, rule: 'block_all' },
      target: undefined,
    });
    expect((await decideEgress(policy({ allowOut: ['allowed.test'], denyOut: ['203.0.113.0/24'] }), ALWAYS, dns, dst, 'other.test')).verdict).toEqual({
      allowed: false,
      rule: 'deny_out 203.0.113.0/24',
    });
    expect(await decideEgress(policy({ allowOut: ['allowed.test', '203.0.113.5'], blockAll: true }), ALWAYS, dns, dst, undefined)).toMatchObject({
      verdict: { allowed: true, rule: 'allow_out 203.0.113.5/32' },
      target: dst,
    });
    expect((await decideEgress(policy({ allowOut: ['allowed.test'] }), ALWAYS, dns, { address: '10.0.0.1', port: 80 }, 'x.test')).verdict).toEqual({
      allowed: false,
      rule: 'always-denied 10.0.0.0/8',
    });
  });
});

/** A proxy on 127.0.0.1 with a fixed "original destination" (no nftables in unit tests) and 127/8 not denied. */
describe('startEgressProxy on loopback', () => {
  let upstream: net.Server;
  let upstreamPort: number;
  let proxy: EgressProxy;
  const dir = new MapNetworkDirectory();
  const view = loopbackView;

  beforeAll(async () => {
    upstream = net.createServer({ allowHalfOpen: true }, (s) => {
      s.on('error', () => s.destroy());
      s.pipe(s); // echo, ends when the client ends (half-close)
    });
    await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
    upstreamPort = (upstream.address() as net.AddressInfo).port;
    proxy = await startEgressProxy({
      directory: dir,
      upstream: resolver({ 'allowed.test': ['127.0.0.1'] }) as UpstreamDns,
      listen: { host: '127.0.0.1', port: 0 },
      alwaysDenied: parseCidrList(['10.0.0.0/8'], 'x'),
      logger: createLogger('test', '0', 'silent'),
      preambleTimeoutMs: 300,
      maxConnections: 3,
      originalDestination: () => ({ address: '198.51.100.1', port: upstreamPort }),
    });
  });
  afterAll(async () => {
    await proxy.close();
    upstream.close();
  });

  const connect = () => net.connect({ host: '127.0.0.1', port: proxy.address().port, allowHalfOpen: true });
  const collect = (s: net.Socket) =>
    new Promise<{ data: string; error?: string }>((resolve) => {
      let data = '';
      s.on('data', (d: Buffer) => (data += d.toString('latin1')));
      s.on('error', (e: NodeJS.ErrnoException) => resolve({ data, error: e.code }));
      s.on('end', () => resolve({ data }));
      s.on('close', () => resolve({ data }));
    });

  it('an allowed Host is piped both ways with half-close, and bytes are counted', async () => {
    dir.set(view({ allowOut: ['allowed.test'], blockAll: true }));
    const before = proxy.traffic('sb-1') ?? { bytesOut: 0, bytesIn: 0 };
    const s = connect();
    const got = collect(s);
    const head = 'GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n';
    s.write(head);
    s.end('tail');
    expect((await got).data).toBe(`${head}tail`);
    const after = proxy.traffic('sb-1')!;
    expect(after.bytesOut - before.bytesOut).toBe(head.length + 4);
    expect(after.bytesIn - before.bytesIn).toBe(head.length + 4);
  });

  it('a refused Host gets a 403 naming the rule, then the connection closes', async () => {
    dir.set(view({ allowOut: ['allowed.test'], blockAll: true }));
    const s = connect();
    const got = collect(s);
    s.write('GET / HTTP/1.1\r\nHost: denied.test\r\n\r\n');
    const { data } = await got;
    expect(data).toMatch(/^HTTP\/1\.1 403 Forbidden\r\n/);
    expect(data).toContain('refused by block_all');
  });

  it('an allowed Host that does not resolve gets a 502 saying so (not a 403 refusal)', async () => {
    dir.set(view({ allowOut: ['allowed.test', 'noaddr.test'], blockAll: true }));
    const s = connect();
    const got = collect(s);
    s.write('GET / HTTP/1.1\r\nHost: noaddr.test\r\n\r\n');
    const { data } = await got;
    expect(data).toMatch(/^HTTP\/1\.1 502 Bad Gateway\r\n/);
    expect(data).toMatch(/sandnode egress: error: (resolving noaddr\.test failed|noaddr\.test is allowed but has no IPv4 address)/);
  });

  it('an oversized request head gets a 400 and nothing reaches upstream', async () => {
    dir.set(view({ allowOut: ['allowed.test'], blockAll: true }));
    const s = connect();
    const got = collect(s);
    s.write(`GET / HTTP/1.1\r\nHost: allowed.test\r\nX: ${'a'.repeat(MAX_PREAMBLE_BYTES)}\r\n`);
    const { data } = await got;
    expect(data).toMatch(/^HTTP\/1\.1 400 Bad Request\r\n[^]*preamble over 16384 bytes/);
    s.destroy();
  });

  it('a refused TLS connection is reset', async () => {
    dir.set(view({ allowOut: ['allowed.test'], blockAll: true }));
    const s = tls.connect({ host: '127.0.0.1', port: proxy.address().port, servername: 'denied.test', rejectUnauthorized: false });
    const err = await new Promise<NodeJS.ErrnoException>((resolve) => s.on('error', resolve));
    expect(err.code).toBe('ECONNRESET');
  });

  it('an idle proxied connection is closed', async () => {
    dir.set(view({ allowOut: ['allowed.test'], blockAll: true }));
    const idle = await startEgressProxy({
      directory: dir,
      upstream: resolver({ 'allowed.test': ['127.0.0.1'] }) as UpstreamDns,
      listen: { host: '127.0.0.1', port: 0 },
      alwaysDenied: [],
      logger: createLogger('test', '0', 'silent'),
      idleTimeoutMs: 200,
      originalDestination: () => ({ address: '198.51.100.1', port: upstreamPort }),
    });
    try {
      const s = net.connect({ host: '127.0.0.1', port: idle.address().port, allowHalfOpen: true });
      const got = collect(s);
      s.write('GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n'); // echoed, then nothing either way
      const { data } = await got;
      expect(data).toBe('GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n');
      await waitFor('the proxy counts the idle connection closed', () => idle.traffic('sb-1')!.open === 0);
    } finally {
      await idle.close();
    }
  });

  it('closeSandbox resets the open connections of that sandbox', async () => {
    dir.set(view({ allowOut: ['allowed.test'], blockAll: true }));
    const s = connect();
    const got = collect(s);
    s.write('GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n');
    await new Promise((r) => s.once('data', r)); // proxied: the echo came back
    proxy.closeSandbox('sb-1');
    expect((await got).error).toBe('ECONNRESET');
  });

  it('an unknown source is closed at once', async () => {
    dir.remove('sb-1');
    const s = connect();
    const { data } = await collect(s);
    expect(data).toBe('');
  });

  it('a slow preamble is closed (slowloris), and the limit of open connections holds', async () => {
    dir.set(view({ allowOut: ['allowed.test'], blockAll: true }));
    const slow = connect();
    const slowDone = collect(slow);
    slow.write('GET / HTTP/1.1\r\nHo');
    const held = [connect(), connect()];
    held.forEach((h) => h.write('G'));
    await new Promise((r) => setTimeout(r, 50)); // all three accepted before the fourth
    const fourth = connect();
    const r4p = collect(fourth);
    fourth.write('GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n'); // would be echoed if it were let in
    const r4 = await r4p;
    expect(r4.data).toBe('');
    expect(r4.error).toMatch(/ECONNRESET|EPIPE/);
    expect((await slowDone).data).toBe(''); // closed after preambleTimeoutMs with nothing sent upstream
    held.forEach((h) => h.destroy());
    expect(proxy.traffic('sb-1')!.refused).toBeGreaterThanOrEqual(1);
  });
});

describe('egress fair share near the node-wide cap', () => {
  it('egressAdmission: admit below 3/4 of the cap; above it a sandbox at its share is refused first; at the cap one below its share evicts from the largest holder', () => {
    expect(egressAdmission(5, 5, 8, 1, 5)).toBe('admit'); // alone: its share is the whole cap
    expect(egressAdmission(2, 6, 8, 2, 4)).toBe('admit'); // near the cap, below its share (4)
    expect(egressAdmission(4, 6, 8, 2, 4)).toEqual({ refuse: 'share' });
    expect(egressAdmission(0, 8, 8, 2, 8)).toBe('evict'); // a newcomer at the cap: the holder of 8 is above its share 4
    expect(egressAdmission(4, 8, 8, 2, 4)).toEqual({ refuse: 'cap' }); // at its share at the cap
    expect(egressAdmission(1, 8, 8, 4, 2)).toEqual({ refuse: 'cap' }); // nobody above the share: no eviction
  });

  it('a sandbox that holds the whole cap loses its oldest connection to a second sandbox, which is proxied; then the first is refused', async () => {
    const upstream = net.createServer({ allowHalfOpen: true }, (s) => {
      s.on('error', () => s.destroy());
      s.pipe(s);
    });
    await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
    const upstreamPort = (upstream.address() as net.AddressInfo).port;
    const dir = new MapNetworkDirectory();
    dir.set(loopbackView({ allowOut: ['allowed.test'], blockAll: true }));
    dir.set({ ...loopbackView({ allowOut: ['allowed.test'], blockAll: true }), sandboxId: 'sb-2', slot: 1, address: '127.0.0.2' });
    const proxy = await startEgressProxy({
      directory: dir,
      upstream: resolver({ 'allowed.test': ['127.0.0.1'] }) as UpstreamDns,
      listen: { host: '127.0.0.1', port: 0 },
      alwaysDenied: parseCidrList(['10.0.0.0/8'], 'x'),
      logger: createLogger('test', '0', 'silent'),
      maxConnections: 100,
      maxTotalConnections: () => 4,
      originalDestination: () => ({ address: '198.51.100.1', port: upstreamPort }),
    });
    const open: net.Socket[] = [];
    /** a proxied connection from `from`: resolves with the socket once the echo came back, or with the error */
    const proxied = (from: string) =>
      new Promise<{ s: net.Socket; error?: string; closed: Promise<string | undefined> }>((resolve) => {
        const s = net.connect({ host: '127.0.0.1', port: proxy.address().port, localAddress: from, allowHalfOpen: true });
        open.push(s);
        const closed = new Promise<string | undefined>((r) => {
          s.on('error', (e: NodeJS.ErrnoException) => (r(e.code), resolve({ s, error: e.code, closed })));
          s.on('close', () => (r(undefined), resolve({ s, error: 'closed', closed })));
        });
        s.once('data', () => resolve({ s, closed }));
        s.write('GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n');
      });
    try {
      const first: Awaited<ReturnType<typeof proxied>>[] = [];
      for (let i = 0; i < 4; i++) first.push(await proxied('127.0.0.1'));
      expect(first.map((f) => f.error)).toEqual([undefined, undefined, undefined, undefined]);
      const second = await proxied('127.0.0.2');
      expect(second.error).toBeUndefined(); // proxied: the echo came back
      expect(await first[0]!.closed).toBe('ECONNRESET'); // the oldest of sb-1 made room
      await waitFor('the reset connection closed at the proxy', () => (proxy.traffic('sb-1')!.open === 3 ? true : undefined));
      const again = await proxied('127.0.0.1');
      expect(again.error).toMatch(/ECONNRESET|EPIPE|closed/); // at the cap and above its share (2)
      expect(proxy.traffic('sb-2')!.open).toBe(1);
    } finally {
      open.forEach((s) => s.destroy());
      await proxy.close();
      upstream.close();
    }
  });
});
