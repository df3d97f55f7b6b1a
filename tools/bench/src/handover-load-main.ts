/**
 * The load of the server-handover bench, in a process of its own (forked by handover-load.ts,
 * niced: BENCH_LOAD_NICE, default 10) so that it takes little of the CPU the server it measures runs on. Two loads, each
 * at a fixed call rate (no back-to-back loop that would take all the CPU it gets):
 *   open:  one GetSandbox every BENCH_HANDOVER_CALL_MS (default 2) ms on one open channel
 *          (deadline 2 s, no retries, at most 32 in flight): the end time of each successful call;
 *   fresh: one GetSandbox every 10 ms on a NEW connection (a channel with its own subchannel
 *          pool; deadline 8 s, no retries): each call's start and latency.
 * Times are CLOCK_MONOTONIC ms (process.hrtime), the same clock in every process of the host.
 * The bench runs each load in a process of its own.
 * Protocol (IPC): argv[2] is the JSON {@link LoadArgs}; the message "stop" ends the calls and the
 * answer is one {@link LoadReport}, after which the process exits.
 */
import os from 'node:os';
import { createChannel } from 'nice-grpc';
import { createSandnodeChannel, createServiceClient } from '@sandnode/shared';
import { SandboxServiceDefinition } from '@sandnode/shared/proto/server/v1/sandbox';

/** What the load process is started with. */
export interface LoadArgs {
  address: string;
  sandboxId: string;
  token: string;
  /** interval of the open channel's calls, ms (0: no open load in this process) */
  openCallMs: number;
  /** interval of the fresh-connection calls, ms (0: none in this process) */
  freshCallMs: number;
  /** the process's nice value (BENCH_LOAD_NICE, default 10) */
  nice: number;
}

/** What it reports when stopped. */
export interface LoadReport {
  ok: number;
  refused: number;
  failed: number;
  /** the open channel's failed calls by message (first 100 characters) */
  errors: Record<string, number>;
  /** end times of the open channel's successful calls, monotonic ms */
  okTimes: number[];
  /** fresh-connection calls answered: start (monotonic ms) and latency (ms) */
  fresh: { at: number; ms: number }[];
  freshFailed: number;
  freshErrors: Record<string, number>;
}

/** now is CLOCK_MONOTONIC in ms (comparable across processes). */
export const now = (): number => Number(process.hrtime.bigint()) / 1e6;

const MAX_IN_FLIGHT = 32;

function main(): void {
  const a = JSON.parse(process.argv[2] ?? '{}') as LoadArgs;
  try {
    os.setPriority(a.nice);
  } catch {
    /* not allowed: run at the default priority */
  }
  const r: LoadReport = { ok: 0, refused: 0, failed: 0, errors: {}, okTimes: [], fresh: [], freshFailed: 0, freshErrors: {} };
  const pending = new Set<Promise<void>>();
  const track = (p: Promise<void>) => {
    pending.add(p);
    void p.finally(() => pending.delete(p));
  };
  const ch = createSandnodeChannel(a.address);
  const client = createServiceClient(SandboxServiceDefinition, ch, { timeoutMs: 2000, retryAttempts: 1, token: a.token });
  let inFlight = 0;
  const open = setInterval(() => {
    if (a.openCallMs <= 0) return;
    if (inFlight >= MAX_IN_FLIGHT) return;
    inFlight++;
    track(
      client
        .getSandbox({ sandboxId: a.sandboxId }, { retry: false })
        .then(
          () => {
            r.ok++;
            r.okTimes.push(now());
          },
          (err: unknown) => {
            const msg = String((err as Error).message);
            if (/ECONNREFUSED|ENOENT|No connection established/.test(msg)) r.refused++;
            else r.failed++;
            r.errors[msg.slice(0, 100)] = (r.errors[msg.slice(0, 100)] ?? 0) + 1;
          },
        )
        .finally(() => inFlight--),
    );
  }, a.openCallMs || 1000);
  const fresh = setInterval(() => {
    if (a.freshCallMs <= 0) return;
    const fch = createChannel(a.address, undefined, { 'grpc.use_local_subchannel_pool': 1 });
    const t0 = now();
    track(
      createServiceClient(SandboxServiceDefinition, fch, { timeoutMs: 8000, retryAttempts: 0, token: a.token })
        .getSandbox({ sandboxId: a.sandboxId }, { retry: false })
        .then(
          () => void r.fresh.push({ at: t0, ms: now() - t0 }),
          (err: unknown) => {
            r.freshFailed++;
            const k = String((err as Error).message).slice(0, 100);
            r.freshErrors[k] = (r.freshErrors[k] ?? 0) + 1;
          },
        )
        .finally(() => fch.close()),
    );
  }, a.freshCallMs || 1000);
  process.on('message', (m) => {
    if (m !== 'stop') return;
    clearInterval(open);
    clearInterval(fresh);
    void Promise.all([...pending]).then(() => {
      ch.close();
      process.send!(r, () => process.exit(0));
    });
  });
  process.send!('ready');
}

if (require.main === module) main();
