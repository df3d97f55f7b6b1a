/**
 * The hint line printed under a failed call: what to try next, from the gRPC code, the error's
 * details and where the CLI called (a unix socket of this node or a TCP address). A hint must not
 * send the user the wrong way: "is the node up?" only when the node's own socket did not answer.
 */
import { readFileSync, statSync } from 'node:fs';
import net from 'node:net';
import type { Command } from 'commander';
import { Status } from 'nice-grpc-common';
import { dirsOf } from './options';

/** Where a failed call went, as the hint needs it. */
export interface CallTarget {
  /** the address called: "unix:///abs.sock" or "host:port" */
  address: string;
  /** whether the call had TLS configured (--tls-ca) */
  tls?: boolean;
  /** the group that owns the unix socket, when not root's ("" or undefined: root's or unknown) */
  socketGroup?: string;
}

/** How the operator lets a non-root user at the server's socket. */
const SOCKET_GROUP_HOWTO = "the server's socketGroup (env SANDNODE_SERVER_SOCKET_GROUP / key socketGroup)";
const TLS_OPTIONS = '--tls-ca (the CA of the server certificate) and, for mutual TLS, --tls-cert/--tls-key (env SANDNODE_TLS_CA/_CERT/_KEY)';

/** The hints that depend on the code only. */
const PLAIN: Partial<Record<Status, string>> = {
  [Status.DEADLINE_EXCEEDED]: 'the node did not answer in time; see: sandnode status',
  [Status.UNIMPLEMENTED]: 'the node runs a build without this call; see: sandnode version',
  [Status.RESOURCE_EXHAUSTED]: 'the node is at a limit: delete sandboxes, or retry later',
};

const isUnix = (address: string) => address.startsWith('unix:');
/** grpc-js's words for a connection the peer accepted and closed before HTTP/2 started ("Failed to connect" without an errno), or reset. */
const CLOSED_UNSERVED = /Failed to connect \(|\bECONNRESET\b|\bEPIPE\b|Connection dropped|Connection closed/;
const CLOSED_UNSERVED_HINT =
  "the node's socket took the connection and closed it unserved: the node is up, but this user holds too many connections that sent nothing yet (256 at most), or the server was exiting; retry, and see: sandnode status";
/** Node's words for a server certificate that does not name the host dialled (ERR_TLS_CERT_ALTNAME_INVALID): "... is not in the cert's list: A, B." */
const ALTNAME = /altnames?:.*?(?:list|names?): ([^\n]*)/i;

/** altnameHint: the server certificate does not name the host of address; names: what it does name. */
function altnameHint(address: string, names: string): string {
  const host = address.replace(/:\d+$/, '').replace(/^\[(.*)\]$/, '$1');
  const kind = net.isIP(host) ? 'IP' : 'DNS';
  return `the server's certificate does not name ${host} (it names ${names}): dial one of those, or make the server pair naming it: sandnode certs init --force --san ${kind}:${host} (then restart the server with it)`;
}

/** The server's words for a podd that did not answer (services/server peers/peer-errors.ts PODD_PREFIX). */
const PODD_FAILED = /\bthe sandbox's podd did not answer\b/;
const PODD_FAILED_HINT =
  "the node is up; the sandbox's agent (podd) did not answer: a process in the sandbox may have stopped or replaced it; retry, or put podd back with: sandnode sandbox reset-rootfs ID (keeps /workspace)";
/** A TLS failure as grpc-js / OpenSSL word it (handshake alerts, certificate checks). */
const TLS_ERROR = /ssl|tls|handshake|certificate|self[- ]signed|alert number|wrong version number|packet length too long/i;

/** socketHint: what to say when a unix peer may not use the socket (connect EACCES, or the server refused its uid). */
function socketHint(t: CallTarget): string {
  const path = t.address.replace(/^unix:(\/\/)?/, '');
  if (t.socketGroup) return `the socket ${path} is for root and group ${t.socketGroup}: run sandnode as root, or join group ${t.socketGroup}`;
  return `the socket ${path} is root's (the node is likely up): run sandnode as root, or have it shared with a group: ${SOCKET_GROUP_HOWTO}`;
}

/**
 * nodeDownHint: nothing answers at the node's socket. It names the socket tried: the default run
 * dir is relative (./.sandnode/run), so a command run from another directory looks for another
 * node, and `sandnode up` there starts a second one (newcomer).
 */
function nodeDownHint(address: string): string {
  const sock = address.replace(/^unix:(\/\/)?/, '');
  const relative = sock.endsWith('/.sandnode/run/server.sock')
    ? " (the default --run-dir ./.sandnode/run is relative to this directory: run from the node's directory, or give --run-dir / SANDNODE_RUN_DIR)"
    : '';
  return `is the node up? nothing answers at ${sock}; run: sandnode up${relative}`;
}

/**
 * hintFor: the hint for a call that failed with code and details at target, or undefined when
 * there is nothing useful to say. Pure (the caller finds the socket's group).
 */
export function hintFor(code: Status, details: string, target: CallTarget): string | undefined {
  const unix = isUnix(target.address);
  // the server answered: the sandbox's own agent did not (server peer-errors.ts PODD_PREFIX)
  if ((code === Status.UNAVAILABLE || code === Status.DEADLINE_EXCEEDED) && PODD_FAILED.test(details)) return PODD_FAILED_HINT;
  if (code === Status.UNAVAILABLE) {
    if (unix && /\b(EACCES|EPERM)\b/.test(details)) return socketHint(target);
    // the socket took the connection and the server closed it unserved (grpc-js: "Failed to connect" with no errno, or a reset):
    // the node is up; it is at its limit of undecided connections of this user (SNIFF_MAX_PENDING_PER_UID), or its server is exiting
    if (unix && CLOSED_UNSERVED.test(details) && !/\b(ENOENT|ECONNREFUSED|ENOTSOCK)\b/.test(details)) return CLOSED_UNSERVED_HINT;
    if (unix) return nodeDownHint(target.address);
    const altname = ALTNAME.exec(details);
    if (altname) return altnameHint(target.address, altname[1]!.replace(/\.$/, ''));
    if (TLS_ERROR.test(details)) return `TLS with ${target.address} failed: give ${TLS_OPTIONS}`;
    if (!target.tls) return `is the server listening at ${target.address}? if it serves TLS, give ${TLS_OPTIONS}`;
    return `is the server listening at ${target.address}?`;
  }
  // a token was given and refused: wrong, revoked or expired (connection-auth / the token store say which)
  if (code === Status.UNAUTHENTICATED && !unix && /\b(not known to this node|was revoked|expired)\b/.test(details))
    return 'the token given is not one this node accepts: check SANDNODE_TOKEN / --token-file (on the node: sandnode token list; sandnode token create makes a new one)';
  // the token's safe forms first: --token puts the secret in the process list (newcomer)
  if (code === Status.UNAUTHENTICATED && !unix) return `give a token (env SANDNODE_TOKEN or --token-file FILE; sandnode token create on the node makes one) or a client certificate (${TLS_OPTIONS})`;
  if (code === Status.PERMISSION_DENIED) {
    if (/has the read role/.test(details)) return "the token's role does not allow this call: use an admin token (on the node: sandnode token create --name N --role admin)";
    const group = /members of group ([^\s)]+)/.exec(details)?.[1];
    if (group) return `only root and members of group ${group} may use this socket: run sandnode as root, or join group ${group}`;
    if (/may not call this socket/.test(details) || unix) return socketHint(target);
    return undefined;
  }
  // a fork that missed its freeze window (server parent-hold.ts): the flag, not the proto field
  const freeze = code === Status.ABORTED ? /retry with a larger max_freeze_ms \(at most (\d+)\)/.exec(details) : null;
  if (freeze) return `retry with a longer freeze window: sandnode sandbox fork ID --max-freeze-ms N (ms, at most ${freeze[1]}), or pause the sandbox and fork it paused`;
  if (code === Status.FAILED_PRECONDITION) {
    // "sandbox sb-... is DRAINED; Exec needs RUNNING" (server core/transitions.ts), "... is PAUSED and its idle.auto_resume is off ..."
    const m = /\bsandbox (sb-[0-9a-z-]+) is (DRAINED|PAUSED)\b/.exec(details);
    // a pause of a sandbox that is not RUNNING: resuming it is not what was asked
    if (m && /\bPauseSandbox needs\b/.test(details)) return m[2] === 'PAUSED' ? `it is paused already; it stays paused (sandnode sandbox get ${m[1]})` : `it is drained: it runs nothing to pause`;
    if (m) return `resume it first: sandnode sandbox resume ${m[1]}`;
  }
  return PLAIN[code];
}

/** groupName: the name of group gid in /etc/group, else its number as text. */
function groupName(gid: number): string {
  try {
    const line = readFileSync('/etc/group', 'utf8')
      .split('\n')
      .find((l) => l.split(':')[2] === String(gid));
    return line?.split(':')[0] || String(gid);
  } catch {
    return String(gid);
  }
}

/** targetOf: where cmd's calls go (its --address or the node's socket) and, for a socket not root's group, that group. Never throws. */
export function targetOf(cmd: Command): CallTarget {
  let t: CallTarget;
  try {
    const d = dirsOf(cmd);
    t = { address: d.address, tls: !!d.auth.tlsCa };
  } catch {
    return { address: 'unix:///run/sandnode/server.sock' };
  }
  if (!isUnix(t.address)) return t;
  try {
    const gid = statSync(t.address.replace(/^unix:(\/\/)?/, '')).gid;
    return gid === 0 ? t : { ...t, socketGroup: groupName(gid) };
  } catch {
    return t;
  }
}
