/**
 * AdminService.SetPool / GetPoolStatus handlers (warm pools, core/pool.ts): validate -> call
 * the active server's pool -> convert. Errors: INVALID_ARGUMENT (bad field, nothing changed),
 * NOT_FOUND (no such template), FAILED_PRECONDITION (not ACTIVE, or a server without pools).
 */
import { FailedPreconditionError, NotFoundError } from '@sandnode/shared';
import type { GetPoolStatusResponse, PoolStatus, SetPoolRequest, SetPoolResponse } from '@sandnode/shared/proto/server/v1/admin';
import type { WarmPool, PoolStatusInfo } from '../core/pool';
import { poolKey, validatePoolRequest, type PoolConfigStore } from '../core/pool-config';
import type { TemplateCatalog } from '../core/types';
import { templateNotFound } from '../core/sandbox-manager';
import type { ResourceDefaults } from '../core/validate';

/** What the pool RPCs need of the active server (undefined unless ACTIVE). */
export interface PoolAdminPort {
  pool: WarmPool;
  configs: PoolConfigStore;
  templates: Pick<TemplateCatalog, 'get' | 'list'>;
  resourceDefaults: ResourceDefaults;
  now(): number;
}

/** poolStatusToPb converts one pool's status. */
export function poolStatusToPb(s: PoolStatusInfo): PoolStatus {
  return { key: s.key, template: s.template, resources: { ...s.resources }, size: s.size, ready: s.ready, filling: s.filling, claimed: s.claimed, missed: s.missed, lastError: s.lastError };
}

function activePool(port: PoolAdminPort | undefined): PoolAdminPort {
  if (!port) throw new FailedPreconditionError('warm pools are kept by the ACTIVE server; this one is not active (or has no pools)');
  return port;
}

/** setPool: see admin.proto SetPool. */
export async function setPool(port: PoolAdminPort | undefined, req: SetPoolRequest): Promise<SetPoolResponse> {
  const p = activePool(port);
  const v = validatePoolRequest(req.template, req.size, req.resources, p.resourceDefaults);
  const key = poolKey(v.template, v.resources);
  if (v.size === 0) {
    p.configs.delete(key);
  } else {
    if (!(await p.templates.get(v.template))) throw new NotFoundError(`${(await templateNotFound(p.templates, v.template)).message}; no pool was set`);
    p.configs.set({ key, template: v.template, resources: v.resources, size: v.size, updatedAtMs: p.now() });
  }
  // removed members are retired and new ones made by the next pass; start the refill now
  p.pool.fill();
  void p.pool.tick();
  const s = p.pool.status().find((x) => x.key === key);
  return {
    pool: poolStatusToPb(s ?? { key, template: v.template, resources: v.resources ?? { ...p.resourceDefaults, pids: 0 }, size: 0, ready: 0, filling: 0, claimed: 0, missed: 0, lastError: '' }),
  };
}

/** getPoolStatus: see admin.proto GetPoolStatus. */
export function getPoolStatus(port: PoolAdminPort | undefined): GetPoolStatusResponse {
  return { pools: activePool(port).pool.status().map(poolStatusToPb) };
}
