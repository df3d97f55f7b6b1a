/**
 * Fresh connections through server handovers (issue 11 §1, first finding): clients that open a
 * NEW connection every 10 ms, each making one unary call with a deadline, through 3
 * consecutive `sandnode upgrade server` handovers, on TCP and on the unix socket. Every call
 * must be answered: a connection that one of the servers accepted and never served ends in
 * DEADLINE_EXCEEDED, a refused connect in UNAVAILABLE, and both count as failed calls.
 *
 * Per transport, three clients run at once:
 *   - fresh:  a new channel with its own subchannel pool (a new connection per call);
 *   - shared: a new channel with grpc-js's default, process-wide subchannel pool (new channels
 *     share one connection; a connection that is never served stalls every channel on it);
 *   - open:   one channel opened before the first handover, a call every 10 ms.
 * No client retries (one attempt per call, deadline 8 s): what fails here is what a plain gRPC user sees.
 */
import { createServiceClient, socketPath, unixAddress } from '@sandnode/shared';
import { SandboxServiceDefinition } from '@sandnode/shared/proto/server/v1/sandbox';
import { upgradeServer } from '@sandnode/node-stack';
import { describeNode, startNode, type TestNode } from '@sandnode/testkit';
import { createChannel, type Channel } from 'nice-grpc';
import { ClientError, Status } from 'nice-grpc-common';

jest.setTimeout(300_000);

const HANDOVERS = 3;
/** the pace of each client, ms */
const PACE_MS = 10;
/** the deadline of each call, ms */
const DEADLINE_MS = 8000;

type Kind = 'fresh' | 'shared' | 'open';

interface Tally {
  calls: number;
  failed: string[];
}

/** histogram counts each error (times and addresses left out). */
function histogram(errors: string[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const e of errors) {
    const k = e.replace(/\(\d{4}-[^)]*\)/g, '(T)').slice(0, 160);
    out[k] = (out[k] ?? 0) + 1;
  }
  return out;
}

describeNode('fresh connections through server handovers', () => {
  let node: TestNode;
  beforeAll(async () => {
    node = await startNode({ listen: '127.0.0.1:0', buildTemplate: false });
  });
  afterAll(async () => {
    await node?.stop();
  });

  it(`answers every call of a new connection every ${PACE_MS} ms through ${HANDOVERS} handovers (TCP and unix)`, async () => {
    const targets = { tcp: node.tcpAddress(), unix: unixAddress(socketPath(node.dirs.runDir, 'server')) };
    const token = node.tcpToken(); // TCP needs a bearer token (docs/security.md)
    const tally = new Map<string, Tally>();
    const pending = new Set<Promise<void>>();
    const call = (name: string, ch: Channel, closeAfter: boolean) => {
      const t = tally.get(name) ?? { calls: 0, failed: [] };
      tally.set(name, t);
      t.calls++;
      // the deadline, and no retry: one attempt per call
      const p = createServiceClient(SandboxServiceDefinition, ch, { timeoutMs: DEADLINE_MS, retryAttempts: 0, token: name.startsWith('tcp') ? token : undefined })
        .listSandboxes({ pageSize: 1 }, { retry: false })
        .then(
          () => undefined,
          (err: unknown) => {
            t.failed.push(err instanceof ClientError ? `${Status[err.code]} ${err.details}` : String(err));
          },
        )
        .finally(() => {
          if (closeAfter) ch.close();
          pending.delete(p);
        });
      pending.add(p);
    };
    const open = Object.fromEntries(Object.entries(targets).map(([k, a]) => [k, createChannel(a, undefined, { 'grpc.use_local_subchannel_pool': 1 })]));
    const tick = () => {
      for (const [transport, address] of Object.entries(targets)) {
        call(`${transport} fresh`, createChannel(address, undefined, { 'grpc.use_local_subchannel_pool': 1 }), true);
        call(`${transport} shared`, createChannel(address), true);
        call(`${transport} open`, open[transport]!, false);
      }
    };
    // the clients run on the first server before the first handover
    tick();
    await Promise.all([...pending]);
    const timer = setInterval(tick, PACE_MS);
    const epochs: number[] = [];
    try {
      for (let h = 1; h <= HANDOVERS; h++) epochs.push((await upgradeServer(node.dirs, '.')).epoch);
      // and on the last new server for a while after it took over (calls, not time, are counted)
      const after = tally.get('tcp fresh')!.calls + 50;
      while (tally.get('tcp fresh')!.calls < after) await new Promise((r) => setTimeout(r, PACE_MS));
    } finally {
      clearInterval(timer);
      await Promise.all([...pending]);
      for (const ch of Object.values(open)) ch.close();
    }
    expect(epochs).toHaveLength(HANDOVERS);
    for (const kind of ['fresh', 'shared', 'open'] satisfies Kind[])
      for (const transport of Object.keys(targets)) expect(tally.get(`${transport} ${kind}`)?.calls ?? 0).toBeGreaterThan(HANDOVERS * 10);
    // every client with a failed call, with its counts and its first errors
    const failing = [...tally].filter(([, t]) => t.failed.length > 0).map(([name, t]) => ({ name, calls: t.calls, failed: t.failed.length, errors: histogram(t.failed) }));
    expect(failing).toEqual([]);
  });
});
