/**
 * The wire checks as a section of the compat report (compat-tests/src/report.ts renders it),
 * and runWireCompat, the entry point main.ts calls.
 *
 * A build that lacks its descriptor set or generated modules is never passed over silently:
 * under CI=true the section fails naming the missing file; otherwise the section is "skipped"
 * with the reason (the builds that are complete are still checked, and a failure among them
 * still fails the section).
 */
import type { Build, ReportSection, RunContext } from '../types';
import { ciStrict, missingParts } from './build-paths';
import { checkWire } from './run';
import { UNKNOWN_ENUM_VALUE, type WireCompatResult } from './types';

function esc(s: string): string {
  return s.replace(/\|/g, '\\|').replace(/\n/g, ' ');
}

/** wireSection turns a result into a report section (fail when any message fails or any schema/codegen problem is found). */
export function wireSection(r: WireCompatResult, title = 'Wire compatibility'): ReportSection {
  const msgs = r.messages;
  const failed = msgs.filter((m) => m.result === 'fail');
  const mapEntries = msgs.filter((m) => m.mapEntry).length;
  const newInN = msgs.filter((m) => m.scope === 'new in N');
  const enumFieldsChecked = new Set(r.enums.map((e) => `${e.message}.${e.field}`));
  const enumTypes = new Set(r.enums.map((e) => e.enumType));
  const checks = msgs.reduce((a, m) => a + m.checks, 0);
  const n = r.builds[r.builds.length - 1]!;
  const pairs = r.builds.slice(0, -1).map((b) => `${b} <-> ${n}`);
  const result: ReportSection['result'] = failed.length || r.problems.length ? 'fail' : 'pass';
  const summary =
    `${msgs.length} messages (${mapEntries} map entries) over ${pairs.length ? pairs.join(', ') : `${n} alone`}: ` +
    `${msgs.length - failed.length} pass, ${failed.length} fail, ${newInN.length} new in N; ` +
    `${enumFieldsChecked.size} enum fields (${enumTypes.size} enums) decoded with value ${UNKNOWN_ENUM_VALUE}; ${checks} checks` +
    (r.problems.length ? `; ${r.problems.length} schema/codegen problems` : '');

  // how each reader surfaces an unknown enum value
  const byReader = new Map<string, Map<string, number>>();
  for (const e of r.enums) {
    const k = `decode: ${e.outcome === 'number' ? `kept as the number ${UNKNOWN_ENUM_VALUE}` : e.outcome}; re-encode: ${e.preservedOnReencode ? 'value preserved' : 'value lost'}; toJSON: ${e.json}`;
    const m = byReader.get(e.reader) ?? new Map<string, number>();
    m.set(k, (m.get(k) ?? 0) + 1);
    byReader.set(e.reader, m);
  }
  const md: string[] = [summary, ''];
  md.push(`Unknown enum values (every enum field set to ${UNKNOWN_ENUM_VALUE} by a writer, decoded by each reader):`, '');
  md.push('| reader | behaviour | fields |', '|---|---|---|');
  for (const [reader, m] of byReader) for (const [k, c] of m) md.push(`| ${esc(reader)} | ${esc(k)} | ${c} |`);
  md.push('');
  if (newInN.length) md.push(`New in N (checked against N alone): ${newInN.map((m) => `\`${m.message}\` (${m.result})`).join(', ')}`, '');
  else md.push('New in N: none (every message of N is in the older builds).', '');
  if (r.problems.length) {
    md.push('Schema / generated-code problems:', '');
    for (const p of r.problems) md.push(`- ${esc(p)}`);
    md.push('');
  }
  if (failed.length) {
    md.push('| message | scope | failure |', '|---|---|---|');
    for (const m of failed) for (const f of m.failures.slice(0, 10)) md.push(`| \`${m.message}\` | ${m.scope} | ${esc(f)} |`);
    md.push('');
  }
  const notes = msgs.flatMap((m) => m.notes.map((x) => `\`${m.message}\`: ${x}`));
  if (notes.length) {
    md.push('Notes:', '');
    for (const x of notes.slice(0, 30)) md.push(`- ${esc(x)}`);
    md.push('');
  }
  const rows = [
    ...failed.flatMap((m) => m.failures.map((f) => ({ message: m.message, scope: m.scope, result: 'fail', detail: f }))),
    ...newInN.filter((m) => m.result === 'pass').map((m) => ({ message: m.message, scope: m.scope, result: 'pass', detail: 'new in N: checked against N alone' })),
    ...r.problems.map((p) => ({ message: '-', scope: 'schema', result: 'fail', detail: p })),
  ];
  return { title, result, summary, rows, markdown: md.join('\n'), ms: r.ms };
}

/**
 * runWireCompat checks the wire compatibility of every build in ctx.order (oldest first)
 * against the newest (N). Never throws. A missing build part fails the section under CI=true
 * (env) and makes it "skipped" (with the reason) otherwise; an unexpected error fails it.
 */
export async function runWireCompat(ctx: RunContext, env: NodeJS.ProcessEnv = process.env): Promise<ReportSection> {
  const t0 = Date.now();
  const title = 'Wire compatibility';
  const labels = ctx.order.length ? ctx.order : Object.keys(ctx.builds);
  const builds: Build[] = [];
  const missing: string[] = [];
  for (const l of labels) {
    const b = ctx.builds[l];
    const miss = b ? missingParts(b) : [`no build labelled ${l}`];
    if (miss.length) missing.push(...miss);
    else builds.push(b!);
  }
  if (missing.length && ciStrict(env)) {
    return { title, result: 'fail', summary: `CI=true and the wire checks cannot run: ${missing.join('; ')}`, ms: Date.now() - t0 };
  }
  const n = builds[builds.length - 1];
  if (!n || n.label !== labels[labels.length - 1]) {
    return { title, result: 'skipped', summary: `skipped: N is not usable: ${missing.join('; ')}`, ms: Date.now() - t0 };
  }
  try {
    ctx.log(`wire: checking ${builds.map((b) => b.label).join(', ')}`);
    const section = wireSection(checkWire(builds), title);
    if (missing.length) {
      if (section.result === 'pass') section.result = 'skipped';
      section.summary = `${section.summary ?? ''}; skipped: ${missing.join('; ')}`;
      section.markdown = `Skipped builds: ${missing.join('; ')}\n\n${section.markdown ?? ''}`;
    }
    ctx.log(`wire: ${section.result}: ${section.summary}`);
    section.ms = Date.now() - t0;
    return section;
  } catch (err) {
    return { title, result: 'fail', summary: `wire tests failed to run: ${(err as Error).message}`, ms: Date.now() - t0 };
  }
}
