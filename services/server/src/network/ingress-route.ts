/**
 * Which sandbox and port an ingress request is for, and whether it may go there: routing by
 * `Host: <port>-<sandbox_id>.<domain>` (any port after the name) or by the headers
 * `sandnode-sandbox-id` + `sandnode-sandbox-port`, and the access check of a private sandbox
 * (`sandnode-access-token`, compared by SHA-256 in constant time). Pure functions, no I/O.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import type { IncomingHttpHeaders } from 'node:http';
import type { NetworkDirectory, SandboxNetworkView } from '../core/network-directory';

export const SANDBOX_ID_HEADER = 'sandnode-sandbox-id';
export const SANDBOX_PORT_HEADER = 'sandnode-sandbox-port';
export const ACCESS_TOKEN_HEADER = 'sandnode-access-token';

/** Seconds a client is told to wait (Retry-After) when the sandbox is not running. */
export const RETRY_AFTER_S = 5;

/** A routing answer: where to go, or the HTTP status and one-line reason to answer with. */
export type Route = { ok: true; view: SandboxNetworkView; port: number } | { ok: false; status: 400 | 401 | 404 | 503; reason: string; retryAfterS?: number; notRunning?: string };

const PORT_RE = /^[1-9][0-9]{0,4}$/;

function parsePort(s: string): number | undefined {
  if (!PORT_RE.test(s)) return undefined;
  const n = Number(s);
  return n <= 65535 ? n : undefined;
}

/** hostTarget parses `<port>-<sandbox_id>.<domain>[:port]` (case-insensitive); undefined when it is not that form. */
export function hostTarget(host: string | undefined, domain: string): { sandboxId: string; port: number } | undefined {
  if (!host) return undefined;
  let name = host.trim().toLowerCase();
  const colon = name.lastIndexOf(':');
  if (colon >= 0 && /^[0-9]+$/.test(name.slice(colon + 1))) name = name.slice(0, colon);
  if (name.endsWith('.')) name = name.slice(0, -1);
  const suffix = `.${domain.toLowerCase()}`;
  if (!name.endsWith(suffix)) return undefined;
  const label = name.slice(0, -suffix.length);
  const dash = label.indexOf('-');
  if (dash <= 0 || label.includes('.')) return undefined;
  const port = parsePort(label.slice(0, dash));
  const sandboxId = label.slice(dash + 1);
  if (port === undefined || !sandboxId) return undefined;
  return { sandboxId, port };
}

function one(h: string | string[] | undefined): string | undefined {
  return Array.isArray(h) ? h[0] : h;
}

/** tokenMatches: sha256(token) equals the hex digest accessTokenSha256, compared in constant time. */
export function tokenMatches(token: string | undefined, accessTokenSha256: string): boolean {
  if (!token || !/^[0-9a-f]{64}$/i.test(accessTokenSha256)) return false;
  const got = createHash('sha256').update(token).digest();
  return timingSafeEqual(got, Buffer.from(accessTokenSha256, 'hex'));
}

/**
 * TokenMemo: the last access token a client connection proved, and the digest it matched. A
 * request on that connection carrying the same token for a sandbox with the same digest is let
 * in without hashing again (the same inputs give the same answer; anything else is checked).
 */
export interface TokenMemo {
  token?: string;
  sha?: string;
}

/**
 * route decides where a request goes. authority is the CONNECT target (req.url of a CONNECT),
 * tried after the headers and before Host. Answers: 400 (neither headers nor a Host of that
 * form, or a bad port header), 404 (no networked sandbox of that id), 503 + Retry-After (the
 * sandbox is not RUNNING: paused, being created; DRAINED without Retry-After, it needs an operator's resume; notRunning names it, for an auto-resume), 401 (private and the token is
 * missing, or wrong: the reason says which).
 */
export function route(headers: IncomingHttpHeaders, dir: NetworkDirectory, domain: string, authority?: string, memo?: TokenMemo): Route {
  const idHeader = one(headers[SANDBOX_ID_HEADER]);
  const portHeader = one(headers[SANDBOX_PORT_HEADER]);
  let target: { sandboxId: string; port: number } | undefined;
  if (idHeader !== undefined || portHeader !== undefined) {
    const port = portHeader === undefined ? undefined : parsePort(portHeader.trim());
    if (!idHeader || port === undefined) return { ok: false, status: 400, reason: `bad routing headers: ${SANDBOX_ID_HEADER} and ${SANDBOX_PORT_HEADER} (1..65535) go together` };
    target = { sandboxId: idHeader.trim(), port };
  } else {
    target = hostTarget(authority, domain) ?? hostTarget(one(headers.host), domain);
    if (!target) return { ok: false, status: 400, reason: `bad Host: expected <port>-<sandbox_id>.${domain} or the ${SANDBOX_ID_HEADER} + ${SANDBOX_PORT_HEADER} headers` };
  }
  const view = dir.bySandboxId(target.sandboxId);
  if (!view) return { ok: false, status: 404, reason: `no networked sandbox ${target.sandboxId.slice(0, 64)} on this node` };
  if (!view.public) {
    const token = one(headers[ACCESS_TOKEN_HEADER]);
    if (!token) return { ok: false, status: 401, reason: `sandbox ${view.sandboxId} is private: send its access token in the ${ACCESS_TOKEN_HEADER} header` };
    const proved = memo !== undefined && memo.token === token && memo.sha === view.accessTokenSha256;
    if (!proved && !tokenMatches(token, view.accessTokenSha256)) {
      return {
        ok: false,
        status: 401,
        reason: `sandbox ${view.sandboxId} is private and the ${ACCESS_TOKEN_HEADER} header holds a wrong access token (the one printed when the sandbox was created or forked)`,
      };
    }
    if (memo && !proved) {
      memo.token = token;
      memo.sha = view.accessTokenSha256;
    }
  }
  // a DRAINED sandbox comes back only when an operator resumes it: no Retry-After (a client would retry for good: newcomer)
  if (view.state === 'DRAINED')
    return {
      ok: false,
      status: 503,
      reason: `sandbox ${view.sandboxId} is DRAINED (its node was drained): it serves again only after \`sandnode sandbox resume ${view.sandboxId}\``,
      notRunning: view.sandboxId,
    };
  if (view.state !== 'RUNNING') return { ok: false, status: 503, reason: `sandbox ${view.sandboxId} is ${view.state}, not RUNNING: resume it`, retryAfterS: RETRY_AFTER_S, notRunning: view.sandboxId };
  return { ok: true, view, port: target.port };
}
