/**
 * The egress proxy and the resolver with real sockets: a sandbox netns whose tcp 80/443 and
 * udp/tcp 53 an nft table redirects to them, and the test internet (testkit) behind them.
 * Clients are curl, getent and bash in the sandbox's netns.
 */
import { spawnSync } from 'node:child_process';
import { describeWith, PARTS, type Part } from '@sandnode/testkit';
import { startEgressFixture, type EgressFixture } from './egress-fixture';

jest.setTimeout(60_000);

const NFT: Part = { name: 'nftables (apt-get install nftables)', present: () => spawnSync('nft', ['--version'], { stdio: 'ignore' }).status === 0, ciProvides: true };
const CURL: Part = { name: 'curl (apt-get install curl)', present: () => spawnSync('curl', ['--version'], { stdio: 'ignore' }).status === 0, ciProvides: true };

describeWith('egress proxy and resolver (sandbox netns, nft redirect, test internet)', [PARTS.root, NFT, CURL], () => {
  let fx: EgressFixture;
  beforeAll(async () => {
    fx = await startEgressFixture({ preambleTimeoutMs: 1000, records: { 'meta.test': '169.254.169.254', 'lan.test': '10.1.2.3' } });
  });
  afterAll(async () => {
    await fx?.stop();
  });

  const curl = (...args: string[]) => fx.inSandbox(['curl', '-sS', '-m', '10', ...args]);
  const echo = (r: { stdout: string }) => JSON.parse(r.stdout) as { method: string; path: string; host: string; sni: string | null; remote: string };

  it('an allowed domain is reachable over HTTP and TLS (by name through the resolver, SNI for TLS)', async () => {
    fx.setPolicy({ allowOut: ['allowed.test'], blockAll: true });
    const h = await curl('http://allowed.test/p?q=1');
    expect(h.code).toBe(0);
    expect(echo(h)).toMatchObject({ method: 'GET', path: '/p?q=1', host: 'allowed.test', remote: fx.internet.hostAddress });
    const t = await curl('-k', 'https://allowed.test/s');
    expect(t.code).toBe(0);
    expect(echo(t)).toMatchObject({ path: '/s', sni: 'allowed.test' });
    const traffic = fx.proxy.traffic(`sb-${fx.netns.slice(4, 10)}`)!;
    expect(traffic.connections).toBeGreaterThanOrEqual(2);
    expect(traffic.bytesIn).toBeGreaterThan(0);
  });

  it('a denied domain is refused at once: plain HTTP gets a 403 naming the rule, TLS a reset', async () => {
    fx.setPolicy({ allowOut: ['allowed.test'], blockAll: true });
    const at = `denied.test:80:${fx.internet.address}`;
    const h = await curl('--resolve', at, '-w', '%{http_code}', 'http://denied.test/');
    expect(h.stdout).toMatch(/refused by block_all\n403$/);
    const t = await curl('-k', '--resolve', `denied.test:443:${fx.internet.address}`, 'https://denied.test/');
    expect(t.code).not.toBe(0);
    expect(t.stderr).toMatch(/reset by peer/i);
  });

  it('domain fronting: an allowed SNI to another address goes to the name’s resolved address, not the original', async () => {
    fx.setPolicy({ allowOut: ['allowed.test'], blockAll: true });
    // 198.51.100.99 answers nothing anywhere: only the proxy's own resolution reaches a server.
    const t = await curl('-k', '--resolve', 'allowed.test:443:198.51.100.99', 'https://allowed.test/front');
    expect(t.code).toBe(0);
    expect(echo(t)).toMatchObject({ path: '/front', sni: 'allowed.test' });
    const h = await curl('--resolve', 'allowed.test:80:198.51.100.99', 'http://allowed.test/front');
    expect(echo(h)).toMatchObject({ host: 'allowed.test' });
  });

  it('an allowed name resolving to 169.254.169.254 or 10.x is refused', async () => {
    fx.setPolicy({ allowOut: ['*.test'], blockAll: true });
    const meta = await curl('-w', '%{http_code}', 'http://meta.test/latest/meta-data/');
    expect(meta.stdout).toMatch(/always-denied 169\.254\.0\.0\/16 \(meta\.test resolves to 169\.254\.169\.254\)\n403$/);
    const lan = await curl('-w', '%{http_code}', 'http://lan.test/');
    expect(lan.stdout).toMatch(/always-denied 10\.0\.0\.0\/8 .*\n403$/);
  });

  it('a name not allowed falls back to the address rules on the original destination', async () => {
    fx.setPolicy({ allowOut: ['allowed.test'] }); // no block_all: other names by address
    const ok = await curl('--resolve', `denied.test:80:${fx.internet.address}`, 'http://denied.test/ip');
    expect(echo(ok)).toMatchObject({ host: 'denied.test', path: '/ip' });
    fx.setPolicy({ allowOut: ['allowed.test'], denyOut: [fx.internet.cidr] });
    const no = await curl('--resolve', `denied.test:80:${fx.internet.address}`, '-w', '%{http_code}', 'http://denied.test/ip');
    expect(no.stdout).toMatch(new RegExp(`refused by deny_out ${fx.internet.cidr.replace(/\./g, '\\.')}\\n403$`));
  });

  it('DNS answers only allowed names under block_all, every name without it (udp and tcp)', async () => {
    fx.setPolicy({ allowOut: ['allowed.test'], blockAll: true });
    const ok = await fx.inSandbox(['getent', 'ahostsv4', 'allowed.test']);
    expect(ok.stdout).toContain(fx.internet.address);
    const no = await fx.inSandbox(['getent', 'ahostsv4', 'denied.test']);
    expect(no.code).toBe(2); // not found (NXDOMAIN)
    const tcp = await fx.inSandbox(['bash', '-c', 'RES_OPTIONS=use-vc getent ahostsv4 allowed.test']);
    expect(tcp.stdout).toContain(fx.internet.address);
    fx.setPolicy({});
    expect((await fx.inSandbox(['getent', 'ahostsv4', 'denied.test'])).stdout).toContain(fx.internet.address);
  });

  it('an unknown source is dropped: no answer from the resolver, the proxy closes at once', async () => {
    fx.directory.remove(`sb-${fx.netns.slice(4, 10)}`);
    const dns = await fx.inSandbox(['getent', 'ahostsv4', 'allowed.test']);
    expect(dns.code).not.toBe(0);
    const h = await curl('--resolve', `allowed.test:80:${fx.internet.address}`, 'http://allowed.test/');
    expect(h.code).not.toBe(0);
    expect(h.stdout).toBe('');
  });

  it('a slow preamble (slowloris) is closed with nothing sent upstream', async () => {
    fx.setPolicy({ allowOut: ['allowed.test'], blockAll: true });
    const r = await fx.inSandbox(['bash', '-c', `exec 3<>/dev/tcp/${fx.internet.address}/80; printf 'GET / HTTP/1.1\\r\\nHo' >&3; cat <&3; echo "closed"`]);
    expect(r.stdout).toBe('closed\n');
  });
});
