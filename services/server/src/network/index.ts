/**
 * The server's user-space network services (docs/network.md): the egress proxy and DNS resolver
 * of networked sandboxes and the ingress listener, run by NetworkServices (services.ts) on the
 * named listeners a handover passes on.
 */
export * from './services';
export * from './egress-proxy';
export * from './dns-resolver';
export * from './upstream-dns';
export * from './preamble';
export * from './original-dst';
export * from './sockets';
export * from './proxies';
export * from './ingress';
export * from './ingress-podd';
