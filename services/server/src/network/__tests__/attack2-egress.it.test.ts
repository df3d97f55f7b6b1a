/**
 * Second attack round on the egress proxy (issue 12): the host's own loopback. The proxy
 * connects from the host, so a connection it lets through to 127.0.0.1 (or 0.0.0.0, which
 * Linux connects to the host too) reaches the host's loopback services (the ingress, admin
 * ports). Only the always-denied list refused those: an operator's networkAlwaysDenied without
 * 127.0.0.0/8 (the supervisor adds only the pool) let a sandbox whose policy has a domain rule
 * (port 80 redirected to the proxy) reach the host's 127.0.0.1:80 by address, or through an
 * allowed name that resolves to 127.0.0.1. network.proto rule 1: loopback and the node's own
 * addresses are refused whatever the list says.
 */
import http from 'node:http';
import net from 'node:net';
import { createLogger, parseEgressPolicy } from '@sandnode/shared';
import { MapNetworkDirectory } from '../../core/network-directory';
import { startNetworkProxies, type NetworkProxies } from '../proxies';

jest.setTimeout(30_000);

/** exchange sends one request through the proxy and returns what came back until close. */
function exchange(port: number, host: string): Promise<string> {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    let got = '';
    s.on('data', (d: Buffer) => (got += d.toString('latin1')));
    s.on('error', () => undefined);
    s.on('close', () => resolve(got));
    s.write(`GET / HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`);
  });
}

describe('attack2: the egress proxy and the host loopback', () => {
  let hostService: http.Server;
  let hostPort: number;
  let hits = 0;
  const proxies: NetworkProxies[] = [];
  const dir = new MapNetworkDirectory();

  beforeAll(async () => {
    hostService = http.createServer((_req, res) => {
      hits++;
      res.end('host-loopback-secret\n');
    });
    await new Promise<void>((r) => hostService.listen(0, '0.0.0.0', r));
    hostPort = (hostService.address() as net.AddressInfo).port;
    dir.set({
      sandboxId: 'sb-loop',
      state: 'RUNNING',
      slot: 1,
      address: '127.0.0.1', // the test's client connects from loopback: the directory names it the sandbox
      gateway: '127.0.0.2',
      policy: parseEgressPolicy({ allowOut: ['allowed.test'], denyOut: [], blockAll: false }),
      public: false,
      accessTokenSha256: '0'.repeat(64),
      poddAddress: '',
    });
  });
  afterAll(async () => {
    for (const p of proxies) await p.close();
    await new Promise<void>((r) => hostService.close(() => r()));
  });

  const start = async (target: string) => {
    const p = await startNetworkProxies({
      directory: dir,
      logger: createLogger('egress-attack2', '0', 'silent'),
      dnsUpstreams: [{ address: '127.0.0.1', port: 9 }],
      alwaysDenied: ['10.0.0.0/8', '169.254.0.0/16'], // an operator's list without loopback
      egress: { listen: { host: '127.0.0.1', port: 0 }, originalDestination: () => ({ address: target, port: hostPort }) },
    });
    proxies.push(p);
    return p.egress!.address().port;
  };

  it.each(['127.0.0.1', '127.1.2.3', '0.0.0.0'])('a connection the sandbox sent to %s is refused, never relayed to the host', async (target) => {
    const before = hits;
    const got = await exchange(await start(target), 'not-allowed.example');
    expect({ status: got.split('\r\n')[0], hostHits: hits - before }).toEqual({ status: 'HTTP/1.1 403 Forbidden', hostHits: 0 });
  });
});
