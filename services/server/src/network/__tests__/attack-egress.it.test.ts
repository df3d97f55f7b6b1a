/**
 * Attacks on the egress proxy from a hostile sandbox (issue 12): the proxy connects from the
 * host, so what the kernel's input chain keeps from a sandbox (the node's own addresses) must be
 * refused by the proxy too (network.proto rule 1: "the node's own addresses ... refused,
 * whatever the policy says"). The host's end of the test internet's veth is such an address: it
 * is not in the always-denied ranges (198.18.0.0/15), like a node's public address.
 */
import net from 'node:net';
import { spawnSync } from 'node:child_process';
import { DEFAULT_ALWAYS_DENIED, parseCidrList, parseEgressPolicy } from '@sandnode/shared';
import { describeWith, PARTS, type Part } from '@sandnode/testkit';
import { decideEgress } from '../egress-proxy';
import { startEgressFixture, type EgressFixture } from './egress-fixture';

jest.setTimeout(60_000);

const NFT: Part = { name: 'nftables (apt-get install nftables)', present: () => spawnSync('nft', ['--version'], { stdio: 'ignore' }).status === 0, ciProvides: true };
const CURL: Part = { name: 'curl (apt-get install curl)', present: () => spawnSync('curl', ['--version'], { stdio: 'ignore' }).status === 0, ciProvides: true };

describeWith('attack: the egress proxy and the node’s own addresses', [PARTS.root, NFT, CURL], () => {
  let fx: EgressFixture;
  let hostService: net.Server;
  let hits = 0;
  const conns = new Set<net.Socket>();
  beforeAll(async () => {
    fx = await startEgressFixture({ preambleTimeoutMs: 1000 });
    // a service of the host on one of its own addresses (port 80: a proxied port)
    hostService = net.createServer((s) => {
      hits++;
      conns.add(s);
      s.on('close', () => conns.delete(s));
      s.end('HTTP/1.1 200 OK\r\ncontent-length: 12\r\nconnection: close\r\n\r\nhost-secret\n');
    });
    await new Promise<void>((resolve, reject) => {
      hostService.once('error', reject);
      hostService.listen(80, fx.internet.hostAddress, () => resolve());
    });
  });
  afterAll(async () => {
    for (const s of conns) s.destroy();
    await new Promise<void>((r) => (hostService?.listening ? hostService.close(() => r()) : r()));
    await fx?.stop();
  });

  it('a sandbox with domain rules cannot reach a service on the host’s own address through the proxy (plain HTTP, any Host)', async () => {
    fx.setPolicy({ allowOut: [fx.internet.names.allowed] }); // domain rules: tcp 80/443 go through the proxy; default accept
    const r = await fx.inSandbox(['curl', '-sS', '-m', '10', '-w', '\n%{http_code}', `http://${fx.internet.hostAddress}/`]);
    expect(r.stdout).not.toContain('host-secret');
    expect(r.stdout).toMatch(/own address [\d.]+\n+403$/);
    expect(hits).toBe(0);
  });

  it('nor with an allowed name that resolves to the host’s own address (the proxy resolves it itself)', async () => {
    const policy = parseEgressPolicy({ allowOut: ['*.attacker.test'], denyOut: [], blockAll: true });
    const upstream = { resolve4: (n: string) => Promise.resolve(n === 'own.attacker.test' ? [fx.internet.hostAddress] : []) };
    const d = await decideEgress(policy, parseCidrList(DEFAULT_ALWAYS_DENIED, 'x'), upstream, { address: fx.internet.address, port: 443 }, 'own.attacker.test');
    expect(d.verdict.allowed).toBe(false);
    expect(d.verdict.rule).toMatch(/own address/);
    expect(d.target).toBeUndefined();
  });
});
