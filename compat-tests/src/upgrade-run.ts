/**
 * The upgrade and rollback run (process mode): a node at N-1 with 3 live sandboxes and one
 * running exec stream; each component is upgraded to N (ublk-manager and server by handover
 * with N's CLI, vmm-supervisor by a restart that adopts, podd by a new template), the suite
 * runs with sandboxes of the old and the new template, then each component is rolled back to
 * N-1 the same way and the suite runs again.
 *
 * Between them (network-run.ts) a networked sandbox made at N keeps a kernel-path TCP connection
 * flowing while the server alone goes N -> N-1 -> N (its dry-run names what N-1 loses: ingress
 * and the egress proxy; the ingress stops and comes back with the same token).
 *
 * Checked through the whole run: the first 3 sandboxes keep their pids, the exec stream
 * delivers every byte and ends, and records written by N are read by N-1 unchanged (after the
 * rollback GetSandbox of every sandbox equals what N returned).
 */
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import type { Sandbox } from '@sandnode/shared/proto/server/v1/sandbox';
import { waitFor } from '@sandnode/testkit';
import { connectApi, TempNode, type Daemon } from './node';
import { checkStandbyConfig, settingsSlots, type ConfigMode } from './node-config';
import { runNetworkSteps } from './network-run';
import { loadSchema } from './wire';
import { execCollect, getSandbox, grpcStatusOf, runSuite, stateName, type ExecResult } from './scenarios';
import type { Build, Component, UpgradeRun, UpgradeStep } from './types';

/** Number of lines after which the stream stops by itself (a safety bound; it is normally told to stop). */
const STREAM_MAX_LINES = 20_000;
/** Interval between the stream's lines, s. */
const STREAM_INTERVAL_S = '0.05';
/** The file whose existence tells the stream to end (in the sandbox's /workspace). */
const STREAM_STOP_FILE = 'compat-stream.stop';

/** stable gives a canonical JSON of a sandbox record (sorted keys) for comparison. */
function stable(v: unknown): string {
  return JSON.stringify(v, (_k, x: unknown) =>
    x && typeof x === 'object' && !Array.isArray(x) && !Buffer.isBuffer(x) && !(x instanceof Uint8Array)
      ? Object.fromEntries(Object.entries(x as Record<string, unknown>).sort(([a], [b]) => a.localeCompare(b)))
      : x,
  );
}

/**
 * runUpgradeRun runs the upgrade and rollback run from `older` to `newer` (N-1 -> N -> N-1).
 * Never throws: every failure is a failed step; the node is removed at the end.
 */
export async function runUpgradeRun(older: Build, newer: Build, n: Build, log: (l: string) => void = () => undefined, configMode?: ConfigMode): Promise<UpgradeRun> {
  const t0 = Date.now();
  const run: UpgradeRun = { component: 'all', from: older.label, to: newer.label, result: 'fail', steps: [] };
  const node = new TempNode(n, undefined, configMode ? { mode: configMode, pair: [older, newer] } : undefined);
  const pids = new Map<string, number>();
  let failed = false;

  const step = async (name: string, fn: () => Promise<Partial<UpgradeStep> | void>, extra: Partial<UpgradeStep> = {}): Promise<boolean> => {
    const s0 = Date.now();
    try {
      const r = (await fn()) ?? {};
      const st: UpgradeStep = { name, result: 'pass', ms: Date.now() - s0, startMs: s0 - t0, ...extra, ...r };
      if (st.scenarios?.some((x) => x.result === 'fail')) st.result = 'fail';
      run.steps.push(st);
      if (st.result === 'fail') failed = true;
      log(
        `  ${name}: ${st.result} (${st.ms} ms)${st.detail ? ` ${st.detail}` : ''}${
          st.result === 'fail' && st.scenarios
            ? ` ${st.scenarios
                .filter((x) => x.result === 'fail')
                .map((x) => `${x.name}: ${x.grpcStatus ?? ''} ${x.detail}`)
                .join('; ')}`
            : ''
        }`,
      );
      return st.result !== 'fail';
    } catch (err) {
      const c = extra.component ?? 'server';
      const gs = grpcStatusOf(err);
      run.steps.push({ name, result: 'fail', ms: Date.now() - s0, startMs: s0 - t0, ...extra, detail: `${gs ? `${gs}: ` : ''}${(err as Error).message}`, logExcerpt: node.logTail(c) });
      failed = true;
      log(`  ${name}: FAIL (${Date.now() - s0} ms) ${(err as Error).message}`);
      return false;
    }
  };

  const checkPids = async (): Promise<string> => {
    for (const [id, pid] of pids) {
      const g = await getSandbox(node.api, id);
      if (g.pid !== pid) throw new Error(`${id}: pid ${pid} -> ${g.pid} (${stateName(g.state)})`);
    }
    return `${pids.size} sandboxes kept their pids`;
  };

  // the exec stream: its own channel (the connection stays with the server that started it)
  const streamApi = connectApi(node.address);
  let stream: Promise<ExecResult> | undefined;
  let streamLines = 0;
  let streamId = '';
  const keep: string[] = [];
  let snapshot = new Map<string, Sandbox>();
  const daemons: Record<Daemon, Build> = { server: older, 'vmm-supervisor': older, 'ublk-manager': older };

  const upgradeBy = async (c: 'server' | 'ublk-manager', to: Build): Promise<Partial<UpgradeStep>> => {
    const slots = settingsSlots(node.dirs.runDir);
    const hadSlots = existsSync(slots.v1) && existsSync(slots.v2);
    const r = await node.cli(['upgrade', c, '--from-build', to.dir, '--json'], { ...TempNode.buildEnv(to), ...(c === 'server' ? node.serverEnv() : {}) });
    if (r.status !== 0) throw new Error(`sandnode upgrade ${c} exited ${r.status}: ${r.stderr.trim().slice(-800)}`);
    const j = JSON.parse(r.stdout) as Record<string, unknown>;
    daemons[c] = to;
    node.reconnect();
    const v = await node.version(c);
    if (v.commit !== to.commit) throw new Error(`${c} answers with commit ${v.commit} after the upgrade, expected ${to.commit} (${to.label})`);
    if (c === 'server') {
      return {
        timings: { holdWindowMs: Number(j.holdWindowMs), adoptionMs: Number(j.adoptionMs), cliMs: r.ms },
        detail: `pid ${String(j.oldPid)} -> ${String(j.newPid)}, epoch ${String(j.epoch)}, hold window ${String(j.holdWindowMs)} ms, ${String(j.adopted)} adopted; ${await checkPids()}; ${checkStandbyConfig(node.dirs.runDir, Number(j.newPid), to, n, hadSlots)}`,
      };
    }
    const devs = (j.devices as { stallMs: number }[] | undefined) ?? [];
    const stalls = devs.map((d) => d.stallMs);
    return {
      timings: {
        devices: devs.length,
        stallP50Ms: Number(j.stallP50Ms),
        stallP99Ms: Number(j.stallP99Ms),
        maxStallMs: stalls.length ? Math.max(...stalls) : 0,
        totalMs: Number(j.totalMs),
        cliMs: r.ms,
      },
      detail: `slot ${String(j.oldSlot)} -> ${String(j.newSlot)}, ${devs.length} devices moved (${String(j.mode)}), stall p50 ${Number(j.stallP50Ms).toFixed(1)} ms p99 ${Number(j.stallP99Ms).toFixed(1)} ms; ${await checkPids()}`,
    };
  };

  const restartVmm = async (to: Build): Promise<Partial<UpgradeStep>> => {
    const s0 = Date.now();
    await node.stop('vmm-supervisor');
    const pid = await node.start('vmm-supervisor', to);
    daemons['vmm-supervisor'] = to;
    return { timings: { restartMs: Date.now() - s0 }, detail: `SIGTERM + start of ${to.label} (pid ${pid}) in ${Date.now() - s0} ms; ${await checkPids()}` };
  };

  try {
    const ok = await step(`start all at ${older.label} with 3 sandboxes and an exec stream`, async () => {
      await node.buildTemplate('old', older);
      for (const c of ['vmm-supervisor', 'ublk-manager', 'server'] as const) await node.start(c, older);
      for (let i = 0; i < 3; i++) {
        const s = (await node.api.sandboxes.createSandbox({ template: 'old', metadata: { run: 'upgrade', n: String(i) }, timeoutSeconds: 0, requestId: `compat-${randomBytes(8).toString('hex')}` }))
          .sandbox!;
        pids.set(s.sandboxId, s.pid);
        keep.push(s.sandboxId);
      }
      streamId = keep[0]!;
      const script = `i=1; while [ $i -le ${STREAM_MAX_LINES} ] && [ ! -e /workspace/${STREAM_STOP_FILE} ]; do echo "n $i"; i=$((i+1)); sleep ${STREAM_INTERVAL_S}; done; echo "end $((i-1))"`;
      let pending = '';
      stream = execCollect(streamApi, streamId, ['sh', '-c', script], (chunk) => {
        pending += chunk;
        const lines = pending.split('\n');
        pending = lines.pop() ?? '';
        streamLines += lines.length;
      });
      stream.catch(() => undefined);
      await waitFor('the exec stream to deliver a line', () => streamLines > 0, 500).catch(() => {
        throw new Error('the exec stream delivered nothing in 500 ms');
      });
      return { detail: `sandboxes ${keep.join(', ')}; stream in ${streamId}` };
    });
    if (!ok) throw new Error('setup failed');

    // --- upgrade to N ---
    await step(`upgrade ublk-manager ${older.label} -> ${newer.label}`, () => upgradeBy('ublk-manager', newer), { component: 'ublk-manager', from: older.label, to: newer.label });
    await step(`upgrade server ${older.label} -> ${newer.label}`, () => upgradeBy('server', newer), { component: 'server', from: older.label, to: newer.label });
    await step(`upgrade vmm-supervisor ${older.label} -> ${newer.label} (restart, adoption)`, () => restartVmm(newer), { component: 'vmm-supervisor', from: older.label, to: newer.label });
    await step(`new template with podd ${newer.label}`, async () => ({ detail: `template "new" built in ${await node.buildTemplate('new', newer)} ms` }), {
      component: 'podd',
      from: older.label,
      to: newer.label,
    });

    await step(`check at ${newer.label}`, async () => {
      const scenarios = await runSuite({
        node,
        daemons: { ...daemons },
        templates: [
          { name: 'old', podd: older },
          { name: 'new', podd: newer },
        ],
        watch: pids,
      });
      return { scenarios, detail: `${await checkPids()}; stream at ${streamLines} lines` };
    });

    // records written by N: two sandboxes made by N (old and new template), one paused by N,
    // one with a timeout set by N; then what N says about every sandbox
    await step(`write records at ${newer.label}`, async () => {
      for (const t of ['old', 'new']) {
        const s = (
          await node.api.sandboxes.createSandbox({
            template: t,
            metadata: { run: 'upgrade', written_by: newer.label, template: t },
            timeoutSeconds: 0,
            requestId: `compat-${randomBytes(8).toString('hex')}`,
          })
        ).sandbox!;
        keep.push(s.sandboxId);
      }
      await node.api.sandboxes.pauseSandbox({ sandboxId: keep[2]! });
      await node.api.sandboxes.setTimeout({ sandboxId: keep[1]!, timeoutSeconds: 86_400 });
      snapshot = new Map();
      for (const id of keep) snapshot.set(id, await getSandbox(node.api, id));
      return { detail: `${keep.length} records (2 created, 1 paused, 1 timeout set by ${newer.label})` };
    });

    // --- the network across server moves (N -> N-1 -> N) with a networked sandbox: network-run.ts ---
    await runNetworkSteps({ node, older, newer, step, upgradeServer: (to) => upgradeBy('server', to) });

    // --- roll back to N-1, in reverse order ---
    await step(`rollback vmm-supervisor ${newer.label} -> ${older.label} (restart, adoption)`, () => restartVmm(older), { component: 'vmm-supervisor', from: newer.label, to: older.label });
    await step(`rollback server ${newer.label} -> ${older.label}`, () => upgradeBy('server', older), { component: 'server', from: newer.label, to: older.label });
    await step(`rollback ublk-manager ${newer.label} -> ${older.label}`, () => upgradeBy('ublk-manager', older), { component: 'ublk-manager', from: newer.label, to: older.label });

    await step(`records written by ${newer.label} read by ${older.label}`, async () => {
      const diffs: string[] = [];
      // only the Sandbox fields the older build has: fields added later read as defaults there
      const known = new Set(
        loadSchema(older)
          .messages.get('sandnode.server.v1.Sandbox')
          ?.fields.map((f) => f.prop) ?? [],
      );
      const pick = (s: Sandbox) => Object.fromEntries(Object.entries(s).filter(([k]) => known.has(k)));
      for (const [id, full] of snapshot) {
        const want = pick(full);
        const got = pick(await getSandbox(node.api, id));
        if (stable(got) !== stable(want)) diffs.push(`${id}: ${newer.label} said ${stable(want)}; ${older.label} says ${stable(got)}`);
      }
      if (diffs.length) throw new Error(diffs.join('\n'));
      const r = (await node.api.sandboxes.resumeSandbox({ sandboxId: keep[2]! })).sandbox;
      if (r?.pid !== pids.get(keep[2]!)) throw new Error(`${keep[2]}: resumed by ${older.label} with pid ${r?.pid}, was ${pids.get(keep[2]!)}`);
      return {
        detail: `${snapshot.size} records equal in the ${known.size} fields ${older.label} knows (state, pid, metadata, timeout, ...); the sandbox paused by ${newer.label} resumed by ${older.label} with its pid`,
      };
    });

    await step(`check at ${older.label} after rollback`, async () => {
      const watch = new Map(pids);
      for (const id of keep.slice(3)) watch.set(id, snapshot.get(id)!.pid);
      const scenarios = await runSuite({
        node,
        daemons: { ...daemons },
        templates: [
          { name: 'old', podd: older },
          { name: 'new', podd: newer },
        ],
        watch,
      });
      for (const id of keep.slice(3)) {
        const r = await execCollect(node.api, id, ['echo', 'still here']);
        if (r.stdout !== 'still here\n') throw new Error(`${id} (made by ${newer.label}): exec under ${older.label} gave ${JSON.stringify(r.stdout)}`);
      }
      return { scenarios, detail: `${await checkPids()}; sandboxes made by ${newer.label} run under ${older.label}` };
    });

    await step('the exec stream ends with every byte', async () => {
      if (!stream) throw new Error('no stream');
      await node.api.sandboxes.writeFile({ sandboxId: streamId, path: STREAM_STOP_FILE, data: Buffer.from('stop'), mode: 0o644, append: false });
      const r = await Promise.race([stream, new Promise<never>((_, rej) => setTimeout(() => rej(new Error('the stream did not end within 30 s of the stop file')), 30_000))]);
      const lines = r.stdout.split('\n');
      if (lines.pop() !== '') throw new Error('the stream does not end with a newline');
      const last = lines.pop() ?? '';
      const m = /^end (\d+)$/.exec(last);
      if (!m) throw new Error(`the stream's last line is ${JSON.stringify(last)}, not "end K"`);
      const k = Number(m[1]);
      if (lines.length !== k) throw new Error(`the stream delivered ${lines.length} counter lines, the loop printed ${k}`);
      const bad = lines.findIndex((l, i) => l !== `n ${i + 1}`);
      if (bad >= 0) throw new Error(`line ${bad + 1} is ${JSON.stringify(lines[bad])}`);
      if (r.exitCode !== 0) throw new Error(`exit code ${r.exitCode}`);
      if (k >= STREAM_MAX_LINES) throw new Error(`the stream ran out (${k} lines) before the run ended: it did not span the whole run`);
      return { detail: `${k} lines (${r.stdout.length} bytes) in order, exit 0, spanning ${((Date.now() - t0) / 1000).toFixed(0)} s of upgrades and rollbacks` };
    });
  } catch {
    /* recorded as a failed step */
  } finally {
    streamApi.close();
    const notes = await node.down();
    if (notes) log(`cleanup: ${notes}`);
  }
  run.result = failed || run.steps.length === 0 ? 'fail' : 'pass';
  run.ms = Date.now() - t0;
  return run;
}

/** Components touched by a run's steps, for the report. */
export function stepComponents(r: UpgradeRun): Component[] {
  return [...new Set(r.steps.flatMap((s) => (s.component ? [s.component] : [])))];
}
