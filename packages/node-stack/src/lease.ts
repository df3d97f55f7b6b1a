/**
 * Who holds the node's server lease, as the servers themselves say it: every server serves
 * AdminService on its admin socket (`<runDir>/server-<slot or pid>-admin.sock`, root only);
 * the active one is the server whose GetLeaseStatus answers role ACTIVE. The CLI and the
 * tools never read the lease file: a killed server's stale socket refuses at once and a
 * retired one answers RETIRING, so neither is taken for the active server.
 */
import { lstatSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { ADMIN_SOCKET_RE, createSandnodeChannel, createServiceClient, unixAddress } from '@sandnode/shared';
import { AdminServiceDefinition, ServerRole, type GetLeaseStatusResponse } from '@sandnode/shared/proto/server/v1/admin';
import { sleep } from './daemon-process';

/** Default time one admin socket may take to answer GetLeaseStatus, ms. */
export const DEFAULT_LEASE_STATUS_TIMEOUT_MS = 2000;
/** Default time {@link waitForActiveServer} waits for an active server, ms. */
export const DEFAULT_ACTIVE_WAIT_MS = 2000;
/** Poll interval of {@link waitForActiveServer}, ms. */
export const ACTIVE_POLL_MS = 50;

/** A server as its admin socket describes it. */
export interface ServerStatus {
  /** its admin address, "unix:///abs/server-a-admin.sock" */
  admin: string;
  /** role name without prefix: ACTIVE, STANDBY, HANDING_OVER, RETIRING */
  role: string;
  /** the node's epoch as this server knows it */
  epoch: number;
  /** pid of the lease holder (0 when free) */
  holderPid: number;
  /** this server's slot: "a", "b", or "" for a server started without one */
  slot: string;
  /** this server's semver */
  version: string;
  /** when it became active, Unix epoch ms; 0 if it is not */
  sinceMs: number;
}

/**
 * adminSockets lists the admin sockets in runDir (absolute paths): unix sockets, not symlinks,
 * owned by root or by the calling user, so another local user cannot plant an "active server".
 */
export function adminSockets(runDir: string): string[] {
  let names: string[];
  try {
    names = readdirSync(path.resolve(runDir));
  } catch {
    return [];
  }
  const me = process.getuid?.() ?? 0;
  return names
    .filter((n) => ADMIN_SOCKET_RE.test(n))
    .map((n) => path.join(path.resolve(runDir), n))
    .filter((p) => {
      // only a socket (never a symlink) owned by root or by this user is a server's admin socket
      const st = lstatSync(p, { throwIfNoEntry: false });
      return !!st && st.isSocket() && (st.uid === 0 || st.uid === me);
    });
}

/**
 * serverStatus asks one admin address for GetLeaseStatus (one attempt within timeoutMs, ms);
 * undefined when nothing answers; Error "permission denied" when the caller may not connect.
 */
export async function serverStatus(admin: string, timeoutMs = DEFAULT_LEASE_STATUS_TIMEOUT_MS): Promise<ServerStatus | undefined> {
  const ch = createSandnodeChannel(admin);
  try {
    const st: GetLeaseStatusResponse = await createServiceClient(AdminServiceDefinition, ch, { timeoutMs, retryAttempts: 1 }).getLeaseStatus({});
    return {
      admin,
      role: (ServerRole[st.role] ?? `UNKNOWN_${st.role}`).replace('SERVER_ROLE_', ''),
      epoch: Number(st.epoch),
      holderPid: st.holderPid,
      slot: st.slot,
      version: st.version,
      sinceMs: Number(st.sinceMs),
    };
  } catch (err) {
    // a caller without the right to the root-only admin socket must not be told "no server"
    if (/\bEACCES\b|\bEPERM\b/.test(String((err as Error).message))) {
      throw new Error(`permission denied on ${admin}: the admin socket is for root only; run the command as root`, { cause: err });
    }
    return undefined;
  } finally {
    ch.close();
  }
}

/** listServers asks every admin socket in runDir for its status at once, each within timeoutMs (ms); those that answer. */
export async function listServers(runDir: string, timeoutMs = DEFAULT_LEASE_STATUS_TIMEOUT_MS): Promise<ServerStatus[]> {
  const all = await Promise.all(adminSockets(runDir).map((s) => serverStatus(unixAddress(s), timeoutMs)));
  return all.filter((s): s is ServerStatus => s !== undefined);
}

/**
 * findActiveServer is the server whose admin socket answers ACTIVE (each asked within timeoutMs,
 * ms); undefined when none does. Throws Error when more than one answers ACTIVE (never guesses)
 * or when the caller may not open an admin socket (not root).
 */
export async function findActiveServer(runDir: string, timeoutMs = DEFAULT_LEASE_STATUS_TIMEOUT_MS): Promise<ServerStatus | undefined> {
  const active = (await listServers(runDir, timeoutMs)).filter((s) => s.role === 'ACTIVE');
  if (active.length > 1) {
    // one lease, one active server: two answers mean one of them is not what it says; acting on either could fence the real one out
    throw new Error(
      `${active.length} admin sockets answer ACTIVE (${active.map((s) => `${s.admin} pid ${s.holderPid} epoch ${s.epoch}`).join('; ')}): refusing to pick one; stop the one that is not the lease holder`,
    );
  }
  return active[0];
}

/**
 * waitForActiveServer polls {@link findActiveServer} every {@link ACTIVE_POLL_MS} for up to
 * waitMs, ms (a handover in progress has no ACTIVE server for a moment). Throws Error "no
 * active server" after that.
 */
export async function waitForActiveServer(runDir: string, waitMs = DEFAULT_ACTIVE_WAIT_MS): Promise<ServerStatus> {
  const deadline = Date.now() + waitMs;
  for (;;) {
    const s = await findActiveServer(runDir);
    if (s) return s;
    if (Date.now() >= deadline) throw new Error('no active server: start one with `sandnode up`');
    await sleep(ACTIVE_POLL_MS);
  }
}
