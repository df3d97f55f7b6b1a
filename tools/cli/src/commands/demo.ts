/**
 * `sandnode demo [--keep]`: the tour of a fresh node (../demo.ts); exits 1 when a check failed.
 */
import type { Command } from 'commander';
import { runDemo } from '../demo';
import { dirsOf } from '../options';
import { EXIT_FAILURE, EXIT_OK, action } from '../output';

/** registerDemoCommand adds demo to program. */
export function registerDemoCommand(program: Command): void {
  program
    .command('demo')
    .description('the main job: a full tour on a fresh node (needs root): 3 sandboxes, files, streams, pause/resume, server kill -9 + adoption, live server and ublk-manager upgrades, fork, cleanup')
    .option('--keep', 'leave the stack running afterwards')
    .action(
      action(async (o: { keep?: boolean }, cmd: Command) => {
        const ok = await runDemo(dirsOf(cmd), { keep: !!o.keep });
        process.exitCode = ok ? EXIT_OK : EXIT_FAILURE;
      }),
    );
}
