/**
 * Commands that work only on the node itself (token: the active server's admin socket; status:
 * every component's socket and pid file): --address (or SANDNODE_ADDRESS) would be ignored, so
 * it is a usage error instead.
 */
import type { Command } from 'commander';
import { UsageError } from './output';

/** requireLocal throws a UsageError (exit 2) naming command when cmd was given --address / SANDNODE_ADDRESS. */
export function requireLocal(cmd: Command, command: string): void {
  const address = cmd.optsWithGlobals<{ address?: string }>().address;
  if (address === undefined) return;
  throw new UsageError(`sandnode ${command} works only on the node itself (its unix sockets, as root): it cannot use --address ${address} (or SANDNODE_ADDRESS); run it on the node without --address`);
}
