/** The server's user-space network proxies (issue 12): egress proxy and DNS resolver; main.ts wires them. */
export * from './egress-proxy';
export * from './dns-resolver';
export * from './upstream-dns';
export * from './preamble';
export * from './original-dst';
export * from './sockets';
export * from './proxies';
