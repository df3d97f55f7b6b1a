/** The chaos run's figures as a table and as JSON (bench/results/chaos.json by default). */
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { table } from '@sandnode/node-stack';
import type { ChaosReport } from './run';

/** `<repo>/bench/results/chaos.json`, where `npm run chaos` writes its figures unless told otherwise. */
export const DEFAULT_REPORT_PATH = path.resolve(__dirname, '..', '..', '..', 'bench', 'results', 'chaos.json');

/** writeReport writes r as pretty JSON to file (its dir made when missing); returns the absolute path. */
export function writeReport(r: ChaosReport, file = DEFAULT_REPORT_PATH): string {
  const out = path.resolve(file);
  mkdirSync(path.dirname(out), { recursive: true });
  writeFileSync(out, `${JSON.stringify({ date: new Date().toISOString(), ...r }, null, 2)}\n`);
  return out;
}

/** formatReport is the figures of r as a table (and, for a failed run, the failure with the actions so far). */
export function formatReport(r: ChaosReport): string {
  const kv = (o: Record<string, number>) =>
    Object.entries(o)
      .map(([k, v]) => `${k} ${v}`)
      .join(', ') || 'none';
  const rows: (string | number)[][] = [
    ['seed', r.seed],
    ['steps run / planned', `${r.stepsRun} / ${r.steps}`],
    ['actions', kv(r.actions)],
    ['kills (kill -9)', kv(r.kills)],
    ['server handovers ok / failed', `${r.handovers.server.ok} / ${r.handovers.server.failed}`],
    ['ublk-manager handovers ok / failed', `${r.handovers.ublk.ok} / ${r.handovers.ublk.failed}`],
    ['handover failpoints armed / fired', `${r.failpoints.armed} / ${r.failpoints.fired}${r.failpoints.notFired.length ? ` (not fired: ${r.failpoints.notFired.join(', ')})` : ''}`],
    ['invariant checks (transient violations)', `${r.invariantChecks} (${r.transientViolations})`],
    ['convergence after a fault p50 / max', `${r.convergeMs.p50} / ${r.convergeMs.max} ms over ${r.convergeMs.faults} faults (bound ${r.convergeMs.boundMs} ms)`],
    ['the client answered again after a fault p50 / max', `${r.clientBackMs.p50} / ${r.clientBackMs.max} ms`],
    ['calls ok / total', `${r.calls.ok} / ${r.calls.total}`],
    ['calls failed by code', kv(r.calls.failedByCode)],
    ['exec streams ok / failed, bytes', `${r.streams.ok} / ${r.streams.failed}, ${r.streams.bytes}`],
    ['forks ABORTED twice (freeze window)', r.forksAborted],
    ['duration', `${Math.round(r.durationMs / 1000)} s`],
    ['result', r.ok ? 'PASS' : 'FAIL'],
  ];
  const out = [table(['CHAOS', 'VALUE'], rows)];
  if (r.failure) {
    out.push(`\nFAILED at step ${r.failure.step}: ${r.failure.action}`, 'violated:', ...r.failure.violations.map((v) => `  - ${v}`), 'actions so far:', ...r.failure.actions.map((a) => `  ${a}`));
    if (r.failure.logs) out.push(`the daemons' logs: ${r.failure.logs}`);
    out.push(`reproduce: npm run chaos -- --seed ${r.seed} --steps ${r.failure.step}`);
  }
  return out.join('\n');
}
