/** The commands that need root (up, down): a file system refusal says so instead of a raw EACCES. */
import { CliError } from './output';

/**
 * asRootOnly: err as `command` (up, down) should report it when it is a file system EACCES/EPERM
 * (a non-root user on the node's root-owned run dir, e.g. `<runDir>/up.lock`): a CliError saying
 * the command needs root, with the original message. Any other error is returned as it is.
 */
export function asRootOnly(command: string, err: unknown): unknown {
  const code = (err as NodeJS.ErrnoException | null)?.code;
  if (code !== 'EACCES' && code !== 'EPERM') return err;
  const uid = process.getuid?.();
  return new CliError(
    `sandnode ${command} needs root: it starts and stops the node's daemons in root's run dir (${(err as Error).message}); run it as root${uid === undefined ? '' : ` (this is uid ${uid})`}`,
    {
      cause: err,
    },
  );
}
