/**
 * NetworkServices: the server's user-space network services (docs/network.md) on the named
 * listeners a handover passes on (handover/named-listeners.ts): the ingress listener
 * (`ingressListen`), the egress proxy (`0.0.0.0:<egressProxyPort>`) and the resolver (udp + tcp
 * `0.0.0.0:<dnsPort>`), the ports as the vmm-supervisor reports them (ListNetworkSlots: the
 * supervisor's config is the one source, so its nftables redirects and these listeners agree).
 *
 * At each activation the ServerNode asks `wanted()` (which reads the supervisor's settings and
 * builds the sockets with their handlers attached, not yet listening), then `serve(spec)` for
 * each socket, and listens on it (a received fd or a fresh bind). The proxies accept only from
 * sandbox addresses (NetworkDirectory.byAddress), and the node's nftables input chain drops
 * what reaches their ports from anything but a sandbox interface.
 *
 * Retirement closes only the listeners (ServerNode): connections already open stay with this
 * process until it exits. close() (process stop) ends everything.
 */
import dgram from 'node:dgram';
import net from 'node:net';
import type { Logger } from '@sandnode/shared';
import type { NetworkDirectory } from '../core/network-directory';
import { namedSpec, type NamedListenerName, type NamedListenerSpec } from '../handover/named-listeners';
import type { NodeNetwork } from '../core/types';
import { createIngress, type Ingress, type IngressEngine, type IngressIdle, type IngressLimits } from './ingress';
import { poddRelay, type PoddRelay } from './ingress-podd';
import { startNetworkProxies, type NetworkProxies } from './proxies';
import type { Destination } from './original-dst';

/** How often an activation without egress proxy and resolver asks the supervisor whether its network is on now, ms. */
export const LATE_CHECK_MS = 1000;

/** Options of {@link NetworkServices}. */
export interface NetworkServicesOptions {
  directory: NetworkDirectory;
  /** config ingressListen ("" off), ingressDomain and ingressEngine (default 'raw') */
  ingress: { listen: string; domain: string; limits?: Partial<IngressLimits>; engine?: IngressEngine };
  /** config dnsUpstreams, parsed; default the nameservers of /etc/resolv.conf */
  dnsUpstreams?: Destination[];
  /** reads the node's network from the vmm-supervisor (VmPeer.networkStatus) */
  networkStatus: () => Promise<NodeNetwork>;
  logger: Logger;
  /** how often late() asks the supervisor, ms (default LATE_CHECK_MS) */
  lateCheckMs?: number;
  /** the ingress's activity and auto-resume hook (ingress.ts IngressIdle) */
  idle?: IngressIdle;
}

/** NetworkServices runs the ingress, egress proxy and resolver of one server process. */
export class NetworkServices {
  private ingress?: Ingress;
  private podd?: PoddRelay;
  private proxies?: NetworkProxies;
  /** when late() (or the activation) last asked the supervisor, ms since the epoch */
  private lateCheckedAt = 0;
  private sockets = new Map<NamedListenerName, net.Server | dgram.Socket>();
  private readonly log: Logger;

  constructor(private readonly o: NetworkServicesOptions) {
    this.log = o.logger.child({ part: 'network' });
  }

  /**
   * wanted builds this activation's sockets (handlers attached, not listening) and returns
   * their specs: the ingress when ingressListen is set; the egress proxy and resolver when the
   * supervisor's network is on. A supervisor that cannot say (down, 0.2.0) leaves them off,
   * logged; never throws.
   */
  async wanted(): Promise<NamedListenerSpec[]> {
    this.lateCheckedAt = Date.now();
    await this.closeProxies();
    this.sockets.clear();
    const specs: NamedListenerSpec[] = [];
    if (this.o.ingress.listen) {
      this.podd ??= poddRelay();
      this.ingress ??= createIngress({
        directory: this.o.directory,
        domain: this.o.ingress.domain,
        log: this.log,
        limits: this.o.ingress.limits,
        podd: this.podd,
        idle: this.o.idle,
        engine: this.o.ingress.engine,
      });
      this.sockets.set('ingress', this.ingress.server);
      specs.push(namedSpec('ingress', this.o.ingress.listen));
    }
    let n: NodeNetwork;
    try {
      n = await this.o.networkStatus();
    } catch (err) {
      this.log.warn({ err }, 'could not read the node network from the vmm-supervisor: no egress proxy or resolver on this activation');
      return specs;
    }
    if (!n.available) {
      this.log.info({ reason: n.reason }, 'sandbox network off: no egress proxy or resolver (sandboxes are created without network)');
      return specs;
    }
    return [...specs, ...(await this.proxySpecs(n))];
  }

  /**
   * late builds the egress proxy and resolver when this activation has none and the
   * supervisor's network is on now (it was upgraded to one with "vmm.network.v1", or its network
   * came up, after this server became active): their specs, handlers attached, not listening;
   * [] otherwise. Asks the supervisor at most every LATE_CHECK_MS; never throws.
   */
  async late(): Promise<NamedListenerSpec[]> {
    if (this.proxies || Date.now() - this.lateCheckedAt < (this.o.lateCheckMs ?? LATE_CHECK_MS)) return [];
    this.lateCheckedAt = Date.now();
    let n: NodeNetwork;
    try {
      n = await this.o.networkStatus();
    } catch {
      return [];
    }
    if (!n.available || this.proxies) return [];
    this.log.info('the vmm-supervisor has a network now: starting the egress proxy and resolver');
    return this.proxySpecs(n);
  }

  /** proxySpecs starts the egress proxy and resolver on unbound sockets for network n and gives their specs ([] when they cannot start, logged). */
  private async proxySpecs(n: NodeNetwork): Promise<NamedListenerSpec[]> {
    const egress = net.createServer({ allowHalfOpen: true });
    const dnsTcp = net.createServer();
    const dnsUdp = dgram.createSocket({ type: 'udp4' });
    try {
      this.proxies = await startNetworkProxies({
        directory: this.o.directory,
        logger: this.log,
        dnsUpstreams: this.o.dnsUpstreams,
        alwaysDenied: n.alwaysDenied,
        egress: { listen: { server: egress } },
        dns: { udp: { socket: dnsUdp }, tcp: { server: dnsTcp } },
      });
    } catch (err) {
      this.log.error({ err }, 'egress proxy and resolver could not start: sandboxes have no DNS and no domain rules on this activation');
      return [];
    }
    this.sockets.set('egress-proxy', egress).set('dns-tcp', dnsTcp).set('dns-udp', dnsUdp);
    return [namedSpec('egress-proxy', `0.0.0.0:${n.egressProxyPort}`), namedSpec('dns-tcp', `0.0.0.0:${n.dnsPort}`), namedSpec('dns-udp', `0.0.0.0:${n.dnsPort}`)];
  }

  /** serve gives the socket of spec built by the last wanted(), or undefined. */
  serve(spec: NamedListenerSpec): net.Server | dgram.Socket | undefined {
    return this.sockets.get(spec.name);
  }

  private async closeProxies(): Promise<void> {
    const p = this.proxies;
    this.proxies = undefined;
    await p?.close();
  }

  /** close ends the ingress (and its tunnels), the proxies and their connections. Idempotent. */
  async close(): Promise<void> {
    await this.closeProxies();
    const i = this.ingress;
    this.ingress = undefined;
    await i?.close();
    this.podd?.close();
    this.podd = undefined;
  }
}
