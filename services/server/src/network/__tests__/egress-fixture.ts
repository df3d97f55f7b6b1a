/**
 * Test fixture of the egress integration tests: a "sandbox" netns (address from a unique /24 of
 * a /24 of 10.211.128.0/18 (the egress tests' share of the test ranges), default route to the host), the test internet, the egress
 * proxy and resolver of this process listening on the sandbox's gateway address, and an nft
 * table of the test's own that redirects the sandbox's tcp 80/443 to the proxy and its udp/tcp
 * 53 to the resolver (what the netplane's real prerouting chain does). stop() removes all of it.
 */
import { execFile, execFileSync } from 'node:child_process';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { promisify } from 'node:util';
import { createLogger, DEFAULT_ALWAYS_DENIED, parseEgressPolicy, type EgressPolicyInput } from '@sandnode/shared';
import { claimTestSubnet, linkNetns, randomTag, startTestInternet, type TestInternet } from '@sandnode/testkit';
import { MapNetworkDirectory, type SandboxNetworkView } from '../../core/network-directory';
import type { DnsResolver } from '../dns-resolver';
import type { EgressProxy } from '../egress-proxy';
import { startNetworkProxies } from '../proxies';

const run = promisify(execFile);

/** What a command in the sandbox printed and how it ended (never rejects). */
export interface SandboxRun {
  code: number;
  stdout: string;
  stderr: string;
}

export interface EgressFixture {
  internet: TestInternet;
  /** the sandbox's address and its gateway (where the proxy and resolver listen) */
  address: string;
  gateway: string;
  netns: string;
  directory: MapNetworkDirectory;
  proxy: EgressProxy;
  resolver: DnsResolver;
  /** setPolicy puts the sandbox in the directory with this policy */
  setPolicy(p: Partial<EgressPolicyInput>): void;
  /** inSandbox runs argv in the sandbox's netns (async: the proxy runs in this process) */
  inSandbox(argv: string[], timeoutMs?: number): Promise<SandboxRun>;
  stop(): Promise<void>;
}

function quiet(f: () => void): void {
  try {
    f();
  } catch {
    /* gone already */
  }
}

/** startEgressFixture builds everything (needs root, ip, nft); on a failure it removes what it made and throws. */
export async function startEgressFixture(opts: { preambleTimeoutMs?: number; records?: Record<string, string> } = {}): Promise<EgressFixture> {
  const tag = randomTag(6);
  const netns = `snte${tag}s`;
  const hostIf = `snte${tag}g`;
  const peer = `snte${tag}p`;
  const table = `snte${tag}`;
  const etcDir = `/etc/netns/${netns}`;
  const subnet = claimTestSubnet('10.211.128.0/18', 24);
  const gateway = subnet.host(1);
  const address = subnet.host(2);
  const cleanups: (() => Promise<void> | void)[] = [];
  const stop = async () => {
    for (const c of cleanups.splice(0).reverse()) {
      try {
        await c();
      } catch {
        /* keep cleaning */
      }
    }
  };
  try {
    cleanups.push(() => subnet.release());
    const internet = await startTestInternet({ records: opts.records });
    cleanups.push(() => internet.stop());
    cleanups.push(() => quiet(() => execFileSync('ip', ['netns', 'del', netns], { stdio: 'ignore' })));
    cleanups.push(() => quiet(() => execFileSync('ip', ['link', 'del', hostIf], { stdio: 'ignore' })));
    subnet.own('netns', netns);
    subnet.own('link', hostIf);
    subnet.own('nft', table);
    linkNetns({ netns, hostIface: hostIf, peer, hostAddress: gateway, address });
    // `ip netns exec` bind-mounts this over /etc/resolv.conf: the sandbox asks any address; nft redirects it.
    mkdirSync(etcDir, { recursive: true });
    cleanups.push(() => rmSync(etcDir, { recursive: true, force: true }));
    writeFileSync(`${etcDir}/resolv.conf`, 'nameserver 198.51.100.53\noptions timeout:2 attempts:1\n');

    const directory = new MapNetworkDirectory();
    const logger = createLogger('egress-test', '0', 'silent');
    const proxies = await startNetworkProxies({
      directory,
      logger,
      dnsUpstreams: [internet.dns],
      alwaysDenied: [...DEFAULT_ALWAYS_DENIED, '10.211.128.0/18'],
      egress: { listen: { host: gateway, port: 0 }, preambleTimeoutMs: opts.preambleTimeoutMs },
      dns: { udp: { host: gateway, port: 0 }, tcp: { host: gateway, port: 0 } },
    });
    cleanups.push(() => proxies.close());
    const proxy = proxies.egress!;
    const resolver = proxies.dns!;

    const rules = [
      `table inet ${table} {`,
      '  chain prerouting {',
      '    type nat hook prerouting priority dstnat; policy accept;',
      `    iifname "${hostIf}" tcp dport { 80, 443 } redirect to :${proxy.address().port}`,
      `    iifname "${hostIf}" udp dport 53 redirect to :${resolver.udpAddress().port}`,
      `    iifname "${hostIf}" tcp dport 53 redirect to :${resolver.tcpAddress().port}`,
      '  }',
      '}',
    ].join('\n');
    cleanups.push(() => quiet(() => execFileSync('nft', ['delete', 'table', 'inet', table], { stdio: 'ignore' })));
    execFileSync('nft', ['-f', '-'], { input: rules, stdio: ['pipe', 'ignore', 'pipe'] });

    const setPolicy = (p: Partial<EgressPolicyInput>) => {
      const view: SandboxNetworkView = {
        sandboxId: `sb-${tag}`,
        state: 'RUNNING' as SandboxNetworkView['state'],
        slot: 0,
        address,
        gateway,
        policy: parseEgressPolicy({ allowOut: [], denyOut: [], blockAll: false, ...p }),
        public: false,
        accessTokenSha256: '',
        poddAddress: '',
      };
      directory.set(view);
    };
    const inSandbox = async (argv: string[], timeoutMs = 15_000): Promise<SandboxRun> => {
      try {
        const { stdout, stderr } = await run('ip', ['netns', 'exec', netns, ...argv], { timeout: timeoutMs, encoding: 'utf8' });
        return { code: 0, stdout, stderr };
      } catch (err) {
        const e = err as { code?: number; stdout?: string; stderr?: string };
        return { code: typeof e.code === 'number' ? e.code : -1, stdout: e.stdout ?? '', stderr: e.stderr ?? '' };
      }
    };
    return { internet, address, gateway, netns, directory, proxy, resolver, setPolicy, inSandbox, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}
