/**
 * What the warm-pool tests (pool*.it.test.ts) look at: the pools as the active server reports
 * them (AdminService.GetPoolStatus), and the members as records.db holds them (ListSandboxes
 * never shows members, so the tests read the records directly, read-only).
 */
import path from 'node:path';
import Database from 'better-sqlite3';
import { waitForActiveServer } from '@sandnode/node-stack';
import { createSandnodeChannel, createServiceClient } from '@sandnode/shared';
import { AdminServiceDefinition, type PoolStatus, type SetPoolRequest } from '@sandnode/shared/proto/server/v1/admin';
import { RuntimeRecord, PoolState } from '@sandnode/shared/proto/server/v1/record';
import { SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { waitFor, type TestNode } from '@sandnode/testkit';

/** withAdmin calls the active server's AdminService. */
export async function withAdmin<T>(node: TestNode, fn: (a: ReturnType<typeof createServiceClient<typeof AdminServiceDefinition>>) => Promise<T>): Promise<T> {
  const holder = await waitForActiveServer(node.dirs.runDir);
  const ch = createSandnodeChannel(holder.admin);
  try {
    return await fn(createServiceClient(AdminServiceDefinition, ch, { timeoutMs: 30_000 }));
  } finally {
    ch.close();
  }
}

/** setPool sets a pool (AdminService.SetPool). */
export function setPool(node: TestNode, req: Partial<SetPoolRequest> & { template: string; size: number }): Promise<PoolStatus | undefined> {
  return withAdmin(node, async (a) => (await a.setPool({ resources: undefined, ...req })).pool);
}

/** poolOf is the status of the pool keyed key (undefined: none). */
export function poolOf(node: TestNode, key: string): Promise<PoolStatus | undefined> {
  return withAdmin(node, async (a) => (await a.getPoolStatus({})).pools.find((p) => p.key === key));
}

/** waitReady waits until pool key has size ready members and none filling (120 s at most). */
export function waitReady(node: TestNode, key: string, size: number): Promise<PoolStatus> {
  return waitFor(
    `pool ${key} with ${size} ready`,
    async () => {
      const p = await poolOf(node, key);
      return p && p.ready === size && p.filling === 0 && p.size === size ? p : undefined;
    },
    120_000,
    200,
  );
}

/** A record as the test reads it from records.db. */
export interface StoredRecord {
  id: string;
  state: SandboxState;
  poolKey: string;
  poolState: PoolState;
  claimedAtMs: number;
  column: string;
}

/** records reads every record of the node's records.db (read-only; the server keeps writing). */
export function records(node: TestNode): StoredRecord[] {
  const db = new Database(path.join(node.dirs.stateDir, 'records.db'), { readonly: true, fileMustExist: true });
  try {
    return db
      .prepare<[], { sandbox_id: string; record: Buffer; pool: string }>('SELECT sandbox_id, record, pool FROM records ORDER BY sandbox_id')
      .all()
      .map((r) => {
        const m = RuntimeRecord.decode(r.record);
        return { id: r.sandbox_id, state: m.state, poolKey: m.pool?.key ?? '', poolState: m.pool?.state ?? PoolState.POOL_STATE_UNSPECIFIED, claimedAtMs: m.pool?.claimedAtMs ?? 0, column: r.pool };
      });
  } finally {
    db.close();
  }
}

/** members lists the ids of the READY members of pool key that are RUNNING. */
export function readyMembers(node: TestNode, key: string): string[] {
  return records(node)
    .filter((r) => r.poolKey === key && r.poolState === PoolState.POOL_STATE_READY && r.state === SandboxState.SANDBOX_STATE_RUNNING)
    .map((r) => r.id);
}
