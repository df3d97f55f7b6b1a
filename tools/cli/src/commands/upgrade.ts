/**
 * `sandnode upgrade server | ublk-manager (--from-build DIR | --standby)`: upgrade (or roll
 * back) a component live, by handover. --json prints node-stack's result as is.
 */
import type { Command } from 'commander';
import { poolPart, previewServerUpgrade, table, upgradeServer, upgradeServerViaStandby, upgradeUblkManager, type UpgradePreview } from '@sandnode/node-stack';
import { dirsOf } from '../options';
import { UsageError, action, print } from '../output';
import { withProgress } from '../terminal';

/** Options of both upgrade commands. */
interface UpgradeOpts {
  fromBuild?: string;
  standby?: boolean;
  json?: boolean;
  dryRun?: boolean;
}

/** previewText is how `upgrade server --dry-run` shows a preview. */
export function previewText(p: UpgradePreview): string {
  const head = p.ok
    ? `a handover from ${p.fromVersion} to ${p.toVersion} would start now (${p.sandboxes} live ${p.sandboxes === 1 ? 'sandbox' : 'sandboxes'} adopted)`
    : `a handover from ${p.fromVersion} to ${p.toVersion} would not start: ${p.reasons.join('; ')}`;
  return [head, ...(p.losses.length ? p.losses.map((l) => `loses: ${l}`) : ['loses: nothing the target lacks'])].join('\n');
}

const FROM_BUILD_HELP = 'a checkout of sandnode with node_modules and a build ("." for this one)';

/** requireOneSource throws a UsageError unless exactly one of --from-build and --standby was given. */
function requireOneSource(o: UpgradeOpts): void {
  if (!!o.fromBuild === !!o.standby) throw new UsageError('give exactly one of --from-build DIR and --standby');
}

/** registerUpgradeCommands adds `upgrade server` and `upgrade ublk-manager` to program. */
export function registerUpgradeCommands(program: Command): void {
  const upgrade = program.command('upgrade').description('upgrade (or roll back) a component live, by handover');

  upgrade
    .command('server')
    .description('hand the node over to a server of another build: one started here from --from-build, or the running standby (--standby)')
    .option('--from-build <dir>', FROM_BUILD_HELP)
    .option('--standby', 'use the standby server that already runs (k8s: the standby slot container after its image update)')
    .option('--dry-run', 'say whether the handover would start and what the node would lose with the target (e.g. ingress and the egress proxy on a rollback to 0.2.0); change nothing')
    .option('--json', 'print JSON')
    .action(
      action(async (o: UpgradeOpts, cmd: Command) => {
        requireOneSource(o);
        const d = dirsOf(cmd);
        if (o.dryRun) {
          const p = await previewServerUpgrade(d, o.standby ? { standby: true } : { buildDir: o.fromBuild! });
          return print(!!o.json, p, () => previewText(p));
        }
        const r = await withProgress(o.standby ? 'upgrading the server: handover to the standby' : `upgrading the server: starting ${o.fromBuild!} and handing over`, !!o.json, (p) =>
          o.standby ? upgradeServerViaStandby(d) : upgradeServer(d, o.fromBuild!, undefined, (step) => p.step(step)),
        );
        print(!!o.json, r, () =>
          [
            table(
              ['', 'OLD', 'NEW'],
              [
                ['version', r.oldVersion, r.newVersion],
                ['pid', r.oldPid, r.newPid],
                ['epoch', r.epoch - 1, r.epoch],
              ],
            ),
            `hold window ${r.holdWindowMs} ms, ${r.adopted} ${r.adopted === 1 ? 'sandbox' : 'sandboxes'} adopted${poolPart(r.poolMembersAdopted)} in ${r.adoptionMs} ms, listeners: ${r.listeners.join(', ')}`,
          ].join('\n'),
        );
      }),
    );

  upgrade
    .command('ublk-manager')
    .description('move every device to ublk-manager in the other slot (device handover): one started here from --from-build, or the one that runs (--standby)')
    .option('--from-build <dir>', FROM_BUILD_HELP)
    .option('--standby', "use the other slot's ublk-manager that already runs (k8s: the standby slot container)")
    .option('--json', 'print JSON')
    .action(
      action(async (o: UpgradeOpts, cmd: Command) => {
        requireOneSource(o);
        const r = await withProgress('upgrading the ublk-manager: moving every device to the other slot', !!o.json, () => upgradeUblkManager(dirsOf(cmd), o.standby ? undefined : o.fromBuild));
        print(!!o.json, r, () =>
          [
            table(
              ['', 'OLD', 'NEW'],
              [
                ['slot', r.oldSlot, r.newSlot],
                ['version', r.oldVersion, r.newVersion],
                ['pid', r.oldPid, r.newPid],
              ],
            ),
            `${r.devices.length} devices moved (${r.mode}); stall p50 ${r.stallP50Ms.toFixed(2)} ms, p99 ${r.stallP99Ms.toFixed(2)} ms; total ${r.totalMs} ms`,
          ].join('\n'),
        );
      }),
    );
}
