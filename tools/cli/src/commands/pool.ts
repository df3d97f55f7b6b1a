/**
 * `sandnode pool set TEMPLATE SIZE [--vcpus N] [--memory-mib N] [--disk-bytes N] [--pids N]` and
 * `sandnode pool status [--json]`: the warm pools of the node (AdminService.SetPool /
 * GetPoolStatus on the active server's admin socket, root only; issue 14 §2). A pool keeps SIZE
 * sandboxes of TEMPLATE booted and unclaimed; `sandbox create` of that template (and those
 * resources) claims one. A server without pools (feature "server.pool.v1") answers
 * UNIMPLEMENTED: the command says so.
 */
import type { Command } from 'commander';
import { ClientError, Status } from 'nice-grpc-common';
import { table, waitForActiveServer } from '@sandnode/node-stack';
import { createSandnodeChannel, createServiceClient, SERVER_FEATURES } from '@sandnode/shared';
import { AdminServiceDefinition, type PoolStatus } from '@sandnode/shared/proto/server/v1/admin';
import { requireLocal } from '../local-only';
import { dirsOf, wholeNumber } from '../options';
import { action, CliError, print } from '../output';

type Admin = ReturnType<typeof createServiceClient<typeof AdminServiceDefinition>>;

/** withAdmin runs fn with the active server's AdminService; UNIMPLEMENTED (a server without pools) becomes a CliError saying so. */
async function withAdmin<T>(cmd: Command, fn: (admin: Admin) => Promise<T>): Promise<T> {
  requireLocal(cmd, `pool ${cmd.name()}`);
  const holder = await waitForActiveServer(dirsOf(cmd).runDir);
  const ch = createSandnodeChannel(holder.admin);
  try {
    return await fn(createServiceClient(AdminServiceDefinition, ch, { timeoutMs: 30_000 }));
  } catch (err) {
    if (err instanceof ClientError && err.code === Status.UNIMPLEMENTED) {
      throw new CliError(`the active server (version ${holder.version}) has no warm pools (feature ${JSON.stringify(SERVER_FEATURES.pool)}); upgrade it: sandnode upgrade server`, { cause: err });
    }
    throw err;
  } finally {
    ch.close();
  }
}

/**
 * poolView is the JSON shape of one pool for `--json`: {key, template, resources: {vcpus,
 * memoryMib, diskBytes (bytes), pids} (defaults filled in by the server; null if it sent none), size, ready, filling,
 * claimed, missed, lastError}; the decoder's `_unknownFields` is not part of it.
 */
export const poolView = (p: PoolStatus) => ({
  key: p.key,
  template: p.template,
  resources: p.resources ? { vcpus: p.resources.vcpus, memoryMib: p.resources.memoryMib, diskBytes: p.resources.diskBytes, pids: p.resources.pids } : null,
  size: p.size,
  ready: p.ready,
  filling: p.filling,
  claimed: Number(p.claimed),
  missed: Number(p.missed),
  lastError: p.lastError,
});

const res = (p: PoolStatus) => (p.resources ? `${p.resources.vcpus} vcpu, ${p.resources.memoryMib} MiB, ${Math.round(p.resources.diskBytes / 1048576)} MiB disk` : '-');

/** registerPoolCommands adds `pool set | status` to program. */
export function registerPoolCommands(program: Command): void {
  const pool = program
    .command('pool')
    .description('warm pools: sandboxes of a template waiting booted, claimed by sandbox create (on the admin socket: root only)')
    .addHelpText('after', "\nPool commands are local only: they talk to the active server's admin socket on this node (root only), never to --address.");
  pool
    .command('set')
    .description("set the size of a template's warm pool (0 removes it; kept across handovers and restarts)")
    .argument('<template>')
    .argument('<size>', 'members waiting unclaimed, 0..256', wholeNumber)
    .option('--vcpus <n>', 'a pool of its own for creates with these vCPUs', wholeNumber)
    .option('--memory-mib <n>', 'a pool of its own for creates with this memory, MiB', wholeNumber)
    .option('--disk-bytes <n>', 'a pool of its own for creates with this /workspace size, bytes', wholeNumber)
    .option('--pids <n>', 'a pool of its own for creates with this task limit', wholeNumber)
    .option('--json', 'print JSON')
    .action(
      action(async (template: string, size: number, o: { vcpus?: number; memoryMib?: number; diskBytes?: number; pids?: number; json?: boolean }, cmd: Command) => {
        const own = o.vcpus !== undefined || o.memoryMib !== undefined || o.diskBytes !== undefined || o.pids !== undefined;
        const resources = own ? { vcpus: o.vcpus ?? 0, memoryMib: o.memoryMib ?? 0, diskBytes: o.diskBytes ?? 0, pids: o.pids ?? 0 } : undefined;
        const r = await withAdmin(cmd, (a) => a.setPool({ template, size, resources }));
        const p = poolView(r.pool!);
        print(!!o.json, p, () => (size === 0 ? `pool ${p.key} removed; its members are retired` : `pool ${p.key}: size ${p.size} (${p.ready} ready, ${p.filling} filling)`));
      }),
    );
  pool
    .command('status')
    .description('show the warm pools: size, ready, filling, claims and cold creates since the server became active')
    .option('--json', 'print JSON')
    .action(
      action(async (o: { json?: boolean }, cmd: Command) => {
        const r = await withAdmin(cmd, (a) => a.getPoolStatus({}));
        print(!!o.json, { pools: r.pools.map(poolView) }, () =>
          r.pools.length === 0
            ? 'no warm pools (set one: sandnode pool set TEMPLATE SIZE)'
            : table(
                ['POOL', 'TEMPLATE', 'RESOURCES', 'SIZE', 'READY', 'FILLING', 'CLAIMED', 'MISSED', 'LAST ERROR'],
                r.pools.map((p) => [p.key, p.template, res(p), String(p.size), String(p.ready), String(p.filling), String(p.claimed), String(p.missed), p.lastError || '-']),
              ),
        );
      }),
    );
}
