/**
 * Live-upgrade benchmark (part of `npm run bench`), written to bench/results/live-upgrade.json:
 * (a) server handover vs a naive stop/start restart under the same load (unary GetSandbox
 *     loop over TCP): refused connections, failed RPCs, unavailability window p50/p99
 *     (the longest gap between two successful calls around each switch);
 * (b) device handover stall p50/p95/p99 over 20 devices (loop driver);
 * (c) drain of N sandboxes at concurrency 8 vs 1.
 */
import { createSandnodeChannel, createServiceClient, mapLimit, socketPath, unixAddress } from '@sandnode/shared';
import { SandboxServiceDefinition } from '@sandnode/shared/proto/server/v1/sandbox';
import { AdminServiceDefinition } from '@sandnode/shared/proto/server/v1/admin';
import { readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { connectServer, upgradeServer, upgradeUblkManager, waitForActiveServer, percentile } from '@sandnode/node-stack';
import { COMPONENTS, logFile, purgeNode, startComponent, stopComponent, type StackDirs } from '@sandnode/node-stack';

const num = (k: string, d: number) => Number(process.env[k] ?? d);
const r1 = (x: number) => Math.round(x * 10) / 10;

function serverPort(dirs: StackDirs): number {
  const lines = readFileSync(logFile(dirs, 'server'), 'utf8').trim().split('\n').reverse();
  for (const l of lines) if (l.startsWith('{"ready"')) return (JSON.parse(l) as { port: number }).port;
  throw new Error('no ready line');
}

/** load runs GetSandbox in a loop (8 in flight, no retries) and records outcomes. */
function startLoad(address: string, id: string) {
  const ch = createSandnodeChannel(address);
  const client = createServiceClient(SandboxServiceDefinition, ch, { timeoutMs: 2000, retryAttempts: 1 });
  const st = { ok: 0, refused: 0, failed: 0, okTimes: [] as number[], stop: false };
  const loops = Array.from({ length: 8 }, async () => {
    while (!st.stop) {
      try {
        await client.getSandbox({ sandboxId: id }, { retry: false });
        st.ok++;
        st.okTimes.push(performance.now());
      } catch (err) {
        const msg = String((err as Error).message);
        if (/ECONNREFUSED|ENOENT|No connection established/.test(msg)) st.refused++;
        else st.failed++;
        await new Promise((r) => setTimeout(r, 5));
      }
    }
  });
  return {
    st,
    async end() {
      st.stop = true;
      await Promise.all(loops);
      ch.close();
    },
  };
}

/** gapAround is the longest time without a successful call in [t0-50ms, t1+2s]. */
function gapAround(times: number[], t0: number, t1: number): number {
  const w = times.filter((t) => t >= t0 - 50 && t <= t1 + 2000).sort((a, b) => a - b);
  let gap = 0;
  for (let i = 1; i < w.length; i++) gap = Math.max(gap, (w[i] as number) - (w[i - 1] as number));
  return gap;
}

export async function benchLiveUpgrade(root: string, rows: (string | number)[][]): Promise<Record<string, unknown>> {
  const dirs: StackDirs = { stateDir: path.join(root, 'lu-state'), runDir: path.join(root, 'lu-run'), listen: '127.0.0.1:0' };
  const out: Record<string, unknown> = {};
  try {
    for (const c of COMPONENTS) await startComponent(dirs, c);
    let api = connectServer(unixAddress(socketPath(dirs.runDir, 'server')));
    await api.templates.buildTemplate({ name: 'base', replace: false });
    const id = (await api.sandboxes.createSandbox({ template: 'base' })).sandbox!.sandboxId;
    const tcp = `127.0.0.1:${serverPort(dirs)}`;

    // (a) handover vs naive restart
    const rounds = num('BENCH_HANDOVERS', 10);
    const load = startLoad(tcp, id);
    await new Promise((r) => setTimeout(r, 500));
    const hGaps: number[] = [];
    for (let i = 0; i < rounds; i++) {
      const t0 = performance.now();
      await upgradeServer(dirs, '.');
      hGaps.push(gapAround(load.st.okTimes, t0, performance.now()));
      await new Promise((r) => setTimeout(r, 300));
    }
    await load.end();
    const handover = { rounds, ok: load.st.ok, refused: load.st.refused, failed: load.st.failed, gapP50Ms: r1(percentile(hGaps, 50)), gapP99Ms: r1(percentile(hGaps, 99)) };
    // the naive restart: same load, stop (SIGTERM) then start on the same port
    const port = serverPort(dirs);
    dirs.listen = `127.0.0.1:${port}`;
    const load2 = startLoad(tcp, id);
    await new Promise((r) => setTimeout(r, 500));
    const rGaps: number[] = [];
    for (let i = 0; i < Math.min(rounds, 5); i++) {
      const t0 = performance.now();
      await stopComponent(dirs, 'server');
      await startComponent(dirs, 'server');
      rGaps.push(gapAround(load2.st.okTimes, t0, performance.now()));
      await new Promise((r) => setTimeout(r, 300));
    }
    await load2.end();
    const restart = { rounds: rGaps.length, ok: load2.st.ok, refused: load2.st.refused, failed: load2.st.failed, gapP50Ms: r1(percentile(rGaps, 50)), gapP99Ms: r1(percentile(rGaps, 99)) };
    out.serverHandover = { handover, naiveRestart: restart, goal: 'handover: 0 refused, 0 failed, gap p99 <= 50 ms' };
    rows.push(['server handover: refused / failed / gap p50 / p99', `${handover.refused} / ${handover.failed} / ${handover.gapP50Ms} / ${handover.gapP99Ms} ms`, '0 / 0 / p99 <= 50 ms']);
    rows.push(['naive restart: refused / failed / gap p50 / p99', `${restart.refused} / ${restart.failed} / ${restart.gapP50Ms} / ${restart.gapP99Ms} ms`, '(baseline)']);

    // (b) device handover stall over 20 devices (10 sandboxes x 2 devices)
    api.close();
    api = connectServer(unixAddress(socketPath(dirs.runDir, 'server')));
    await mapLimit(Array.from({ length: 9 }), 3, () => api.sandboxes.createSandbox({ template: 'base' }));
    const u = await upgradeUblkManager(dirs, '.');
    const stalls = u.devices.map((d) => d.stallMs);
    out.deviceHandover = {
      devices: stalls.length,
      mode: u.mode,
      p50Ms: r1(percentile(stalls, 50)),
      p95Ms: r1(percentile(stalls, 95)),
      p99Ms: r1(percentile(stalls, 99)),
      totalMs: u.totalMs,
      goalP99Ms: 20,
    };
    rows.push([
      `device handover stall over ${stalls.length} devices p50 / p95 / p99`,
      `${r1(percentile(stalls, 50))} / ${r1(percentile(stalls, 95))} / ${r1(percentile(stalls, 99))} ms (${u.mode})`,
      'p99 <= 20 ms',
    ]);

    // (c) drain of N sandboxes at concurrency 8 vs 1: the Drain RPC's wall time, the
    // server's own duration, each sandbox's time (p50) and how the device manager stopped
    const n = num('BENCH_DRAIN', 50);
    const have = (await api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes.length;
    await mapLimit(Array.from({ length: Math.max(0, n - have) }), 4, () => api.sandboxes.createSandbox({ template: 'base' }));
    const drainMs: Record<string, number> = {};
    const drainDetail: Record<string, unknown> = {};
    for (const conc of [8, 1]) {
      const holder = await waitForActiveServer(dirs.runDir);
      const ch = createSandnodeChannel(holder.admin);
      const t0 = performance.now();
      const r = await createServiceClient(AdminServiceDefinition, ch, { timeoutMs: 600_000 }).drain({ deadlineMs: 600_000, concurrency: conc });
      drainMs[`c${conc}`] = Math.round(performance.now() - t0);
      ch.close();
      drainMs[`c${conc}Preserved`] = r.sandboxes.filter((s) => s.outcome === 1).length;
      drainDetail[`c${conc}`] = {
        serverMs: r.durationMs,
        sandboxP50Ms: r1(
          percentile(
            r.sandboxes.map((s) => s.ms),
            50,
          ),
        ),
        sandboxMaxMs: Math.max(0, ...r.sandboxes.map((s) => s.ms)),
        deviceManagerStopped: r.deviceManagerStopped,
        deviceManagerError: r.deviceManagerError,
      };
      // bring the node back for the next round: device manager up, sandboxes resumed
      await startComponent(dirs, 'ublk-manager');
      await mapLimit(r.sandboxes, 8, (s) => api.sandboxes.resumeSandbox({ sandboxId: s.sandboxId }));
    }
    const ratio = r1((drainMs.c1 ?? 0) / (drainMs.c8 ?? 1));
    out.drain = { sandboxes: n, ...drainMs, ratio, detail: drainDetail, loadAverage: os.loadavg().map(r1), goalRatio: 3 };
    rows.push([`drain of ${n} sandboxes: concurrency 8 vs 1`, `${drainMs.c8} ms vs ${drainMs.c1} ms (x${ratio}; load avg ${os.loadavg().map(r1).join(' ')})`, 'c=8 >= x3 faster']);
    const all = (await api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes;
    await mapLimit(all, 8, (s) => api.sandboxes.deleteSandbox({ sandboxId: s.sandboxId }));
    api.close();
  } finally {
    for (const c of [...COMPONENTS].reverse()) await stopComponent(dirs, c).catch(() => undefined);
    await purgeNode(dirs).catch(() => undefined);
  }
  return out;
}
