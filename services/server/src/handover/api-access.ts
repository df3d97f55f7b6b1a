/**
 * Who may call the server's public API (issue 10 §4): the auth policy of the public gRPC server
 * and the mode of its unix socket. Root may always call over the unix socket; members of the
 * group named by config `socketGroup` too (the socket file is then chgrp'ed to it and made
 * 0660, else it stays 0600 root). TCP callers need a bearer token (verifyToken: records.db,
 * checked on every call) or a client certificate (a TLS listener). The admin socket is root only (ADMIN_POLICY).
 */
import { chmodSync, chownSync, readFileSync } from 'node:fs';
import { ConfigError, serverTlsCredentials, type AuthPolicy, type TokenIdentity } from '@sandnode/shared';

/** The admin socket's policy: root only (unix peers), and no tokens. */
export const ADMIN_POLICY: AuthPolicy = {};

/**
 * groupId resolves a group name (or a number) to its gid through /etc/group (groups from other
 * NSS sources are not seen: give the number then). Throws an Error naming the key when there is
 * no such group.
 */
export function groupId(name: string, groupFile = '/etc/group'): number {
  if (/^\d+$/.test(name)) return Number(name);
  for (const line of readFileSync(groupFile, 'utf8').split('\n')) {
    const [n, , gid] = line.split(':');
    if (n === name && gid !== undefined && /^\d+$/.test(gid)) return Number(gid);
  }
  throw new Error(`socketGroup: there is no group ${JSON.stringify(name)} in ${groupFile}`);
}

/** publicPolicy: the public server's policy for socketGroup ("" = root only) and the token check. */
export function publicPolicy(socketGroup: string, verifyToken?: (secret: string) => TokenIdentity): AuthPolicy {
  const policy: AuthPolicy = verifyToken ? { verifyToken } : {};
  if (socketGroup) Object.assign(policy, { unixGroups: [groupId(socketGroup)], unixGroupName: socketGroup });
  return policy;
}

/** shareSocket gives the group socketGroup read/write on the socket file (chgrp + 0660); "" leaves it 0600 root. */
export function shareSocket(socketPath: string, socketGroup: string): void {
  if (!socketGroup) return;
  chownSync(socketPath, 0, groupId(socketGroup));
  chmodSync(socketPath, 0o660);
}

let tlsCreds: { key: string; creds: ReturnType<typeof serverTlsCredentials> } | undefined;

/**
 * tcpCredentials: the TCP listener's credentials: mutual TLS when tlsCa/tlsCert/tlsKey are set
 * (read once per process and files), else undefined (plaintext on a loopback host: config.ts
 * refused any other). Errors: an Error naming the key whose file cannot be read.
 */
export function tcpCredentials(cfg: { tlsCa: string; tlsCert: string; tlsKey: string }): ReturnType<typeof serverTlsCredentials> | undefined {
  if (!cfg.tlsCert) return undefined;
  const key = `${cfg.tlsCa}\n${cfg.tlsCert}\n${cfg.tlsKey}`;
  if (tlsCreds?.key !== key) tlsCreds = { key, creds: serverTlsCredentials(cfg) };
  return tlsCreds.creds;
}

/** checkApiAccess reads the TLS files and resolves socketGroup at start, so a bad one stops the start (ConfigError naming the key), not an activation. */
export function checkApiAccess(cfg: { listen: string; socketGroup: string; tlsCa: string; tlsCert: string; tlsKey: string }): void {
  try {
    if (cfg.socketGroup) groupId(cfg.socketGroup);
    if (cfg.listen) tcpCredentials(cfg);
  } catch (err) {
    throw new ConfigError((err as Error).message);
  }
}
