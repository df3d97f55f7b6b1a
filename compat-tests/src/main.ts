#!/usr/bin/env node
/**
 * sandnode-compat: runs the N/N-1 matrix and the upgrade/rollback runs and writes
 * `compat-tests/report/matrix.{md,json,html}`. Exit code 1 when any cell or run fails.
 *
 *   npm run compat -- [--quick] [--versions A,B] [--skip] [--no-containers] [--only wire|breaking]
 *
 *   --versions A,B   builds to compare, oldest first ("0.1.0,N"); default: the latest release and N
 *   --skip           also compare N-2 with N (when releases.json has an N-2)
 *   --quick          4 combinations and one upgrade+rollback run per pair
 *   --no-containers  do not run container mode (compat-tests/src/containers.ts) even if present
 *   --only wire      only the wire checks (no matrix cells, upgrade runs or container mode);
 *                    the report goes to compat-tests/report/only-wire/
 *   --only breaking  only `buf breaking` of N's contracts against the releases compared
 *                    (breaking.ts; report in compat-tests/report/only-breaking/)
 *   --swap-configs   (default) every daemon starts with a config file written by the other
 *                    build of the pair (node-config.ts): N reads N-1's, N-1 reads N's
 *   --own-configs    every daemon starts with a config file of its own build
 *   --no-configs     no config files (env only, as before 0.3.0's config slots)
 *
 * A mode module (containers, wire) that is missing or lacks its entry point is reported: a
 * failed section under CI=true, a skipped one with the reason otherwise; never dropped.
 */
import { existsSync, mkdtempSync, readdirSync, readlinkSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { assignments, runCell } from './matrix';
import type { ConfigMode } from './node-config';
import { ciStrict } from './wire/build-paths';
import { buildRelease, DEFAULT_CACHE_DIR, readReleases, REPO_ROOT, workingTreeBuild, type Release } from './releases';
import { writeReport } from './report';
import type { Build, CellResult, ReportSection, RunContext, UpgradeRun } from './types';
import { runUpgradeRun } from './upgrade-run';

/** Parsed command line. */
export interface CompatArgs {
  quick: boolean;
  versions?: string[];
  skip: boolean;
  containers: boolean;
  /** run only this part ("wire" or "breaking") */
  only?: 'wire' | 'breaking';
  /** whose config file each daemon starts with; undefined: none (--no-configs) */
  configs?: ConfigMode;
}

/** parseArgs reads the flags above; throws naming an unknown flag. */
export function parseArgs(argv: string[]): CompatArgs {
  const a: CompatArgs = { quick: false, skip: false, containers: true, configs: 'swapped' };
  for (let i = 0; i < argv.length; i++) {
    const x = argv[i]!;
    if (x === '--quick') a.quick = true;
    else if (x === '--skip') a.skip = true;
    else if (x === '--no-containers') a.containers = false;
    else if (x === '--swap-configs') a.configs = 'swapped';
    else if (x === '--own-configs') a.configs = 'own';
    else if (x === '--no-configs') a.configs = undefined;
    else if (x === '--only' || x.startsWith('--only=')) {
      const v = x.includes('=') ? x.slice(x.indexOf('=') + 1) : argv[++i];
      if (v !== 'wire' && v !== 'breaking') throw new Error(`--only: ${v ?? '(missing)'} is not a part that runs alone (known: wire, breaking)`);
      a.only = v;
    } else if (x === '--versions' || x.startsWith('--versions=')) {
      const v = x.includes('=') ? x.slice(x.indexOf('=') + 1) : argv[++i];
      if (!v) throw new Error('--versions needs a value like 0.1.0,N');
      a.versions = v
        .split(',')
        .map((s) => s.trim())
        .filter(Boolean);
    } else throw new Error(`unknown argument ${x} (known: --quick, --versions A,B, --skip, --no-containers, --swap-configs, --own-configs, --no-configs, --only wire|breaking)`);
  }
  return a;
}

/** buildInProgress says whether some process works inside dir now (a release build being made). */
function buildInProgress(dir: string): boolean {
  for (const p of readdirSync('/proc')) {
    if (!/^\d+$/.test(p)) continue;
    try {
      const cwd = readlinkSync(`/proc/${p}/cwd`);
      if (cwd === dir || cwd.startsWith(`${dir}/`)) return true;
    } catch {
      /* gone or not ours to read */
    }
  }
  return false;
}

/**
 * releaseBuild returns the build of r, waiting for a build in progress (another process
 * making it: its marker appears at the end) instead of removing it, else building it.
 */
export async function releaseBuild(r: Release, log: (l: string) => void): Promise<Build> {
  const dir = path.join(DEFAULT_CACHE_DIR, `${r.version}-${r.commit.slice(0, 12)}`);
  const marker = path.join(dir, '.sandnode-build.json');
  const deadline = Date.now() + 30 * 60_000;
  let said = false;
  while (existsSync(dir) && !existsSync(marker) && buildInProgress(dir) && Date.now() < deadline) {
    if (!said) log(`release ${r.version}: a build is in progress in ${dir}; waiting for its marker`);
    said = true;
    await new Promise((res) => setTimeout(res, 5000));
  }
  return buildRelease(r, { log });
}

/** resolveBuilds picks the builds and the pairs (older, newer) to compare. */
export async function resolveBuilds(args: CompatArgs, log: (l: string) => void): Promise<{ builds: Record<string, Build>; order: string[]; pairs: [string, string][] }> {
  const releases = readReleases();
  const n = workingTreeBuild();
  const builds: Record<string, Build> = {};
  const get = async (label: string): Promise<Build> => {
    if (builds[label]) return builds[label];
    if (label === 'N') return (builds.N = n);
    const r = releases.find((x) => x.version === label);
    if (!r) throw new Error(`--versions: ${label} is neither N nor a release in releases.json (${releases.map((x) => x.version).join(', ')})`);
    return (builds[label] = await releaseBuild(r, log));
  };
  let order: string[];
  if (args.versions) {
    if (args.versions.length < 2) throw new Error('--versions needs two builds, oldest first (e.g. 0.1.0,N)');
    order = args.versions;
  } else {
    const latest = releases[releases.length - 1];
    if (!latest) throw new Error('releases.json lists no release');
    order = [latest.version, 'N'];
  }
  for (const l of order) await get(l);
  const pairs: [string, string][] = [];
  for (let i = 0; i + 1 < order.length; i++) pairs.push([order[i]!, order[i + 1]!]);
  if (args.skip) {
    const nm2 = releases[releases.length - 2];
    if (!nm2) log('--skip: releases.json has no N-2 release; skipped');
    else {
      await get(nm2.version);
      order.unshift(nm2.version);
      pairs.push([nm2.version, order[order.length - 1]!]);
    }
  }
  return { builds, order, pairs };
}

/**
 * optionalHook loads `./<mod>` and calls its fn(ctx), returning its report section(s). A
 * missing module or export is a section naming it: "fail" under CI=true, else "skipped".
 */
export async function optionalHook(mod: string, fn: string, ctx: RunContext, env: NodeJS.ProcessEnv = process.env, dir = __dirname): Promise<ReportSection[]> {
  const t0 = Date.now();
  const file = path.join(dir, `${mod}.js`);
  const absent = (why: string): ReportSection[] => [
    { title: `${mod}.${fn}`, result: ciStrict(env) ? 'fail' : 'skipped', summary: `${why}${ciStrict(env) ? ' (CI=true: a missing mode fails)' : ''}`, ms: Date.now() - t0 },
  ];
  if (!existsSync(file)) return absent(`${file} is missing (run npm run build)`);
  let m: Record<string, unknown>;
  try {
    m = require(file) as Record<string, unknown>;
  } catch (err) {
    return [{ title: `${mod}.${fn}`, result: 'fail', summary: `loading ${file} failed: ${(err as Error).message}`, ms: Date.now() - t0 }];
  }
  const f = m[fn];
  if (typeof f !== 'function') return absent(`${file} exports no function ${fn}`);
  try {
    const r = (await (f as (c: RunContext) => Promise<ReportSection | ReportSection[]>)(ctx)) ?? [];
    return Array.isArray(r) ? r : [r];
  } catch (err) {
    return [{ title: `${mod}.${fn}`, result: 'fail', summary: (err as Error).stack ?? String(err), ms: Date.now() - t0 }];
  }
}

/** main runs everything and returns the exit code. */
export async function main(argv: string[]): Promise<number> {
  const t0 = Date.now();
  const log = (l: string) => process.stdout.write(`${l}\n`);
  const args = parseArgs(argv);
  const { builds, order, pairs } = await resolveBuilds(args, log);
  const n = builds.N ?? workingTreeBuild();
  log(`builds: ${order.map((l) => `${l} (${builds[l]!.commit.slice(0, 12)}, ${builds[l]!.dir})`).join('; ')}`);
  const cells: CellResult[] = [];
  const upgrades: UpgradeRun[] = [];
  const runStart = Date.now();
  for (const [older, newer] of args.only ? [] : pairs) {
    const list = assignments(older, newer, args.quick);
    log(`matrix ${older} x ${newer}: ${list.length} combinations`);
    const pair = [builds[older]!, builds[newer]!] as const;
    for (const a of list) cells.push(await runCell(a, builds, n, log, args.configs ? { mode: args.configs, pair } : undefined));
    log(`upgrade and rollback run ${older} -> ${newer} -> ${older}${args.configs ? ` (${args.configs} configs)` : ''}`);
    const u = await runUpgradeRun(pair[0], pair[1], n, log, args.configs);
    log(`run ${older} -> ${newer}: ${u.result} (${u.ms} ms)`);
    upgrades.push(u);
  }
  const processMs = Date.now() - runStart;
  const sections: ReportSection[] = [];
  const work = mkdtempSync(path.join(os.tmpdir(), 'sandnode-compat-hooks-'));
  try {
    const ctx: RunContext = { builds, order, quick: args.quick, workDir: work, log };
    if (args.containers && !args.only) sections.push(...(await optionalHook('containers', 'runContainerMode', ctx)));
    if (args.only !== 'breaking') sections.push(...(await optionalHook('wire', 'runWireCompat', ctx)));
    if (args.only !== 'wire') sections.push(...(await optionalHook('breaking', 'runBufBreaking', ctx)));
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
  const wallMs = Date.now() - t0;
  const meta = [
    `mode: ${args.only ? `only ${args.only}` : args.quick ? 'quick' : 'full'}; configs: ${args.configs ?? 'none'}; builds ${order.map((l) => `${l} = ${builds[l]!.version}@${builds[l]!.commit.slice(0, 12)}`).join(', ')}`,
    `process mode: ${cells.length} cells + ${upgrades.length} upgrade run(s) in ${(processMs / 1000).toFixed(1)} s`,
    `generated ${new Date().toISOString()} on ${os.hostname()} (${os.cpus().length} cores)`,
  ];
  const files = writeReport(path.join(REPO_ROOT, 'compat-tests', 'report', ...(args.only ? [`only-${args.only}`] : [])), { cells, upgrades, wallMs }, sections, meta);
  const failedCells = cells.filter((c) => c.result === 'fail').length;
  const failedRuns = upgrades.filter((u) => u.result === 'fail').length;
  const failedSections = sections.filter((s) => s.result === 'fail').length;
  log(
    `\n${cells.length - failedCells}/${cells.length} cells pass, ${upgrades.length - failedRuns}/${upgrades.length} upgrade runs pass${sections.length ? `, ${failedSections} failed section(s)` : ''}`,
  );
  log(`wall time ${(wallMs / 1000).toFixed(1)} s; report: ${files.join(' ')}`);
  return failedCells || failedRuns || failedSections ? 1 : 0;
}

if (require.main === module) {
  main(process.argv.slice(2)).then(
    (code) => process.exit(code),
    (err: unknown) => {
      process.stderr.write(`sandnode-compat: ${(err as Error).stack ?? String(err)}\n`);
      process.exit(2);
    },
  );
}
