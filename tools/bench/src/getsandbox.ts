/**
 * GetSandbox unary throughput through the server (section 3 of `npm run bench`), 64 calls in
 * flight, BENCH_GETSANDBOX_ROUNDS rounds (default 3) of BENCH_SECONDS (default 3) per client:
 * - the shared sandnode client (createServiceClient: retry + deadline middleware, what every
 *   component uses), one channel;
 * - the baseline: a lean nice-grpc client (no middleware) on one channel of its own.
 * After an uncounted warm-up of each, the two alternate round by round, so that load from other
 * work on the host falls on both.
 * Each round also records the CPU time per call of the load generator (this process) and of
 * the server (its /proc/<pid>/stat), in µs: with both on the same cores, a cheaper client
 * leaves more CPU to the server. Goal: >= 3000 calls/s through the sandnode client in every round.
 */
import { readFileSync } from 'node:fs';
import { askVersion, createSandnodeChannel, createServiceClient } from '@sandnode/shared';
import { SandboxServiceDefinition } from '@sandnode/shared/proto/server/v1/sandbox';
import { createClient } from 'nice-grpc';
import { spreadOf, type Spread } from './results';

const num = (k: string, d: number) => Number(process.env[k] ?? d);

/** Length of the uncounted warm-up round of each client, s. */
export const WARMUP_SECONDS = 1;
/** Calls in flight during a round. */
export const IN_FLIGHT = 64;

/** One round of one client. */
export interface GetSandboxRound {
  callsPerSecond: number;
  /** CPU time of this process (the load generator) per call, µs */
  clientCpuUsPerCall: number;
  /** CPU time of the server process per call, µs */
  serverCpuUsPerCall: number;
}

/** What benchGetSandbox measured. */
export interface GetSandboxBench {
  seconds: number;
  inFlight: number;
  sandnodeClient: GetSandboxRound[];
  leanClient: GetSandboxRound[];
  sandnodeClientCallsPerSecond: Spread;
  leanClientCallsPerSecond: Spread;
  goalCallsPerSecond: number;
}

/** cpuMsOf reads the user + system CPU time of pid from /proc, ms (clock ticks of 10 ms). */
function cpuMsOf(pid: number): number {
  const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.split(' ') ?? [];
  return (Number(f[11]) + Number(f[12])) * 10;
}

/** benchGetSandbox runs the rounds against the server at address over ids; rows get the table line. */
export async function benchGetSandbox(address: string, ids: string[], rows: (string | number)[][]): Promise<GetSandboxBench> {
  const seconds = num('BENCH_SECONDS', 3);
  const roundsN = Math.max(1, num('BENCH_GETSANDBOX_ROUNDS', 3));
  const serverPid = (await askVersion(address)).pid;
  const round = async (kind: 'sandnode' | 'lean', secs = seconds): Promise<GetSandboxRound> => {
    const ch = createSandnodeChannel(address);
    try {
      const client = kind === 'sandnode' ? createServiceClient(SandboxServiceDefinition, ch, { timeoutMs: 120_000 }) : createClient(SandboxServiceDefinition, ch);
      await client.getSandbox({ sandboxId: ids[0] as string }); // connect outside the measure
      let calls = 0;
      const cpu0 = process.cpuUsage();
      const server0 = cpuMsOf(serverPid);
      const t0 = performance.now();
      const end = Date.now() + secs * 1000;
      await Promise.all(
        Array.from({ length: IN_FLIGHT }, async (_, w) => {
          while (Date.now() < end) {
            await client.getSandbox({ sandboxId: ids[(calls + w) % ids.length] as string });
            calls++;
          }
        }),
      );
      const elapsedS = (performance.now() - t0) / 1000;
      const cpu = process.cpuUsage(cpu0);
      return {
        callsPerSecond: Math.round(calls / elapsedS),
        clientCpuUsPerCall: Math.round((cpu.user + cpu.system) / calls),
        serverCpuUsPerCall: Math.round(((cpuMsOf(serverPid) - server0) * 1000) / calls),
      };
    } finally {
      ch.close();
    }
  };
  const sandnode: GetSandboxRound[] = [];
  const lean: GetSandboxRound[] = [];
  // Warm-up, not counted: the first client a process runs pays for the JIT of the call path
  // (~2x the CPU per call), and so did whichever client went first.
  await round('sandnode', WARMUP_SECONDS);
  await round('lean', WARMUP_SECONDS);
  for (let i = 0; i < roundsN; i++) {
    sandnode.push(await round('sandnode'));
    lean.push(await round('lean'));
  }
  const res: GetSandboxBench = {
    seconds,
    inFlight: IN_FLIGHT,
    sandnodeClient: sandnode,
    leanClient: lean,
    sandnodeClientCallsPerSecond: spreadOf(sandnode.map((r) => r.callsPerSecond)),
    leanClientCallsPerSecond: spreadOf(lean.map((r) => r.callsPerSecond)),
    goalCallsPerSecond: 3000,
  };
  const us = (rs: GetSandboxRound[]) => spreadOf(rs.map((r) => r.clientCpuUsPerCall)).p50;
  rows.push([
    'GetSandbox calls/s: sandnode client (baseline: lean client), p50 of rounds',
    `${res.sandnodeClientCallsPerSecond.p50} (${res.leanClientCallsPerSecond.p50}) calls/s; client CPU ${us(sandnode)} (${us(lean)}) µs/call`,
    '>= 3000 calls/s each round',
    `${res.sandnodeClientCallsPerSecond.text} (${res.leanClientCallsPerSecond.text})`,
  ]);
  return res;
}
