/**
 * Idle actions in the CLI (server feature "server.idle.v1"): the create flags that make a
 * CreateSandboxRequest.idle (--pause-after-s, --hibernate-after-s, --paused-ttl-s,
 * --no-auto-resume), `sandbox keepalive ID SECONDS` (KeepAlive) and the line that shows a
 * sandbox's idle settings and next action.
 */
import type { Command } from 'commander';
import type { IdleSettings } from '@sandnode/shared/proto/server/v1/sandbox';
import { sandboxJson, type SandboxIdleJson } from '@sandnode/node-stack';
import { dirsOf, wholeNumber } from '../options';
import { action, print } from '../output';
import { withServer } from '../server-calls';

/** The idle flags of `sandbox create` (commander: --no-auto-resume makes autoResume false). */
export interface IdleFlags {
  pauseAfterS?: number;
  hibernateAfterS?: number;
  pausedTtlS?: number;
  /** false with --no-auto-resume */
  autoResume?: boolean;
}

/** addIdleFlags gives a create command --pause-after-s, --hibernate-after-s, --paused-ttl-s and --no-auto-resume. */
export function addIdleFlags(cmd: Command): Command {
  return cmd
    .option('--pause-after-s <n>', 'pause (freeze) the sandbox after this many seconds without activity', wholeNumber)
    .option('--hibernate-after-s <n>', 'hibernate (stop its processes, keep disks and address) after this many seconds without activity; above --pause-after-s', wholeNumber)
    .option('--paused-ttl-s <n>', 'delete the sandbox once it has been paused or hibernated this many seconds', wholeNumber)
    .option('--no-auto-resume', 'an exec, file call or ingress request to it while paused or hibernated fails (FAILED_PRECONDITION / 409) instead of resuming it');
}

/** idleRequest is the CreateSandboxRequest.idle the flags ask for: undefined when none is given (no idle actions). */
export function idleRequest(f: IdleFlags): IdleSettings | undefined {
  if (f.pauseAfterS === undefined && f.hibernateAfterS === undefined && f.pausedTtlS === undefined && f.autoResume !== false) return undefined;
  return { pauseAfterS: f.pauseAfterS ?? 0, hibernateAfterS: f.hibernateAfterS ?? 0, pausedTtlS: f.pausedTtlS ?? 0, autoResume: f.autoResume !== false };
}

/** idleLine is how a sandbox's idle settings are shown ("" without them). */
export function idleLine(i: SandboxIdleJson | null): string {
  if (!i) return '';
  const set = [i.pause_after_s && `pause after ${i.pause_after_s} s`, i.hibernate_after_s && `hibernate after ${i.hibernate_after_s} s`, i.paused_ttl_s && `delete ${i.paused_ttl_s} s after pause`]
    .filter(Boolean)
    .join(', ');
  const next = i.next_action ? `; next: ${i.next_action} at ${i.next_action_at}` : '';
  const lease = i.keep_alive_until ? `; kept alive until ${i.keep_alive_until}` : '';
  return `idle: ${set || 'no idle actions'}${i.auto_resume ? '' : ', no auto-resume'}${i.hibernated ? '; hibernated' : ''}${next}${lease}`;
}

/** registerIdleCommands adds `sandbox keepalive ID SECONDS` to the sandbox command. */
export function registerIdleCommands(sandbox: Command): void {
  sandbox
    .command('keepalive')
    .description('hold off the idle actions of a sandbox (pause, hibernate, paused TTL) for SECONDS from now; 0 ends the lease')
    .argument('<id>')
    .argument('<seconds>', 'lease from now in seconds (0: end it)', wholeNumber)
    .option('--json', 'print JSON')
    .action(
      action(async (id: string, seconds: number, o: { json?: boolean }, cmd: Command) => {
        const s = sandboxJson((await withServer(dirsOf(cmd), (api) => api.sandboxes.keepAlive({ sandboxId: id, forS: seconds }))).sandbox!);
        print(!!o.json, s, () => (s.idle ? `${s.id} ${idleLine(s.idle)}` : `${s.id} has no idle settings: nothing to hold off`));
      }),
    );
}
