/**
 * `sandnode drain [--deadline-ms MS] [--concurrency N]`: freeze, stop and persist every live sandbox,
 * then stop the device manager (pod deletion, node shutdown; deploy/prestop.sh runs it). Exits
 * 1 (and says "drain partial": which sandboxes were not preserved, at which step and why, and
 * whether the device manager was stopped) unless every sandbox was PRESERVED and the device
 * manager stopped.
 */
import type { Command } from 'commander';
import { table, waitForActiveServer } from '@sandnode/node-stack';
import { DEFAULT_DRAIN_CONCURRENCY, DEFAULT_DRAIN_DEADLINE_MS, createSandnodeChannel, createServiceClient } from '@sandnode/shared';
import { AdminServiceDefinition, DrainOutcome } from '@sandnode/shared/proto/server/v1/admin';
import { dirsOf, wholeNumber } from '../options';
import { EXIT_FAILURE, action, print } from '../output';

/** Time the Drain call gets beyond the drain's own deadline, for the server to answer, ms. */
export const DRAIN_CALL_MARGIN_MS = 10_000;

/** registerDrainCommand adds drain to program. */
export function registerDrainCommand(program: Command): void {
  program
    .command('drain')
    .description(
      'freeze, stop and persist every live sandbox (bounded concurrency; it becomes DRAINED, its disks kept: `sandbox resume ID` boots it again), then stop the device manager; for pod deletion / node shutdown',
    )
    .option('--deadline-ms <ms>', 'time for the whole drain, ms', wholeNumber, DEFAULT_DRAIN_DEADLINE_MS)
    .option('--concurrency <n>', 'sandboxes drained at once', wholeNumber, DEFAULT_DRAIN_CONCURRENCY)
    .option('--json', 'print JSON')
    .action(
      action(async (o: { deadlineMs: number; concurrency: number; json?: boolean }, cmd: Command) => {
        const holder = await waitForActiveServer(dirsOf(cmd).runDir);
        const ch = createSandnodeChannel(holder.admin);
        try {
          const admin = createServiceClient(AdminServiceDefinition, ch, { timeoutMs: o.deadlineMs + DRAIN_CALL_MARGIN_MS });
          const r = await admin.drain({ deadlineMs: o.deadlineMs, concurrency: o.concurrency });
          const rows = r.sandboxes.map((s) => ({ id: s.sandboxId, outcome: DrainOutcome[s.outcome].replace('DRAIN_OUTCOME_', ''), resume: s.resumeMethod, ms: s.ms, error: s.error }));
          const notPreserved = rows.filter((x) => x.outcome !== 'PRESERVED');
          const partial = notPreserved.length > 0 || !r.deviceManagerStopped;
          const json = { sandboxes: rows, durationMs: r.durationMs, deviceManagerStopped: r.deviceManagerStopped, deviceManagerError: r.deviceManagerError, partial };
          print(!!o.json, json, () =>
            [
              table(
                ['ID', 'OUTCOME', 'RESUME', 'MS', 'ERROR'],
                rows.map((x) => [x.id, x.outcome, x.resume, x.ms, x.error]),
              ),
              `drained in ${r.durationMs} ms; device manager stopped: ${r.deviceManagerStopped}${r.deviceManagerError ? ` (${r.deviceManagerError})` : ''}`,
              ...(partial
                ? [
                    `drain partial: ${notPreserved.length} of ${rows.length} sandboxes not preserved${notPreserved.length ? ` (${notPreserved.map((x) => x.id).join(', ')})` : ''}${r.deviceManagerStopped ? '' : '; device manager not stopped'}`,
                  ]
                : []),
            ].join('\n'),
          );
          if (partial) process.exitCode = EXIT_FAILURE;
        } finally {
          ch.close();
        }
      }),
    );
}
