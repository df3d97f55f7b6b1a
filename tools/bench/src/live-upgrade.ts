/**
 * Live-upgrade benchmark (part of `npm run bench`), written to bench/results/live-upgrade.json:
 * (a) server handover vs a naive stop/start restart under the same load (unary GetSandbox at
 *     a fixed rate over TCP, from processes of their own: handover-load-main.ts): refused
 *     connections, failed RPCs, unavailability window p50/p99
 *     (the longest gap between two successful calls around each switch), and for handovers
 *     also a client with a new connection every 10 ms (failed calls, slowest call p50/p99),
 *     each figure with its spread over BENCH_HANDOVER_REPS repetitions;
 * (b) device handover stall: device-stall.ts;
 * (c) drain of N sandboxes at concurrency 8 vs 1.
 */
import { createSandnodeChannel, createServiceClient, mapLimit, socketPath, unixAddress } from '@sandnode/shared';
import { AdminServiceDefinition, TokenRole } from '@sandnode/shared/proto/server/v1/admin';
import { readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { connectServer, upgradeServer, waitForActiveServer, percentile } from '@sandnode/node-stack';
import { COMPONENTS, logFile, purgeNode, startComponent, stopComponent, type StackDirs } from '@sandnode/node-stack';
import { benchDrain, withVmmMetrics } from './drain';
import { now, startLoadProcess } from './handover-load';
import { gapIn, timelineOf } from './gaps';

const num = (k: string, d: number) => Number(process.env[k] ?? d);
const r1 = (x: number) => Math.round(x * 10) / 10;

function serverPort(dirs: StackDirs): number {
  const lines = readFileSync(logFile(dirs, 'server'), 'utf8').trim().split('\n').reverse();
  for (const l of lines) if (l.startsWith('{"ready"')) return (JSON.parse(l) as { port: number }).port;
  throw new Error('no ready line');
}

/** benchToken makes an admin bearer token for the TCP load (AdminService on the active server's admin socket); returns its secret. */
async function benchToken(dirs: StackDirs): Promise<string> {
  const ch = createSandnodeChannel((await waitForActiveServer(dirs.runDir)).admin);
  try {
    return (await createServiceClient(AdminServiceDefinition, ch).createToken({ name: `bench-${Date.now()}`, role: TokenRole.TOKEN_ROLE_ADMIN, ttlMs: 0 })).secret;
  } finally {
    ch.close();
  }
}

/** AFTER_MS: how long after a switch (or an idle window) its window goes on; the next switch starts 300 ms later. */
const AFTER_MS = 250;

/** slowestIn is the longest latency of a fresh-connection call started in [from, to], ms. */
function slowestIn(calls: { at: number; ms: number }[], from: number, to: number): number {
  return Math.max(0, ...calls.filter((c) => c.at >= from && c.at <= to).map((c) => c.ms));
}

/** spread is "min–max" of xs, one decimal. */
function spread(xs: number[]): string {
  return `${r1(Math.min(...xs))}–${r1(Math.max(...xs))}`;
}

export async function benchLiveUpgrade(root: string, rows: (string | number)[][]): Promise<Record<string, unknown>> {
  const dirs: StackDirs = { stateDir: path.join(root, 'lu-state'), runDir: path.join(root, 'lu-run'), listen: '127.0.0.1:0' };
  const out: Record<string, unknown> = {};
  try {
    await withVmmMetrics(async () => {
      for (const c of COMPONENTS) await startComponent(dirs, c);
    });
    let api = connectServer(unixAddress(socketPath(dirs.runDir, 'server')));
    await api.templates.buildTemplate({ name: 'base', replace: false });
    const id = (await api.sandboxes.createSandbox({ template: 'base' })).sandbox!.sandboxId;
    const tcp = `127.0.0.1:${serverPort(dirs)}`;
    const token = await benchToken(dirs); // TCP needs a bearer token (docs/security.md)

    // (a) handover vs naive restart. Handovers in BENCH_HANDOVER_REPS repetitions of
    // BENCH_HANDOVERS each, under two loads at once, each in a process of its own, niced, at a
    // fixed rate (handover-load-main.ts): a GetSandbox every BENCH_HANDOVER_CALL_MS (2) ms on
    // one open channel (gap: the longest time without a successful call around each switch)
    // and a new connection every 10 ms (its slowest call around each switch). p50/p99 per repetition, and
    // their spread over the repetitions. The same figures over windows of the same length
    // without a handover (idle) are the machine's noise floor: a gap that the idle windows also
    // show comes from the host (CPU contention), not from the handover.
    const rounds = num('BENCH_HANDOVERS', 10);
    const reps = num('BENCH_HANDOVER_REPS', 3);
    const base = { address: tcp, sandboxId: id, token, nice: num('BENCH_LOAD_NICE', 10) };
    const [load, fresh] = await Promise.all([
      startLoadProcess({ ...base, openCallMs: num('BENCH_HANDOVER_CALL_MS', 2), freshCallMs: 0 }),
      startLoadProcess({ ...base, openCallMs: 0, freshCallMs: 10 }),
    ]);
    await new Promise((r) => setTimeout(r, 500));
    // windows [switch start - 50 ms, its end + AFTER_MS], monotonic ms; figures after the loads end
    const windows: { rep: number; idle: boolean; from: number; to: number; holdMs: number; switchEnd: number }[] = [];
    for (let rep = 0; rep < reps; rep++) {
      const took: number[] = [];
      for (let i = 0; i < rounds; i++) {
        const t0 = now();
        const holdMs = (await upgradeServer(dirs, '.')).holdWindowMs;
        const t1 = now();
        took.push(t1 - t0);
        windows.push({ rep, idle: false, from: t0 - 50, to: t1 + AFTER_MS, holdMs, switchEnd: t1 });
        await new Promise((r) => setTimeout(r, 300));
      }
      for (let i = 0; i < rounds; i++) {
        const t0 = now();
        await new Promise((r) => setTimeout(r, percentile(took, 50)));
        const t1 = now();
        windows.push({ rep, idle: true, from: t0 - 50, to: t1 + AFTER_MS, holdMs: 0, switchEnd: t1 });
        await new Promise((r) => setTimeout(r, 300));
      }
    }
    const [lr, fr] = await Promise.all([load.end(), fresh.end()]);
    const perRep: { gapP50Ms: number; gapP99Ms: number; freshP50Ms: number; freshP99Ms: number; holdWindowP99Ms: number; idleGapP99Ms: number; idleFreshP99Ms: number }[] = [];
    const of = (rep: number | undefined, idle: boolean) => windows.filter((w) => (rep === undefined || w.rep === rep) && w.idle === idle);
    const gaps = (ws: typeof windows) => ws.map((w) => gapIn(lr.okTimes, w.from, w.to));
    const slowest = (ws: typeof windows) => ws.map((w) => slowestIn(fr.fresh, w.from, w.to));
    for (let rep = 0; rep < reps; rep++) {
      const g = gaps(of(rep, false));
      const f = slowest(of(rep, false));
      perRep.push({
        gapP50Ms: r1(percentile(g, 50)),
        gapP99Ms: r1(percentile(g, 99)),
        freshP50Ms: r1(percentile(f, 50)),
        freshP99Ms: r1(percentile(f, 99)),
        holdWindowP99Ms: r1(
          percentile(
            of(rep, false).map((w) => w.holdMs),
            99,
          ),
        ),
        idleGapP99Ms: r1(percentile(gaps(of(rep, true)), 99)),
        idleFreshP99Ms: r1(percentile(slowest(of(rep, true)), 99)),
      });
    }
    const hGaps = gaps(of(undefined, false));
    const fGaps = slowest(of(undefined, false));
    const idleGaps = gaps(of(undefined, true));
    const idleFresh = slowest(of(undefined, true));
    const handover = {
      rounds: rounds * reps,
      repetitions: perRep,
      openCallMs: num('BENCH_HANDOVER_CALL_MS', 2),
      ok: lr.ok,
      refused: lr.refused,
      failed: lr.failed,
      errors: lr.errors,
      gapP50Ms: r1(percentile(hGaps, 50)),
      gapP99Ms: r1(percentile(hGaps, 99)),
      gapP99SpreadMs: spread(perRep.map((r) => r.gapP99Ms)),
      freshCalls: fr.fresh.length,
      freshFailed: fr.freshFailed,
      freshErrors: fr.freshErrors,
      freshGapP50Ms: r1(percentile(fGaps, 50)),
      freshGapP99Ms: r1(percentile(fGaps, 99)),
      freshGapP99SpreadMs: spread(perRep.map((r) => r.freshP99Ms)),
      idleGapP50Ms: r1(percentile(idleGaps, 50)),
      idleGapP99Ms: r1(percentile(idleGaps, 99)),
      idleFreshP50Ms: r1(percentile(idleFresh, 50)),
      idleFreshP99Ms: r1(percentile(idleFresh, 99)),
      loadAverage: os.loadavg().map(r1),
    };
    // the naive restart: same load, stop (SIGTERM) then start on the same port
    const port = serverPort(dirs);
    dirs.listen = `127.0.0.1:${port}`;
    const load2 = await startLoadProcess({ ...base, openCallMs: num('BENCH_HANDOVER_CALL_MS', 2), freshCallMs: 0 });
    await new Promise((r) => setTimeout(r, 500));
    const rWindows: { from: number; to: number; switchEnd: number }[] = [];
    for (let i = 0; i < Math.min(rounds, 5); i++) {
      const t0 = now();
      await stopComponent(dirs, 'server');
      await startComponent(dirs, 'server');
      const t1 = now();
      rWindows.push({ from: t0 - 50, to: t1 + AFTER_MS, switchEnd: t1 });
      await new Promise((r) => setTimeout(r, 300));
    }
    const lr2 = await load2.end();
    const rGaps = rWindows.map((w) => gapIn(lr2.okTimes, w.from, w.to));
    const restart = { rounds: rGaps.length, ok: lr2.ok, refused: lr2.refused, failed: lr2.failed, gapP50Ms: r1(percentile(rGaps, 50)), gapP99Ms: r1(percentile(rGaps, 99)) };
    // the raw timeline (the HTML report draws it): per window, ms from its start, the switch
    // [50, switchEndMs], the successful calls of the open channel, the gap gapIn measured
    const lane = (w: { from: number; to: number; switchEnd: number }, times: number[]) => ({
      lengthMs: r1(w.to - w.from),
      switchEndMs: r1(w.switchEnd - w.from),
      gapMs: r1(gapIn(times, w.from, w.to)),
      okMs: timelineOf(times, w.from, w.to),
    });
    const timeline = {
      switchStartMs: 50,
      handovers: of(undefined, false).map((w) => ({ rep: w.rep, holdMs: r1(w.holdMs), ...lane(w, lr.okTimes) })),
      idle: of(undefined, true).map((w) => ({ rep: w.rep, ...lane(w, lr.okTimes) })),
      naiveRestarts: rWindows.map((w) => lane(w, lr2.okTimes)),
    };
    out.serverHandover = { handover, naiveRestart: restart, timeline, goal: 'handover: 0 refused, 0 failed (open and fresh connections), gap p99 <= 30 ms' };
    rows.push([
      `server handover x${handover.rounds}: refused / failed / gap p50 / p99 (p99 spread over ${reps} reps)`,
      `${handover.refused} / ${handover.failed} / ${handover.gapP50Ms} / ${handover.gapP99Ms} ms (${handover.gapP99SpreadMs})`,
      '0 / 0 / p99 <= 30 ms',
    ]);
    rows.push([
      `server handover, a new connection every 10 ms: failed / slowest call p50 / p99 (p99 spread)`,
      `${handover.freshFailed} of ${handover.freshCalls + handover.freshFailed} / ${handover.freshGapP50Ms} / ${handover.freshGapP99Ms} ms (${handover.freshGapP99SpreadMs})`,
      '0 / p99 <= 30 ms',
    ]);
    rows.push([
      `  same windows without a handover (noise floor; load avg ${handover.loadAverage.join(' ')}): gap p50 / p99, fresh slowest p50 / p99`,
      `${handover.idleGapP50Ms} / ${handover.idleGapP99Ms} ms, ${handover.idleFreshP50Ms} / ${handover.idleFreshP99Ms} ms`,
      '(host)',
    ]);
    rows.push(['naive restart: refused / failed / gap p50 / p99', `${restart.refused} / ${restart.failed} / ${restart.gapP50Ms} / ${restart.gapP99Ms} ms`, '(baseline)']);

    // (b) the device handover stall is measured with I/O in flight on a node of its own: device-stall.ts (run by main.ts)
    api.close();
    api = connectServer(unixAddress(socketPath(dirs.runDir, 'server')));

    // (c) drain of N sandboxes at concurrency 8 vs 1 (drain.ts)
    out.drain = await benchDrain(dirs, api, rows);
    const all = (await api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes;
    await mapLimit(all, 8, (s) => api.sandboxes.deleteSandbox({ sandboxId: s.sandboxId }));
    api.close();
  } finally {
    for (const c of [...COMPONENTS].reverse()) await stopComponent(dirs, c).catch(() => undefined);
    await purgeNode(dirs).catch(() => undefined);
  }
  return out;
}
