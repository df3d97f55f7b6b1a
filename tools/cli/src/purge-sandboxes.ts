/**
 * The first step of `sandnode down --purge` while the server runs: delete every sandbox through
 * the API (the server tears each one down: container, devices, mounts, records).
 */
import type { ServerApi } from '@sandnode/node-stack';
import { ClientError, Status } from 'nice-grpc-common';
import type { PurgedNetwork } from '@sandnode/shared';
import { listAllSandboxes } from './server-calls';

/** What {@link deleteAllSandboxes} did. */
export interface PurgedSandboxes {
  /** ids deleted by this call */
  deleted: string[];
  /** ids listed but gone when deleted (NOT_FOUND: the reaper or another purge finished them): done as well */
  gone: string[];
}

/**
 * deleteAllSandboxes lists every sandbox and deletes them all at once. A NOT_FOUND on delete
 * means the sandbox is gone already, which is what the purge wants. Any other failure: Error
 * naming each sandbox that was not deleted with its gRPC code and message (the first failure as
 * cause), after every delete has settled.
 */
export async function deleteAllSandboxes(api: ServerApi): Promise<PurgedSandboxes> {
  const out: PurgedSandboxes = { deleted: [], gone: [] };
  const failed: { id: string; err: Error }[] = [];
  const all = await listAllSandboxes(api);
  await Promise.all(
    all.map(async ({ sandboxId }) => {
      try {
        await api.sandboxes.deleteSandbox({ sandboxId });
        out.deleted.push(sandboxId);
      } catch (err) {
        if (err instanceof ClientError && err.code === Status.NOT_FOUND) out.gone.push(sandboxId);
        else failed.push({ id: sandboxId, err: err as Error });
      }
    }),
  );
  if (failed.length) {
    const what = failed.map(({ id, err }) => `${id}: ${err instanceof ClientError ? `${Status[err.code]}: ${err.details}` : err.message}`);
    throw new Error(`could not delete ${failed.length} of ${all.length} sandboxes, so nothing was stopped or purged: ${what.join('; ')}`, { cause: failed[0]!.err });
  }
  return out;
}

/**
 * purgedNetworkText is the line `down --purge` prints of the node's network it removed: whether
 * its nftables table was there, the host interfaces and the netns mounts (slots) taken away.
 */
export function purgedNetworkText(n: PurgedNetwork): string {
  return `removed network: nftables table ${n.table ? 'yes' : 'none'}, interfaces: ${n.ifaces.join(' ') || 'none'}, netns: ${n.netns.join(' ') || 'none'}`;
}
