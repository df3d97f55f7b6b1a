/**
 * Who may call the server's public API (issue 10 §4): the auth policy of the public gRPC server
 * and the mode of its unix socket. Root may always call over the unix socket; members of the
 * group named by config `socketGroup` too (the socket file is then chgrp'ed to it and made
 * 0660, else it stays 0600 root). TCP callers are not checked yet (openTcp). The admin socket is root only (ADMIN_POLICY).
 */
import { chmodSync, chownSync, readFileSync } from 'node:fs';
import type { AuthPolicy, TokenIdentity } from '@sandnode/shared';

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
  // TCP stays open as in 0.2.0 until it requires credentials
  const policy: AuthPolicy = verifyToken ? { verifyToken } : { openTcp: true };
  if (socketGroup) Object.assign(policy, { unixGroups: [groupId(socketGroup)], unixGroupName: socketGroup });
  return policy;
}

/** shareSocket gives the group socketGroup read/write on the socket file (chgrp + 0660); "" leaves it 0600 root. */
export function shareSocket(socketPath: string, socketGroup: string): void {
  if (!socketGroup) return;
  chownSync(socketPath, 0, groupId(socketGroup));
  chmodSync(socketPath, 0o660);
}
