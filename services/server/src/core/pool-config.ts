/**
 * Warm-pool configuration (issue 14 §2): per template (and optionally per resources) the number
 * of sandboxes that wait booted and unclaimed. Set by AdminService.SetPool, kept in records.db
 * (store/sqlite-pool-store.ts) so that a handover or restart keeps it.
 */
import { InvalidArgumentError } from '@sandnode/shared';
import type { Resources, SandboxRecord } from './types';
import { validateResources, validateTemplateName, type ResourceDefaults } from './validate';

/** Largest pool size. */
export const MAX_POOL_SIZE = 256;
/** Pool members created at once by the refill, node-wide (config key `poolFillConcurrency`). */
export const DEFAULT_POOL_FILL_CONCURRENCY = 2;
/** How often each waiting member's podd is asked for health, ms (config key `poolHealthIntervalMs`). */
export const DEFAULT_POOL_HEALTH_INTERVAL_MS = 10_000;

/** One configured pool. */
export interface PoolConfig {
  /** poolKey(template, resources) */
  key: string;
  template: string;
  /** the members' resources as set (defaults filled); undefined: the node defaults of the day */
  resources: Resources | undefined;
  /** members that wait unclaimed, 1..MAX_POOL_SIZE */
  size: number;
  /** when it was set, epoch ms */
  updatedAtMs: number;
}

/** Where pool configs are kept (records.db in the server). */
export interface PoolConfigStore {
  /** list returns every pool, ordered by key. */
  list(): PoolConfig[];
  /** set inserts or replaces c (durable on return). */
  set(c: PoolConfig): void;
  /** delete removes the pool keyed key (durable on return). */
  delete(key: string): void;
}

/**
 * poolKey names a pool: the template for a pool of the node defaults, else
 * "<template>@<vcpus>c<memoryMib>m<diskBytes>d<pids>p".
 */
export function poolKey(template: string, resources: Resources | undefined): string {
  return resources ? `${template}@${resources.vcpus}c${resources.memoryMib}m${resources.diskBytes}d${resources.pids}p` : template;
}

/**
 * validatePoolRequest checks a SetPool request: template name, size 0..MAX_POOL_SIZE, resources
 * (undefined: node defaults). Errors: INVALID_ARGUMENT naming the field.
 */
export function validatePoolRequest(
  template: string,
  size: number,
  resources: Partial<Resources> | undefined,
  d: ResourceDefaults,
): { template: string; size: number; resources: Resources | undefined } {
  const name = validateTemplateName('template', template);
  if (!Number.isInteger(size) || size < 0 || size > MAX_POOL_SIZE) throw new InvalidArgumentError(`size: ${size} is out of range 0..${MAX_POOL_SIZE}`);
  return { template: name, size, resources: resources ? validateResources('resources', resources, d) : undefined };
}

/** effectiveResources: what a pool's members get (its own, or the node defaults now). */
export function effectiveResources(c: Pick<PoolConfig, 'resources'>, d: ResourceDefaults): Resources {
  return c.resources ?? { vcpus: d.vcpus, memoryMib: d.memoryMib, diskBytes: d.diskBytes, pids: 0 };
}

/** sameResources compares two filled-in resource sets. */
export function sameResources(a: Resources, b: Resources): boolean {
  return a.vcpus === b.vcpus && a.memoryMib === b.memoryMib && a.diskBytes === b.diskBytes && a.pids === b.pids;
}

/** isPoolMember: the record is a warm-pool member (READY or being claimed): ListSandboxes and the sandbox counts leave it out. */
export function isPoolMember(rec: SandboxRecord): boolean {
  return rec.pool?.state === 'READY' || rec.pool?.state === 'CLAIMING';
}
