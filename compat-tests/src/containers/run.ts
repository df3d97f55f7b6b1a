/**
 * The upgrade/rollback run of the container mode, the process mode's run with each component
 * in its own container of the pod: all at N-1 (vmm, ublk-a, server-a) with 3 sandboxes ->
 * ublk-manager and server to N in the b slots (an exec stream across the server handover) ->
 * checks -> back to N-1 in the a slots (another stream) -> checks -> delete. Each step is the
 * README rollout command run inside the standby slot's container, with the documented
 * fallback when a build's CLI or daemon cannot do it.
 */
import { randomBytes } from 'node:crypto';
import { mkdirSync, readFileSync, renameSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { createSandnodeChannel, createServiceClient, hasFeature, SERVER_FEATURES, UBLK_FEATURES } from '@sandnode/shared';
import { DeviceServiceDefinition, HandoverResult } from '@sandnode/shared/proto/ublk/v1/ublk';
import { cliMainRel, templateBuilderModule } from '../layout';
import { connectApi, versionAt, type ServerApi } from '../node';
import { execCollect, getSandbox, grpcStatusOf, stateName } from '../scenarios';
import type { Build, RunContext, UpgradeRun, UpgradeStep } from '../types';
import { Pod } from './pod';
import { hostDirOf, type PodHost, type PodLayout, type Privilege } from './pod-layout';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** buildTemplateOnHost builds a template with build b's own template builder into stateDir/templates. */
async function buildTemplateOnHost(stateDir: string, name: string, b: Build): Promise<void> {
  const builder = require(templateBuilderModule(b.dir)) as {
    buildTemplate(o: { name: string; templatesDir: string; poddBundlePath: string; poddVersion: string }): Promise<unknown>;
  };
  await builder.buildTemplate({ name, templatesDir: path.join(stateDir, 'templates'), poddBundlePath: path.join(b.dir, 'services', 'podd', 'dist', 'podd.bundle.js'), poddVersion: b.version });
}

interface Sb {
  id: string;
  pid: number;
  marker: string;
}

/** A long exec stream that runs across a handover until /workspace/<stopFile> exists. */
interface LiveStream {
  stopFile: string;
  lines: string[];
  done: Promise<{ exitCode: number; stdout: string; error?: string }>;
}

function startStream(api: ServerApi, sandboxId: string, stopFile: string): LiveStream {
  const lines: string[] = [];
  const script = `i=0; while [ ! -e /workspace/${stopFile} ]; do i=$((i+1)); echo "tick $i"; sleep 0.1; done; echo done; exit 0`;
  const done = execCollect(api, sandboxId, ['sh', '-c', script], (s) => lines.push(s)).then(
    (r) => ({ exitCode: r.exitCode, stdout: r.stdout }),
    (err: unknown) => ({ exitCode: -1, stdout: lines.join(''), error: `${grpcStatusOf(err) ?? ''} ${(err as Error).message}` }),
  );
  return { stopFile, lines, done };
}

/** streamEnd waits for the stream's end, at most ms (then an error result; the timer never outlives the wait). */
async function streamEnd(s: LiveStream, ms: number): Promise<{ exitCode: number; stdout: string; error?: string }> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<{ exitCode: number; stdout: string; error: string }>(
    (res) => (timer = setTimeout(() => res({ exitCode: -1, stdout: s.lines.join(''), error: `no end within ${ms / 1000} s` }), ms)),
  );
  try {
    return await Promise.race([s.done, late]);
  } finally {
    clearTimeout(timer);
  }
}

/** checkStream says whether the stream ended cleanly with every tick in order; throws otherwise. */
function checkStream(r: { exitCode: number; stdout: string; error?: string }): string {
  if (r.error) throw new Error(`exec stream broke: ${r.error} (after ${r.stdout.split('\n').length} lines)`);
  const ls = r.stdout.trimEnd().split('\n');
  if (ls.pop() !== 'done' || r.exitCode !== 0) throw new Error(`exec stream ended without "done"/exit 0 (exit ${r.exitCode}, last ${JSON.stringify(ls.slice(-2))})`);
  ls.forEach((l, i) => {
    if (l !== `tick ${i + 1}`) throw new Error(`exec stream: line ${i + 1} is ${JSON.stringify(l)}`);
  });
  return `${ls.length} ticks in order, "done", exit 0`;
}

/** State shared by the steps of one container run. */
interface RunState {
  pod: Pod;
  runDir: string;
  stateDir: string;
  api: ServerApi;
  sbs: Sb[];
  vmmPid: number;
  builds: { old: Build; new: Build };
  images: { old: string; new: string };
}

/** A step that does not apply (a documented fallback): reported n/a with the reason. */
class NotApplicable extends Error {}

async function step(
  steps: UpgradeStep[],
  log: (l: string) => void,
  s: Omit<UpgradeStep, 'result' | 'ms'>,
  fn: () => Promise<{ detail?: string; timings?: Record<string, number> } | void>,
): Promise<boolean> {
  const t0 = Date.now();
  try {
    const r = (await fn()) ?? {};
    steps.push({ ...s, result: 'pass', ms: Date.now() - t0, ...(r.detail ? { detail: r.detail } : {}), ...(r.timings ? { timings: r.timings } : {}) });
    log(`container mode: ${s.name}: pass (${Date.now() - t0} ms)${r.detail ? ` ${r.detail}` : ''}`);
    return true;
  } catch (err) {
    if (err instanceof NotApplicable) {
      steps.push({ ...s, result: 'n/a', ms: Date.now() - t0, detail: err.message });
      log(`container mode: ${s.name}: n/a (${err.message})`);
      return true;
    }
    const e = err as Error & { logExcerpt?: string };
    steps.push({ ...s, result: 'fail', ms: Date.now() - t0, detail: e.message.slice(0, 3000), ...(e.logExcerpt ? { logExcerpt: e.logExcerpt } : {}) });
    log(`container mode: ${s.name}: FAIL (${Date.now() - t0} ms) ${e.message}`);
    return false;
  }
}

/** check: every sandbox keeps its pid and runs; exec works; pause/resume of one; versions as expected; vmm untouched. */
async function checkNode(st: RunState, server: Build, ublk: Build): Promise<string> {
  const notes: string[] = [];
  const sv = await versionAt(`unix://${path.join(st.runDir, 'server.sock')}`);
  if (sv.version !== server.version || sv.commit !== server.commit)
    throw new Error(`server answers ${sv.version}@${sv.commit.slice(0, 12)}, expected ${server.label} ${server.version}@${server.commit.slice(0, 12)}`);
  const uv = await versionAt(`unix://${path.join(st.runDir, 'ublk-manager.sock')}`);
  if (uv.version !== ublk.version || uv.commit !== ublk.commit)
    throw new Error(`ublk-manager answers ${uv.version}@${uv.commit.slice(0, 12)}, expected ${ublk.label} ${ublk.version}@${ublk.commit.slice(0, 12)}`);
  const vv = await versionAt(`unix://${path.join(st.runDir, 'vmm-supervisor.sock')}`);
  if (vv.pid !== st.vmmPid) throw new Error(`vmm-supervisor pid ${vv.pid}, was ${st.vmmPid}: it restarted`);
  notes.push(`server ${server.label} (pid ${sv.pid}), ublk-manager ${ublk.label} (pid ${uv.pid}), vmm-supervisor pid ${vv.pid} unchanged`);
  for (const s of st.sbs) {
    const g = await getSandbox(st.api, s.id);
    if (g.pid !== s.pid || stateName(g.state) !== 'RUNNING') throw new Error(`${s.id}: ${stateName(g.state)} pid ${g.pid}, was RUNNING pid ${s.pid}`);
    const r = await execCollect(st.api, s.id, ['cat', `/workspace/marker`]);
    if (r.exitCode !== 0 || r.stdout !== s.marker) throw new Error(`${s.id}: exec cat /workspace/marker gave exit ${r.exitCode} ${JSON.stringify(r.stdout)} (wrote ${s.marker})`);
  }
  const s0 = st.sbs[0]!;
  await st.api.sandboxes.pauseSandbox({ sandboxId: s0.id });
  const paused = await getSandbox(st.api, s0.id);
  const resumed = (await st.api.sandboxes.resumeSandbox({ sandboxId: s0.id })).sandbox;
  if (stateName(paused.state) !== 'PAUSED' || resumed?.pid !== s0.pid) throw new Error(`${s0.id}: pause/resume gave ${stateName(paused.state)} then pid ${resumed?.pid} (was ${s0.pid})`);
  notes.push(`${st.sbs.length} sandboxes RUNNING with the same pids, exec reads their data, pause/resume ok`);
  return notes.join('; ');
}

/**
 * upgradeServerIn: the README rollout for the server, in the standby slot's container `to`
 * (already running the target image): `sandnode upgrade server --from-build /app` there.
 */
async function upgradeServerIn(st: RunState, to: string, b: Build): Promise<{ detail: string; timings: Record<string, number> }> {
  // The standby daemon of the `to` container takes over when it has "server.takeover.v1"
  // (`upgrade server --standby`); an older one cannot be asked, so the CLI of its image starts
  // a server from its build that takes over (`--from-build /app`), as that release documents.
  const slot = to.replace(/^server-/, '');
  const standby = await versionAt(`unix://${path.join(st.runDir, `server-${slot}-admin.sock`)}`).catch(() => undefined);
  const viaStandby = !!standby && hasFeature(standby, SERVER_FEATURES.takeover);
  const args = viaStandby ? ['upgrade', 'server', '--standby', '--json'] : ['upgrade', 'server', '--from-build', '/app', '--json'];
  const r = await st.pod.exec(to, ['node', `/app/${cliMainRel(b.dir)}`, ...args]);
  if (r.status !== 0) throw Object.assign(new Error(`sandnode upgrade server in ${to} exited ${r.status}: ${(r.stderr || r.stdout).trim().slice(-1500)}`), { logExcerpt: await st.pod.logs(to) });
  const t = JSON.parse(r.stdout) as {
    oldPid: number;
    newPid: number;
    oldVersion: string;
    newVersion: string;
    holdWindowMs: number;
    adopted: number;
    adoptionMs: number;
    epoch: number;
    listeners: string[];
  };
  st.api.close();
  st.api = connectApi(`unix://${path.join(st.runDir, 'server.sock')}`);
  return {
    detail: `in ${to} (${viaStandby ? 'its standby took over: --standby' : 'a server from its build took over: --from-build /app'}): ${t.oldVersion} pid ${t.oldPid} -> ${t.newVersion} pid ${t.newPid}, epoch ${t.epoch}, ${t.adopted} adopted, listeners ${t.listeners.join(' ')}`,
    timings: { cliMs: r.ms, holdMs: t.holdWindowMs, adoptionMs: t.adoptionMs },
  };
}

/**
 * upgradeUblkIn: the README rollout for ublk-manager in the standby slot's container `to`.
 * First the README command (`sandnode upgrade ublk-manager --from-build /app` in `to`); when
 * it cannot run there (its new process needs the slot that the container's own daemon holds),
 * the equivalent: HandoverAll on the container's daemon from the old slot (with the node's
 * epoch), SIGTERM of the old slot's container, active-slot record and the stable link.
 */
async function upgradeUblkIn(st: RunState, from: string, to: string, slot: 'a' | 'b', b: Build): Promise<{ detail: string; timings: Record<string, number> }> {
  const notes: string[] = [];
  const timings: Record<string, number> = {};
  // The README rollout: the standby slot's own daemon takes the devices (`--standby`, a CLI of
  // this release); an older CLI only knows `--from-build`, which cannot run beside that daemon.
  let cli = await st.pod.exec(to, ['node', `/app/${cliMainRel(b.dir)}`, 'upgrade', 'ublk-manager', '--standby', '--json']);
  if (cli.status !== 0 && /unknown option '--standby'/.test(cli.stderr)) {
    cli = await st.pod.exec(to, ['node', `/app/${cliMainRel(b.dir)}`, 'upgrade', 'ublk-manager', '--from-build', '/app', '--json']);
  }
  timings.cliMs = cli.ms;
  if (cli.status === 0) {
    const r = JSON.parse(cli.stdout) as { oldPid: number; newPid: number; devices: unknown[]; stallP99Ms: number; totalMs: number };
    notes.push(`README command worked in ${to}: ${r.devices.length} devices moved, pid ${r.oldPid} -> ${r.newPid}`);
    timings.maxStallMs = r.stallP99Ms;
    timings.totalMs = r.totalMs;
    return { detail: notes.join('; '), timings };
  }
  notes.push(`README command in ${to} failed (exit ${cli.status}: ${(cli.stderr || cli.stdout).trim().split('\n').slice(-1)[0]?.slice(0, 300)}); equivalent HandoverAll to the container's own daemon`);
  const lease = JSON.parse(readFileSync(path.join(st.stateDir, 'server.lease'), 'utf8').trim().split('\n').pop() || '{}') as { epoch?: number };
  const epoch = lease.epoch ?? 0;
  const newAddr = `unix://${path.join(st.runDir, `ublk-manager-${slot}.sock`)}`;
  const oldSlot = slot === 'a' ? 'b' : 'a';
  const oldV = await versionAt(`unix://${path.join(st.runDir, `ublk-manager-${oldSlot}.sock`)}`);
  const t0 = Date.now();
  const ch = createSandnodeChannel(newAddr);
  let res;
  try {
    // the old slot's address as the new slot's container sees it
    res = await createServiceClient(DeviceServiceDefinition, ch, { timeoutMs: 120_000, epoch: () => epoch }).handoverAll({
      fromAddress: `unix:///run/sandnode/ublk-manager-${oldSlot}.sock`,
      deviceIds: [],
      perDeviceTimeoutMs: 0,
    });
  } finally {
    ch.close();
  }
  timings.handoverMs = Date.now() - t0;
  const bad = res.devices.filter((d) => d.result !== HandoverResult.HANDOVER_RESULT_MOVED);
  if (bad.length) throw new Error(`${notes.join('; ')}; HandoverAll: ${bad.map((d) => `${d.deviceId} ${HandoverResult[d.result]} ${d.error}`).join('; ')}`);
  timings.maxStallMs = Math.max(0, ...res.devices.map((d) => d.stallMs));
  const t1 = Date.now();
  await st.pod.stop(from);
  timings.stopOldMs = Date.now() - t1;
  mkdirSync(path.join(st.stateDir, 'ublk-manager'), { recursive: true });
  writeFileSync(path.join(st.stateDir, 'ublk-manager', 'active-slot'), `${slot}\n`);
  const link = path.join(st.runDir, 'ublk-manager.sock');
  rmSync(`${link}.tmp`, { force: true });
  symlinkSync(`ublk-manager-${slot}.sock`, `${link}.tmp`);
  renameSync(`${link}.tmp`, link);
  notes.push(`${res.devices.length} devices moved ${oldSlot} (pid ${oldV.pid}) -> ${slot} (${res.mode}), container ${from} stopped, ublk-manager.sock -> ublk-manager-${slot}.sock`);
  return { detail: notes.join('; '), timings };
}

/**
 * runContainerUpgrade runs the run of the file comment on a fresh pod (host: its dirs,
 * images: the N-1 and N image names, privilege: how this engine runs privileged containers).
 * Ids of the sandboxes it creates are pushed to sandboxIds (for cleanup). Returns the run with
 * one step per stage; result "pass" when no step failed. Leaves the containers to the caller.
 */
export async function runContainerUpgrade(
  ctx: RunContext,
  layout: PodLayout,
  host: PodHost,
  old: Build,
  neu: Build,
  images: { old: string; new: string },
  privilege: Privilege,
  sandboxIds: string[],
): Promise<UpgradeRun> {
  const t0 = Date.now();
  const steps: UpgradeStep[] = [];
  const log = ctx.log;
  const pod = new Pod(layout, host, privilege);
  const runDir = hostDirOf(layout, host, 'vmm', '/run/sandnode');
  const stateDir = hostDirOf(layout, host, 'vmm', '/var/lib/sandnode');
  const st: RunState = { pod, runDir, stateDir, api: connectApi(`unix://${path.join(runDir, 'server.sock')}`), sbs: [], vmmPid: 0, builds: { old, new: neu }, images };
  const run: UpgradeRun = { component: 'all', from: old.label, to: neu.label, result: 'fail', steps };
  const ok = async (s: Omit<UpgradeStep, 'result' | 'ms'>, fn: () => Promise<{ detail?: string; timings?: Record<string, number> } | void>) => step(steps, log, s, fn);
  let stream: LiveStream | undefined;
  try {
    const tmpl = `compat-${old.label.toLowerCase().replace(/[^a-z0-9]/g, '-')}`;
    if (
      !(await ok({ name: `start pod at ${old.label} (vmm, ublk-a, server-a)` }, async () => {
        const t1 = Date.now();
        await buildTemplateOnHost(stateDir, tmpl, old);
        const timings: Record<string, number> = { templateMs: Date.now() - t1 };
        for (const c of ['vmm', 'ublk-a', 'server-a']) timings[`${c}ReadyMs`] = await pod.start(c, images.old);
        st.vmmPid = (await versionAt(`unix://${path.join(runDir, 'vmm-supervisor.sock')}`)).pid;
        return { detail: `template ${tmpl} (podd ${old.label}); containers from ${images.old}, ready by their startupProbe`, timings };
      }))
    )
      return run;
    if (
      !(await ok({ name: 'create 3 sandboxes' }, async () => {
        const timings: Record<string, number> = {};
        for (let i = 0; i < 3; i++) {
          const t1 = Date.now();
          const s = (await st.api.sandboxes.createSandbox({ template: tmpl, metadata: { compat: 'containers' }, timeoutSeconds: 0, requestId: `compat-ct-${randomBytes(6).toString('hex')}` })).sandbox;
          if (!s || stateName(s.state) !== 'RUNNING' || s.pid <= 0) throw new Error(`create ${i}: ${s ? `${stateName(s.state)} pid ${s.pid}` : 'empty answer'}`);
          timings[`create${i}Ms`] = Date.now() - t1;
          const marker = `sandbox ${i} ${randomBytes(4).toString('hex')}`;
          await st.api.sandboxes.writeFile({ sandboxId: s.sandboxId, path: 'marker', data: Buffer.from(marker), mode: 0o644, append: false });
          st.sbs.push({ id: s.sandboxId, pid: s.pid, marker });
          sandboxIds.push(s.sandboxId);
        }
        return { detail: st.sbs.map((s) => `${s.id} pid ${s.pid}`).join(', '), timings };
      }))
    )
      return run;
    await ok({ name: 'check at start', component: 'server' }, async () => ({ detail: await checkNode(st, old, old) }));

    // ---- upgrade to N in the b slots
    await ok({ name: 'upgrade ublk-manager (ublk-b)', component: 'ublk-manager', from: old.label, to: neu.label }, async () => {
      const readyMs = await pod.start('ublk-b', images.new);
      const r = await upgradeUblkIn(st, 'ublk-a', 'ublk-b', 'b', neu);
      return { detail: r.detail, timings: { readyMs, ...r.timings } };
    });
    stream = startStream(st.api, st.sbs[0]!.id, 'stop-1');
    await sleep(500);
    await ok({ name: 'upgrade server (server-b)', component: 'server', from: old.label, to: neu.label }, async () => {
      const readyMs = await pod.start('server-b', images.new);
      const r = await upgradeServerIn(st, 'server-b', neu);
      return { detail: r.detail, timings: { readyMs, ...r.timings } };
    });
    await ok({ name: 'exec stream across the server upgrade', component: 'server' }, async () => {
      await st.api.sandboxes.writeFile({ sandboxId: st.sbs[0]!.id, path: 'stop-1', data: Buffer.from('x'), mode: 0o644, append: false });
      const r = await streamEnd(stream!, 60_000);
      stream = undefined;
      return { detail: checkStream(r) };
    });
    await ok({ name: `check after upgrade (server, ublk-manager at ${neu.label})`, component: 'server' }, async () => ({ detail: await checkNode(st, neu, neu) }));

    // ---- roll back to N-1 in the a slots
    // Feature check, never the version: a ublk-manager without "ublk.foreign-mountns.v1" matches
    // loop devices by the backing path, which a device attached in another container renders
    // differently (another mount namespace), so it cannot take the devices back across
    // containers. Then ublk-manager stays at N (documented fallback) and the rest rolls back.
    let ublkAfterRollback = old;
    await ok({ name: 'rollback ublk-manager (ublk-a)', component: 'ublk-manager', from: neu.label, to: old.label }, async () => {
      const readyMs = await pod.start('ublk-a', images.old);
      const target = await versionAt(`unix://${path.join(st.runDir, 'ublk-manager-a.sock')}`);
      if (!hasFeature(target, UBLK_FEATURES.foreignMountns)) {
        await pod.stop('ublk-a');
        ublkAfterRollback = neu;
        throw new NotApplicable(
          `ublk-manager ${old.label} lacks feature "ublk.foreign-mountns.v1" (it cannot recover loop devices attached from another container's mount namespace): ublk-manager stays at ${neu.label}, ublk-a stopped again`,
        );
      }
      const r = await upgradeUblkIn(st, 'ublk-b', 'ublk-a', 'a', old);
      return { detail: r.detail, timings: { readyMs, ...r.timings } };
    });
    stream = startStream(st.api, st.sbs[1]!.id, 'stop-2');
    await sleep(500);
    await ok({ name: 'rollback server (server-a)', component: 'server', from: neu.label, to: old.label }, async () => {
      // the retired server-a process ends once the streams it relayed are done
      const exited = await pod.waitExited('server-a', 30_000);
      const readyMs = await pod.start('server-a', images.old);
      const r = await upgradeServerIn(st, 'server-a', old);
      return { detail: `${exited ? '' : 'retired server-a still running after 30 s, replaced; '}${r.detail}`, timings: { readyMs, ...r.timings } };
    });
    await ok({ name: 'exec stream across the server rollback', component: 'server' }, async () => {
      await st.api.sandboxes.writeFile({ sandboxId: st.sbs[1]!.id, path: 'stop-2', data: Buffer.from('x'), mode: 0o644, append: false });
      const r = await streamEnd(stream!, 60_000);
      stream = undefined;
      return { detail: checkStream(r) };
    });
    await ok({ name: `check after rollback (server at ${old.label}, ublk-manager at ${ublkAfterRollback.label})`, component: 'server' }, async () => ({
      detail: await checkNode(st, old, ublkAfterRollback),
    }));
    await ok({ name: 'delete sandboxes', component: 'server' }, async () => {
      for (const s of st.sbs) await st.api.sandboxes.deleteSandbox({ sandboxId: s.id });
      const left = (await st.api.sandboxes.listSandboxes({ pageSize: 100 })).sandboxes.length;
      if (left) throw new Error(`${left} sandboxes still listed after delete`);
      return { detail: `${st.sbs.length} deleted` };
    });
  } finally {
    if (stream) await st.api.sandboxes.writeFile({ sandboxId: st.sbs[0]!.id, path: stream.stopFile, data: Buffer.from('x'), mode: 0o644, append: false }).catch(() => undefined);
    st.api.close();
    run.result = steps.length > 0 && steps.every((s) => s.result !== 'fail') ? 'pass' : 'fail';
    run.ms = Date.now() - t0;
  }
  return run;
}
