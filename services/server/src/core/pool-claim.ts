/**
 * The CreateSandbox side of the warm pool (pool.ts): a claim of a READY member in one
 * compare-and-swap that also writes the request's metadata, timeout and request_id, then the
 * request's egress policy through the network update path (network-update.ts setVmEgress) when
 * it differs from the member's. A member that cannot give what is asked (no network where one
 * is asked, a network where none is) is not claimed: the create goes cold and says why.
 */
import type { CoreContext } from './context';
import { checkAllowsReachable, nodeNetwork, syncDirectory, type NetworkChoice } from './network';
import { setVmEgress } from './network-update';
import { PoolUnfit, type WarmPool } from './pool';
import { teardown } from './provision';
import type { IdleRef, Resources, SandboxRecord } from './types';

export interface PoolClaimArgs {
  template: string;
  resources: Resources;
  metadata: Record<string, string>;
  timeoutSeconds: number;
  requestId: string;
  network: NetworkChoice;
  /** the request's idle settings and timers (idle.ts newIdleRef, counted from the claim); undefined: none */
  idle?: IdleRef;
  /** the request's environment (CreateSandboxRequest.env, validated) */
  env: Record<string, string>;
}

/** networkFit says why member cannot give the asked network ("" when it can). */
export function networkFit(network: NetworkChoice, member: SandboxRecord): string {
  if (network === 'disabled' && member.network) return 'the request asks for no network; the pool members have one';
  if (network && network !== 'disabled' && !member.network) return 'the request asks for a network; the pool members have none';
  return '';
}

const samePolicy = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b);

/**
 * claimFromPool claims a member for a create: the record it returns is the caller's sandbox
 * (RUNNING, pool part NONE with claimedAtMs set, the request's metadata, timeout and idle
 * timers from now, request_id, network publicness and policy). miss says why there is none ("" without a pool).
 * A member whose policy cannot be set is torn down and the create goes cold (miss says so).
 */
export async function claimFromPool(c: CoreContext, pool: WarmPool, a: PoolClaimArgs): Promise<{ rec?: SandboxRecord; miss: string }> {
  const now = c.now();
  const asked = a.network && a.network !== 'disabled' ? a.network : undefined;
  // the check of a cold create (planNetwork), before any member is taken: an allow_out inside an always-denied range is INVALID_ARGUMENT here too
  if (asked?.egress.allowOut.length) {
    const node = await nodeNetwork(c.vms);
    if (node.available) checkAllowsReachable(asked.egress, node.alwaysDenied, 'network.egress');
  }
  let needsPolicy = false;
  const got = await pool.claim(a.template, a.resources, (m, key) => {
    const why = networkFit(a.network, m);
    if (why) throw new PoolUnfit(why);
    needsPolicy = !!(asked && m.network && !samePolicy(m.network.egress, asked.egress));
    return {
      ...m,
      metadata: { ...a.metadata },
      requestId: a.requestId,
      expiresAtMs: a.timeoutSeconds ? now + a.timeoutSeconds * 1000 : 0,
      // the request's idle settings, their timers from the claim (a member has none of its own)
      idle: a.idle,
      // the request's environment: applied per command, so a member needs no reboot for it
      env: { ...a.env },
      // the caller's sandbox was made for it now (a member's boot time is not the caller's)
      createdAtMs: now,
      updatedAtMs: now,
      network: m.network && asked ? { ...m.network, public: asked.public } : m.network,
      // CLAIMING until the policy is on the VM: a crash before leaves a record the pool deletes, never a sandbox with the member's policy
      pool: { key, state: needsPolicy ? 'CLAIMING' : 'NONE', claimedAtMs: now },
    };
  });
  const rec = got.rec;
  if (!rec) return got;
  if (!needsPolicy || !asked) {
    syncDirectory(c.directory, rec);
    return got;
  }
  const id = rec.sandboxId;
  pool.claiming.add(id);
  try {
    return await c.locks.run(id, async () => {
      try {
        await setVmEgress(c, rec, asked.egress);
      } catch (err) {
        c.log.warn({ sandbox_id: id, err }, 'could not set the policy of a claimed pool member; tearing it down, creating cold');
        await teardown(c, rec).catch((e: unknown) => c.log.error({ sandbox_id: id, err: e }, 'teardown of a claimed pool member failed; retried by the reaper'));
        return { miss: `the policy of pool member ${id} could not be set: ${(err as Error).message}` };
      }
      rec.network!.egress = asked.egress;
      rec.pool = { ...rec.pool!, state: 'NONE' };
      c.touch(rec);
      return { rec, miss: '' };
    });
  } finally {
    pool.claiming.delete(id);
  }
}
