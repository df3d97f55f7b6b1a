/**
 * `sandnode drain [--deadline-ms MS] [--concurrency N]`: freeze, stop and persist every live sandbox,
 * then stop the device manager (pod deletion, node shutdown; deploy/prestop.sh runs it). Exits
 * 1 (and says "drain partial": which sandboxes were not preserved, at which step and why, and
 * whether the device manager was stopped) unless every sandbox was PRESERVED and the device
 * manager stopped. Per sandbox it says what was kept (disks, id, labels) and what was not
 * (processes and memory: a cold start), and on a TTY it shows the drain's progress.
 */
import { existsSync, rmSync } from 'node:fs';
import type { Command } from 'commander';
import { checkStackDirs, findRunning, pidFile, waitForActiveServer } from '@sandnode/node-stack';
import { DEFAULT_DRAIN_CONCURRENCY, DEFAULT_DRAIN_DEADLINE_MS, createSandnodeChannel, createServiceClient, processState, type ServiceClient } from '@sandnode/shared';
import { AdminServiceDefinition, DrainOutcome, type DrainedSandbox, type DrainResponse } from '@sandnode/shared/proto/server/v1/admin';
import { ClientError, Status } from 'nice-grpc-common';
import { SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { dirsOf, wholeNumber, type CliDirs } from '../options';
import { EXIT_FAILURE, action, print } from '../output';
import { listAllSandboxes, withServer } from '../server-calls';
import { Progress, paint } from '../terminal';

/** Time the Drain call gets beyond the drain's own deadline, for the server to answer, ms. */
export const DRAIN_CALL_MARGIN_MS = 10_000;
/** How often the progress line asks the server how many sandboxes are DRAINED, ms. */
export const DRAIN_PROGRESS_POLL_MS = 500;

/** One sandbox's row of the drain report. */
export interface DrainRow {
  id: string;
  /** PRESERVED or FAILED */
  outcome: string;
  /** how a resume brings it back ("cold-start") */
  resume: string;
  ms: number;
  error: string;
}

/** What a cold-start resume keeps and loses: the words of a PRESERVED sandbox. */
export const PRESERVED_TEXT = 'kept: rootfs and /workspace disks, id, labels, network slot; lost: running processes and memory (resume boots it again, new pid)';

/** drainedText is the line the drain prints for one sandbox: preserved (how long, how it resumes) or not (why); what a preserved one keeps is said once, {@link PRESERVED_TEXT}. */
export function drainedText(x: DrainRow): string {
  if (x.outcome === 'PRESERVED') return `${x.id}: preserved in ${x.ms} ms (${x.resume}); \`sandnode sandbox resume ${x.id}\``;
  return `${x.id}: NOT preserved after ${x.ms} ms: ${x.error || 'no reason given'}`;
}

/** drainProgress shows "k of n sandboxes drained" on a TTY while a drain runs on a server without DrainStream (0.2.0): it polls the public API; stop() ends it. */
function drainProgress(d: CliDirs, quiet: boolean): { stop: () => void } {
  const p = new Progress('draining', quiet);
  let on = !quiet && process.stderr.isTTY === true;
  const poll = async () => {
    while (on) {
      try {
        const all = await withServer(d, (api) => listAllSandboxes(api));
        const done = all.filter((s) => s.state === SandboxState.SANDBOX_STATE_DRAINED).length;
        if (on) p.set(`draining: ${done} of ${all.length} sandboxes drained`);
      } catch {
        // the progress line is a nicety: the drain's own answer says what happened
      }
      await new Promise((r) => setTimeout(r, DRAIN_PROGRESS_POLL_MS).unref());
    }
  };
  void poll();
  return {
    stop: () => {
      on = false;
      p.stop();
    },
  };
}

/** rowOf is a DrainedSandbox as the report prints it. */
function rowOf(s: DrainedSandbox): DrainRow {
  return { id: s.sandboxId, outcome: DrainOutcome[s.outcome]?.replace('DRAIN_OUTCOME_', '') ?? String(s.outcome), resume: s.resumeMethod, ms: s.ms, error: s.error };
}

/**
 * runDrain drains through AdminService.DrainStream (feature server.drain-stream.v1): on a TTY
 * each sandbox's line is printed as its drain ends, under a "k of n" status line. A server
 * without it answers UNIMPLEMENTED before doing anything, and the drain goes through Drain with
 * the polled progress line instead. Resolves with the drain's report and whether each
 * sandbox's line was already printed (streamed to a TTY), so the report does not repeat them.
 */
export async function runDrain(
  admin: ServiceClient<typeof AdminServiceDefinition>,
  req: { deadlineMs: number; concurrency: number },
  d: CliDirs,
  quiet: boolean,
): Promise<{ report: DrainResponse; linesShown: boolean }> {
  const p = new Progress('draining', quiet);
  let total = 0;
  let done = 0;
  try {
    // a stream gets no default deadline: the drain's own, plus the margin for the report
    for await (const e of admin.drainStream(req, { deadline: req.deadlineMs + DRAIN_CALL_MARGIN_MS })) {
      const ev = e.event;
      if (ev?.$case === 'started') {
        total = ev.value.sandboxes;
        p.set(`draining: 0 of ${total} sandboxes (concurrency ${ev.value.concurrency}, deadline ${ev.value.deadlineMs} ms)`);
      } else if (ev?.$case === 'sandbox') {
        done++;
        p.step(drainedText(rowOf(ev.value)));
        p.set(`draining: ${done} of ${total} sandboxes`);
      } else if (ev?.$case === 'result') {
        // on a terminal the lines are seen; a report sent to a file still gets them
        return { report: ev.value, linesShown: p.shown && process.stdout.isTTY === true };
      }
    }
    throw new Error('the server ended the drain stream without its report: run `sandnode status` and `sandnode sandbox list` to see what was drained');
  } catch (err) {
    if (!(err instanceof ClientError && err.code === Status.UNIMPLEMENTED)) throw err;
  } finally {
    p.stop();
  }
  // an older server (no DrainStream): nothing was done yet
  const progress = drainProgress(d, quiet);
  try {
    return { report: await admin.drain(req), linesShown: false };
  } finally {
    progress.stop();
  }
}

/**
 * clearDrainedPidFile removes the ublk-manager's pid file when the drain stopped it and no live
 * process has that pid file (it is sandnode's own file in the checked run dir), so that
 * `status` shows it down rather than a stale pid file. Returns whether it removed one.
 */
function clearDrainedPidFile(d: CliDirs): boolean {
  const f = pidFile(d, 'ublk-manager');
  const running = findRunning(d, 'ublk-manager');
  // a zombie (its parent has not reaped it yet) has exited all the same
  const state = running ? processState(running.pid) : undefined;
  if (!existsSync(f) || (running && state !== 'Z' && state !== 'X')) return false;
  checkStackDirs(d);
  rmSync(f, { force: true });
  return true;
}

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
        const d = dirsOf(cmd);
        const holder = await waitForActiveServer(d.runDir);
        const ch = createSandnodeChannel(holder.admin);
        try {
          const admin = createServiceClient(AdminServiceDefinition, ch, { timeoutMs: o.deadlineMs + DRAIN_CALL_MARGIN_MS });
          const { report: r, linesShown } = await runDrain(admin, { deadlineMs: o.deadlineMs, concurrency: o.concurrency }, d, !!o.json);
          const rows: DrainRow[] = r.sandboxes.map(rowOf);
          const notPreserved = rows.filter((x) => x.outcome !== 'PRESERVED');
          const partial = notPreserved.length > 0 || !r.deviceManagerStopped;
          // the drain went to this node's admin socket (runDir): its pid files are ours to tidy
          if (r.deviceManagerStopped) clearDrainedPidFile(d);
          const json = { sandboxes: rows, durationMs: r.durationMs, deviceManagerStopped: r.deviceManagerStopped, deviceManagerError: r.deviceManagerError, partial };
          print(!!o.json, json, () =>
            [
              // each sandbox once: its line, unless the progress already printed it on the TTY
              ...(linesShown ? [] : rows.map((x) => (x.outcome === 'PRESERVED' ? drainedText(x) : paint('red', drainedText(x))))),
              ...(rows.length > notPreserved.length ? [`preserved sandboxes ${PRESERVED_TEXT}`] : []),
              `drained ${rows.length - notPreserved.length} of ${rows.length} sandboxes in ${r.durationMs} ms; device manager ${r.deviceManagerStopped ? 'stopped' : 'NOT stopped'}${r.deviceManagerError ? ` (${r.deviceManagerError})` : ''}; the vmm-supervisor and server keep running`,
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
