/**
 * The ingress listener (feature "server.ingress.v1"; docs/network.md "Ingress"): HTTP/1.1 from
 * the host's clients to a port of a sandbox, routed and checked by ingress-route.ts.
 *
 *   request  -> dial sandbox address:port (refused: podd ForwardPort to 127.0.0.1:port when the
 *               podd has the feature, else 502) -> the request streamed upstream, the response
 *               streamed back (no whole body is buffered); the client connection is kept alive
 *   upgrade  -> dial, the request head written raw, then bytes both ways (the 101 comes from
 *               the sandbox's server) — WebSocket
 *   CONNECT  -> dial, `200 Connection Established`, then bytes both ways (raw TCP)
 *
 * Two engines serve it, chosen by config `ingressEngine`: 'raw' (default, ingress-raw.ts: its
 * own HTTP/1.1 head parser on net.Socket, bodies passed through as they came) and 'node-http'
 * (ingress-node-http.ts: node:http, bodies re-framed by node). Both share routing, limits, the
 * dial, the tunnels and the header rules (ingress-common.ts) and pass the same tests.
 *
 * Bounds: header bytes (maxHeaderBytes: 431) and time (headersTimeoutMs: 408, slowloris),
 * total client connections (maxConnections: beyond, the oldest connection with nothing in
 * flight is closed for the new one; when all are busy, the new one is closed), forwarded
 * connections per sandbox (maxPerSandbox: beyond, 429), idle time of a client or tunnel
 * connection (idleTimeoutMs), upstream connect time (connectTimeoutMs). The
 * `sandnode-access-token` header is never sent upstream; X-Forwarded-For/-Proto/-Host are set
 * (what the client sent is replaced), on WebSocket upgrades too.
 *
 * The caller listens (the handover's named listener "ingress": listen on the server only after
 * createIngress attached its handlers).
 */
import { INGRESS_ENGINES, type Ingress, type IngressOptions } from './ingress-common';
import { createNodeHttpIngress } from './ingress-node-http';
import { createRawIngress } from './ingress-raw';

export { DEFAULT_INGRESS_LIMITS, INGRESS_ENGINES, type Ingress, type IngressEngine, type IngressIdle, type IngressLimits, type IngressOptions } from './ingress-common';

/** createIngress builds the ingress server of engine o.engine (default 'raw'). Throws on an unknown engine. */
export function createIngress(o: IngressOptions): Ingress {
  const engine = o.engine ?? 'raw';
  if (!INGRESS_ENGINES.includes(engine)) throw new Error(`unknown ingress engine ${String(engine)} (one of ${INGRESS_ENGINES.join(', ')})`);
  return engine === 'raw' ? createRawIngress(o) : createNodeHttpIngress(o);
}

/** ingressLimitsFromConfig: the IngressLimits of the server keys ingressMaxConnections, ingressMaxConnectionsPerSandbox, ingressHeadersTimeoutMs, ingressIdleTimeoutMs. */
export function ingressLimitsFromConfig(c: {
  ingressMaxConnections: number;
  ingressMaxConnectionsPerSandbox: number;
  ingressHeadersTimeoutMs: number;
  ingressIdleTimeoutMs: number;
}): Partial<{ maxConnections: number; maxPerSandbox: number; headersTimeoutMs: number; idleTimeoutMs: number }> {
  return { maxConnections: c.ingressMaxConnections, maxPerSandbox: c.ingressMaxConnectionsPerSandbox, headersTimeoutMs: c.ingressHeadersTimeoutMs, idleTimeoutMs: c.ingressIdleTimeoutMs };
}
