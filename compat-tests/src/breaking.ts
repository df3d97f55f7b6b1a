/**
 * `buf breaking` (the FILE rules of buf.yaml) of the working tree's contracts against every
 * release the run compares with (N-1, and N-2 with --skip): a field, message, RPC or enum value
 * removed, renumbered or retyped since that release fails the section, naming buf's findings.
 * Entry point `runBufBreaking(ctx)` (main.ts; `npm run compat -- --only breaking`, or
 * `npm run breaking -w @sandnode/compat-tests`).
 */
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { REPO_ROOT } from './releases';
import type { ReportSection, RunContext } from './types';

/** What one comparison found. */
export interface BreakingResult {
  against: string;
  commit: string;
  /** buf's exit code (0: clean) */
  status: number;
  /** buf's findings, one per line ("file:line:col:what") */
  findings: string[];
  ms: number;
}

/** bufBinary is the repository's buf (the @bufbuild/buf devDependency). Throws naming the path when it is missing. */
export function bufBinary(root = REPO_ROOT): string {
  const bin = path.join(root, 'node_modules', '.bin', 'buf');
  if (!existsSync(bin)) throw new Error(`${bin} is missing: run npm install`);
  return bin;
}

/**
 * bufBreaking runs `buf breaking --against <git>#ref=<commit>` in root (a checkout with buf.yaml
 * and proto/; default the working tree, git its .git). Returns buf's findings; throws when buf
 * cannot run at all.
 */
export function bufBreaking(against: string, commit: string, root = REPO_ROOT, git = path.join(REPO_ROOT, '.git')): BreakingResult {
  const t0 = Date.now();
  const r = spawnSync(bufBinary(), ['breaking', '--against', `${git}#ref=${commit}`], { cwd: root, encoding: 'utf8', timeout: 120_000 });
  if (r.error) throw r.error;
  const findings = `${r.stdout}\n${r.stderr}`
    .split('\n')
    .map((l) => l.trim())
    .filter(Boolean);
  return { against, commit, status: r.status ?? -1, findings, ms: Date.now() - t0 };
}

/** runBufBreaking checks N's contracts against each older build of ctx.order; one section. */
export async function runBufBreaking(ctx: RunContext): Promise<ReportSection> {
  const t0 = Date.now();
  const rows: Array<Record<string, string>> = [];
  let failed = false;
  for (const label of ctx.order.filter((l) => l !== 'N')) {
    const b = ctx.builds[label];
    if (!b) continue;
    const r = bufBreaking(label, b.commit);
    const clean = r.status === 0 && r.findings.length === 0;
    if (!clean) failed = true;
    rows.push({ against: `${label} (${b.commit.slice(0, 12)})`, result: clean ? 'pass' : 'fail', findings: clean ? 'none' : r.findings.join('; ').slice(0, 2000), ms: String(r.ms) });
    ctx.log(`buf breaking against ${label}: ${clean ? 'clean' : `${r.findings.length} finding(s), exit ${r.status}`}`);
  }
  return {
    title: 'buf breaking (FILE)',
    result: failed ? 'fail' : 'pass',
    summary: `N's proto/ against ${rows.map((x) => x.against).join(', ') || 'no release'}: ${failed ? 'breaking changes found' : 'clean'}`,
    rows,
    ms: Date.now() - t0,
  };
}
