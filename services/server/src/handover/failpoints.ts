/**
 * Named failpoints for crash tests (containerd's `integration/failpoint` idea): the env var
 * `SANDNODE_FAILPOINTS` lists `name=action` pairs separated by commas; action `kill` SIGKILLs
 * this process at that point, `error` throws there. Unset in production: every check is a
 * map lookup.
 */
const points = new Map<string, string>(
  (process.env.SANDNODE_FAILPOINTS ?? '')
    .split(',')
    .map((p) => p.trim())
    .filter(Boolean)
    .map((p) => {
      const [k, v] = p.split('=');
      return [k ?? '', v ?? 'kill'] as [string, string];
    }),
);

/** failpoint triggers the action configured for name, if any. */
export function failpoint(name: string): void {
  const action = points.get(name);
  if (!action) return;
  if (action === 'kill') process.kill(process.pid, 'SIGKILL');
  if (action === 'error') throw new Error(`failpoint ${name}`);
}

/** The failpoints of the server handover, in the order they are reached. */
export const HANDOVER_FAILPOINTS = [
  'handover.after-hold', // old: lifecycle calls held, in-flight ones done
  'handover.after-send', // old: listeners sent to the standby
  'handover.after-release', // old: lease released, before answering
  'takeover.after-fds', // new: listeners received, lease not taken
  'takeover.after-lease', // new: lease taken (epoch+1), before adoption
  'takeover.after-serve', // new: serving, before FinishHandover
] as const;

/** The failpoints of ForkSandbox and ResetRootfs (crash tests of the server). */
export const FORK_FAILPOINTS = [
  'fork.after-hold', // the parent is frozen (podd Quiesce) or paused, before the clones
  'fork.after-clone', // both clones made, before the parent is released
  'reset.after-stop', // ResetRootfs: fresh upper recorded, VM stopped, before the switch
] as const;
