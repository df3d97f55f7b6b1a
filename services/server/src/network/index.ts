/**
 * The server's user-space network services (docs/network.md): the egress proxy and DNS
 * resolver of networked sandboxes and the ingress listener. main.ts starts them once the
 * server is active, with the NetworkDirectory the SandboxManager keeps in step with the
 * records and the node's settings as the vmm-supervisor reports them (ListNetworkSlots: one
 * source of truth for the ports, the always-denied ranges and the pool).
 *
 * PLACEHOLDER on branch h/api: this is the interface main.ts calls; the egress proxy, resolver
 * and ingress listener (egress-proxy*.ts, dns-resolver*.ts, ingress*.ts, built on other
 * branches) are connected here at the merge. Until then startNetworkServices starts nothing and
 * says so in the log.
 */
import type { Logger } from '@sandnode/shared';
import type { NetworkDirectory } from '../core/network-directory';

/** The node's network settings (vmm ListNetworkSlots). */
export interface NetworkSettings {
  /** the node's network is on (the supervisor lists "vmm.network.v1" and says enabled) */
  enabled: boolean;
  /** why not, when off */
  disabledReason: string;
  /** the sandbox pool, CIDR */
  pool: string;
  /** host port of the resolver (the sandboxes' udp/tcp 53 is redirected there) */
  dnsPort: number;
  /** host port of the egress proxy */
  egressProxyPort: number;
  /** destination ports redirected to the egress proxy */
  proxiedPorts: number[];
  /** the node's always-denied ranges, CIDRs */
  alwaysDenied: string[];
}

export interface NetworkServicesOptions {
  /** lookups by source address (egress) and by sandbox id (ingress) */
  directory: NetworkDirectory;
  settings: NetworkSettings;
  /** the ingress listener: config ingressListen ("" off) and ingressDomain */
  ingress: { listen: string; domain: string };
  logger: Logger;
}

/** Running network services. */
export interface NetworkServices {
  /** close stops accepting and closes what runs. */
  close(): Promise<void>;
}

/** startNetworkServices starts the egress proxy, resolver and ingress listener (placeholder: none yet, see the file header). */
export async function startNetworkServices(o: NetworkServicesOptions): Promise<NetworkServices> {
  o.logger.warn({ network_enabled: o.settings.enabled, ingress_listen: o.ingress.listen }, 'network services: not built into this server (egress proxy, resolver and ingress come at the merge)');
  return { close: async () => undefined };
}

export * from './egress-proxy';
export * from './dns-resolver';
export * from './upstream-dns';
export * from './preamble';
export * from './original-dst';
export * from './sockets';
export * from './proxies';
