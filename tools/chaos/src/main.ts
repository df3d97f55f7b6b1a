#!/usr/bin/env node
/**
 * `npm run chaos -- --seed N --steps M [--out FILE]`: a chaos run of a whole node (run.ts). The
 * seed is printed first; the figures go to stdout and, as JSON, to FILE (default
 * bench/results/chaos.json); a failed run keeps the daemons' logs beside it (FILE-logs-seedN/).
 * Exit 0 when every invariant held, 1 at the first violation (its step, the actions so far and
 * what was violated are printed), 2 for bad arguments.
 */
import { Command, InvalidArgumentError } from 'commander';
import { DEFAULT_CONVERGE_MS, runChaos } from './run';
import { DEFAULT_REPORT_PATH, formatReport, writeReport } from './report';

function int(v: string): number {
  const n = Number(v);
  if (!Number.isInteger(n)) throw new InvalidArgumentError(`${v} is not an integer`);
  return n;
}

async function main(): Promise<void> {
  const program = new Command('chaos')
    .description('run a seeded chaos workload (creates, execs, forks, pauses, deletes, handovers, kill -9) against a fresh node and check its invariants after every step')
    .option('--seed <n>', 'PRNG seed (32-bit integer; default: from the clock)', int)
    .option('--steps <n>', 'number of actions', int, 60)
    .option('--out <file>', 'where the figures go as JSON', DEFAULT_REPORT_PATH)
    .option('--converge-ms <ms>', 'how long the node may take to converge after a fault', int, DEFAULT_CONVERGE_MS)
    .option('--quiet', 'print only the seed and the figures')
    .exitOverride((err) => process.exit(err.exitCode === 0 ? 0 : 2))
    .parse();
  const o = program.opts<{ seed?: number; steps: number; out: string; convergeMs: number; quiet?: boolean }>();
  const seed = o.seed ?? Date.now() % 0x7fffffff;
  process.stdout.write(`chaos: seed ${seed}, ${o.steps} steps\n`);
  const logsDir = `${o.out.replace(/\.json$/, '')}-logs-seed${seed}`;
  const r = await runChaos({ seed, steps: o.steps, convergeMs: o.convergeMs, logsDir, log: o.quiet ? undefined : (l) => process.stdout.write(`${l}\n`) });
  const file = writeReport(r, o.out);
  process.stdout.write(`${formatReport(r)}\n\nwritten to ${file}\n`);
  process.exit(r.ok ? 0 : 1);
}

main().catch((err: unknown) => {
  process.stderr.write(`chaos: ${(err as Error).stack ?? String(err)}\n`);
  process.exit(1);
});
