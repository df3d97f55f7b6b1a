/**
 * What a handover to a standby without this server's network features costs (issue 12 §4): a
 * rollback of the server to 0.2.0 keeps the sandboxes' kernel network (the vmm-supervisor's:
 * addresses, NAT, the CIDR rules) and loses the server's user-space parts. PrepareHandover says
 * so, naming the networked sandboxes affected.
 */
import { SERVER_FEATURES } from '@sandnode/shared';

/** Most sandbox ids a loss names (the count is always given). */
export const MAX_LOSS_IDS = 20;

/**
 * handoverLosses lists, for each network feature this server has and standbyFeatures lack,
 * what stops and which of networkedIds (the networked sandboxes) it affects. Empty when the
 * standby has them all, or when no sandbox is networked and only the proxies are missing.
 */
export function handoverLosses(standbyVersion: string, standbyFeatures: readonly string[], networkedIds: readonly string[]): string[] {
  const lacks = (f: string) => !standbyFeatures.includes(f);
  const who = `the standby (${standbyVersion || 'unknown version'})`;
  const ids = [...networkedIds].sort();
  const affected =
    ids.length === 0 ? 'no networked sandbox is affected now' : `${ids.length} networked sandbox(es) affected: ${ids.slice(0, MAX_LOSS_IDS).join(', ')}${ids.length > MAX_LOSS_IDS ? ', ...' : ''}`;
  const out: string[] = [];
  const stops: string[] = [];
  if (lacks(SERVER_FEATURES.ingress)) stops.push(`"${SERVER_FEATURES.ingress}": the ingress listener stops (sandbox URLs answer nothing)`);
  if (lacks(SERVER_FEATURES.egressProxy))
    stops.push(`"${SERVER_FEATURES.egressProxy}": the egress proxy and DNS resolver stop (sandboxes resolve no names; TCP to the proxied ports of sandboxes with domain rules is refused)`);
  if (stops.length) out.push(`${who} lacks ${stops.join('; and ')}; the kernel network of running sandboxes (the vmm-supervisor's: addresses, NAT, CIDR rules) keeps working; ${affected}`);
  if (lacks(SERVER_FEATURES.network) && ids.length > 0)
    out.push(
      `${who} lacks "${SERVER_FEATURES.network}": new sandboxes get no network, UpdateSandboxNetwork is UNIMPLEMENTED, and a deleted DRAINED sandbox's reserved slot is freed only by a newer server's orphan sweep; ${affected}`,
    );
  return out;
}
