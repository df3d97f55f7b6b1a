/**
 * isolationGroups: the sandboxes of `sandnode status` grouped by the isolation their VM got
 * (Sandbox.isolation), so that an operator sees which ones run with less (e.g. those a 0.2.0
 * vmm-supervisor created after a rollback: an empty list).
 */
import { SandboxState, type Sandbox } from '@sandnode/shared/proto/server/v1/sandbox';

/** One group: the isolation (feature strings, sorted; [] = none named) and its sandbox ids, sorted. */
export interface IsolationGroup {
  isolation: string[];
  sandboxes: string[];
}

/**
 * isolationGroups groups sandboxes by their isolation list, the largest group first; a DRAINED
 * sandbox has no VM, so no isolation to show, and is left out (newcomer: drained sandboxes of this
 * release were listed as "none named ... e.g. 0.2.0"; status counts them on its own line). Pure.
 */
export function isolationGroups(sandboxes: Sandbox[]): IsolationGroup[] {
  const by = new Map<string, IsolationGroup>();
  for (const s of sandboxes) {
    if (s.state === SandboxState.SANDBOX_STATE_DRAINED) continue;
    const isolation = [...s.isolation].sort();
    const key = isolation.join(',');
    const g = by.get(key) ?? { isolation, sandboxes: [] };
    g.sandboxes.push(s.sandboxId);
    by.set(key, g);
  }
  for (const g of by.values()) g.sandboxes.sort();
  return [...by.values()].sort((a, b) => b.sandboxes.length - a.sandboxes.length || a.isolation.join(',').localeCompare(b.isolation.join(',')));
}
