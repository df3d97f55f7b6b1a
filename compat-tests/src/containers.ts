/**
 * Container mode of the compat tests: the upgrade run of process mode with each component in
 * its own container, laid out like the Kubernetes pod of deploy/k8s/base, on testcontainers.
 *
 *   containers/pod-layout.ts   the manifests -> container specs (the translation; pure)
 *   containers/images.ts       a build's image, made locally FROM scratch (fingerprint cache)
 *   containers/host.ts         the pod's host dirs and shared mount; cleanup of the host
 *   containers/pod.ts          the pod on testcontainers (start, exec, logs, stop, wait)
 *   containers/engine.ts       the engine client and what keeps the mode from running
 *   containers/run.ts          the upgrade/rollback run's steps
 *
 * This file is the entry point main.ts calls (`runContainerMode(ctx)`).
 */
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import path from 'node:path';
import type { ReportSection, RunContext, UpgradeRun } from './types';
import { ciStrict } from './wire/build-paths';
import { containerModeMissing } from './containers/engine';
import { cleanupPodHost, preparePodHost } from './containers/host';
import { ensureImage, stageTools } from './containers/images';
import { loadPodLayout, RUN_LABEL, type PodHost, type PodLayout } from './containers/pod-layout';
import { privilegeOf, removeContainers } from './containers/pod';
import { runContainerUpgrade } from './containers/run';

export { containerModeMissing } from './containers/engine';

/**
 * runContainerMode runs the container upgrade run N-1 -> N -> N-1 (ctx.order: the last two
 * labels). When the machine lacks a prerequisite (a Docker engine, root) the section is
 * "skipped" naming it, or "fail" under CI=true (.ci/run provides both). Leaves no container,
 * mount, loop device or dir behind (images are kept as the cache). env: the environment the
 * mode runs in (CI, and the PATH that finds `docker`).
 */
export async function runContainerMode(ctx: RunContext, env: NodeJS.ProcessEnv = process.env): Promise<ReportSection> {
  const t0 = Date.now();
  const title = 'Container mode';
  const missing = containerModeMissing(ctx.log, env);
  if (missing.length) {
    const ci = ciStrict(env);
    return { title, result: ci ? 'fail' : 'skipped', summary: `${ci ? 'missing under CI=true' : 'skipped: missing'}: ${missing.join('; ')}`, ms: Date.now() - t0 };
  }
  const labels = ctx.order.slice(-2);
  const old = ctx.builds[labels[0] ?? ''];
  const neu = ctx.builds[labels[1] ?? ''];
  if (!old || !neu || labels.length < 2) return { title, result: 'fail', summary: `need two builds (N-1, N) in ctx.order, got ${JSON.stringify(ctx.order)}`, ms: Date.now() - t0 };
  const rows: Array<Record<string, string>> = [];
  let layout: PodLayout;
  try {
    layout = loadPodLayout();
  } catch (err) {
    return { title, result: 'fail', summary: `cannot read the manifest: ${(err as Error).message}`, ms: Date.now() - t0 };
  }
  const work = mkdtempSync(path.join(ctx.workDir, 'containers-'));
  let host: PodHost | undefined;
  let run: UpgradeRun | undefined;
  const notes: string[] = [];
  const sandboxIds: string[] = [];
  try {
    const tools = path.join(work, 'tools');
    mkdirSync(tools);
    let t1 = Date.now();
    const toolsFp = stageTools(tools);
    rows.push({ step: 'stage tools (node, runc, busybox, util-linux, e2fsprogs + libs)', ms: String(Date.now() - t1), detail: tools });
    const images = { old: '', new: '' };
    for (const [k, b] of [
      ['old', old],
      ['new', neu],
    ] as const) {
      const r = await ensureImage(b, tools, toolsFp);
      images[k] = r.image;
      rows.push({ step: `image ${r.image}`, ms: String(r.ms), detail: r.built ? 'built (imported through the engine API)' : 'cached (fingerprint matches)' });
      ctx.log(`container mode: image ${r.image} ${r.built ? 'built' : 'cached'} in ${r.ms} ms`);
    }
    t1 = Date.now();
    host = await preparePodHost(layout, work);
    rows.push({
      step: 'pod host dirs',
      ms: String(Date.now() - t1),
      detail: `hostPath remapped: ${
        Object.entries(host.remapped)
          .map(([a, b]) => `${a} -> ${b}`)
          .join(', ') || 'none'
      }`,
    });
    t1 = Date.now();
    const privilege = await privilegeOf(images.old, host);
    rows.push({ step: 'privileged containers', ms: String(Date.now() - t1), detail: privilege.note });
    run = await runContainerUpgrade(ctx, layout, host, old, neu, images, privilege, sandboxIds);
  } catch (err) {
    notes.push(`error: ${(err as Error).message}`);
  } finally {
    const t1 = Date.now();
    const removed = host ? await removeContainers(`${RUN_LABEL}=${host.runId}`).catch((err: unknown) => (notes.push(`remove containers: ${(err as Error).message}`), [])) : [];
    const cleaned = host ? await cleanupPodHost(host, sandboxIds) : [];
    rmSync(work, { recursive: true, force: true });
    rows.push({ step: 'cleanup', ms: String(Date.now() - t1), detail: [`${removed.length} containers removed (label ${RUN_LABEL}=${host?.runId ?? ''})`, ...cleaned].join('; ') });
  }
  const result = run?.result === 'pass' && !notes.length ? 'pass' : 'fail';
  const failed = run?.steps.filter((s) => s.result === 'fail').map((s) => s.name) ?? [];
  const md = [
    '| step | result | ms | timings | detail |',
    '|---|---|---|---|---|',
    ...(run?.steps ?? []).map(
      (s) =>
        `| ${s.name} | ${s.result} | ${s.ms} | ${Object.entries(s.timings ?? {})
          .map(([k, v]) => `${k}=${v}`)
          .join(' ')} | ${(s.detail ?? '').replace(/\|/g, '\\|').replace(/\n/g, ' ')} |`,
    ),
  ].join('\n');
  return {
    title,
    result,
    summary: `${old.label} -> ${neu.label} -> ${old.label} in containers laid out by deploy/k8s/base: ${result}${failed.length ? ` (failed: ${failed.join(', ')})` : ''}${notes.length ? `; ${notes.join('; ')}` : ''}`,
    upgrades: run ? [run] : [],
    rows,
    markdown: md,
    ms: Date.now() - t0,
  };
}
