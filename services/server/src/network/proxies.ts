/**
 * startNetworkProxies: the server's egress proxy and DNS resolver started together over one
 * set of upstreams, for main.ts to wire (keys in docs/network.md). Either may be off (undefined
 * listen): a node whose supervisor has no network, or a test of one of them.
 */
import { DEFAULT_ALWAYS_DENIED, parseCidrList, type Logger } from '@sandnode/shared';
import type { NetworkDirectory } from '../core/network-directory';
import { startDnsResolver, type DnsResolver, type DnsResolverOptions } from './dns-resolver';
import { startEgressProxy, type EgressProxy, type EgressProxyOptions } from './egress-proxy';
import { resolvConfNameservers, UpstreamDns } from './upstream-dns';
import type { Destination } from './original-dst';

/**
 * Ranges that reach the host itself when the proxy (a host process) connects to them: refused
 * whatever networkAlwaysDenied says (network.proto rule 1: loopback and the node's own
 * addresses; isOwnAddress covers the interfaces' addresses, not these).
 */
export const HOST_LOOPBACK_RANGES: readonly string[] = ['0.0.0.0/8', '127.0.0.0/8'];

/** Options of {@link startNetworkProxies}. */
export interface NetworkProxiesOptions {
  directory: NetworkDirectory;
  logger: Logger;
  /** server key dnsUpstreams, parsed (parseDnsUpstreams); default the IPv4 nameservers of /etc/resolv.conf */
  dnsUpstreams?: Destination[];
  /** server key networkAlwaysDenied plus the pool and the node's own addresses (CIDR texts); default DEFAULT_ALWAYS_DENIED; HOST_LOOPBACK_RANGES are always added */
  alwaysDenied?: readonly string[];
  /** the egress proxy: its listener (egressProxyPort; bind IPv4: SO_ORIGINAL_DST is read as IPv4) and limits */
  egress?: Omit<EgressProxyOptions, 'directory' | 'upstream' | 'alwaysDenied' | 'logger'>;
  /** the resolver: its sockets (dnsPort, udp and tcp) and limits */
  dns?: Omit<DnsResolverOptions, 'directory' | 'upstream' | 'logger'>;
}

/** The running proxies; close() stops both. */
export interface NetworkProxies {
  egress?: EgressProxy;
  dns?: DnsResolver;
  upstream: UpstreamDns;
  close(): Promise<void>;
}

/**
 * startNetworkProxies starts what opts asks for. Throws an Error naming the key for a bad
 * alwaysDenied entry (InvalidArgumentError) or an unreadable resolv.conf; rejects on a bind
 * error after closing what it had started.
 */
export async function startNetworkProxies(opts: NetworkProxiesOptions): Promise<NetworkProxies> {
  const upstream = new UpstreamDns({ upstreams: opts.dnsUpstreams ?? resolvConfNameservers() });
  const alwaysDenied = parseCidrList([...new Set([...(opts.alwaysDenied ?? DEFAULT_ALWAYS_DENIED), ...HOST_LOOPBACK_RANGES])], 'networkAlwaysDenied');
  const out: NetworkProxies = {
    upstream,
    close: async () => {
      await Promise.all([out.egress?.close(), out.dns?.close()]);
    },
  };
  try {
    if (opts.egress) out.egress = await startEgressProxy({ directory: opts.directory, upstream, alwaysDenied, logger: opts.logger, ...opts.egress });
    if (opts.dns) out.dns = await startDnsResolver({ directory: opts.directory, upstream, logger: opts.logger, ...opts.dns });
  } catch (err) {
    await out.close();
    throw err;
  }
  return out;
}
