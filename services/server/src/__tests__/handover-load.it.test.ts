/**
 * Server handover under load (issue 3, section 8): a node with 3 sandboxes, a client on its own
 * channel to the server's TCP listener doing >= 200 unary calls/s (many in flight), new
 * connections all the time (fresh channels and raw connects on TCP and the unix socket), a long
 * exec stream (and a second one through the first new server), and CreateSandbox calls during each of 5 consecutive handovers
 * (`sandnode upgrade server --from-build .`, N -> N+1 -> N ...). Nothing may be refused or fail;
 * the stream completes in order; sandboxes keep their pids; the epoch goes up by 5.
 */
import net from 'node:net';
import { socketPath } from '@sandnode/shared';
import { ServerRole } from '@sandnode/shared/proto/server/v1/admin';
import { SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { ClientError, Status } from 'nice-grpc-common';
import { connectServer, type ServerApi } from '@sandnode/node-stack';
import { upgradeServer } from '@sandnode/node-stack';
import type { TakeoverResult } from '@sandnode/shared';
import { adminStatus, describeNode, holderStatus, serverProcesses, startNode, waitFor, type TestNode } from '@sandnode/testkit';

jest.setTimeout(300_000);

const LINES = 400;
const STREAM = `i=0; while [ $i -lt ${LINES} ]; do echo line-$i; i=$((i+1)); sleep 0.02; done`;
const HANDOVERS = 5;

/** A refused connection as grpc-js reports it (the listener was closed or not yet open). */
function isConnectFailure(e: ClientError): boolean {
  return e.code === Status.UNAVAILABLE && /ECONNREFUSED|ENOENT|connect E[A-Z]+|No connection established|failed to connect/i.test(e.details);
}

interface LoadStats {
  ok: number;
  retried: number;
  retriedDetails: Map<string, number>;
  refused: number;
  failed: string[];
  inFlight: number;
  maxInFlight: number;
  freshChannels: number;
  rawConnects: number;
  rawRefused: string[];
}

/** collectStream runs STREAM in the sandbox; progress.bytes counts the stdout received so far. */
async function collectStream(api: ServerApi, sandboxId: string, progress = { bytes: 0 }): Promise<{ lines: string[]; exitCode: number }> {
  let out = '';
  let exitCode = -1;
  for await (const ev of api.sandboxes.exec({ sandboxId, argv: ['sh', '-c', STREAM], stdin: Buffer.alloc(0), cwd: '', env: {}, timeoutMs: 0 })) {
    const e = ev.event;
    if (e?.$case === 'stdout') {
      out += Buffer.from(e.value).toString();
      progress.bytes += e.value.length;
    } else if (e?.$case === 'exit') exitCode = e.value.exitCode;
  }
  return { lines: out.split('\n').filter(Boolean), exitCode };
}

describeNode('server handover under load', () => {
  let node: TestNode;
  beforeAll(async () => {
    node = await startNode({ listen: '127.0.0.1:0' });
  });
  afterAll(async () => {
    await node?.stop();
  });

  it(`keeps every connection, call, stream and sandbox through ${HANDOVERS} consecutive handovers`, async () => {
    const tcp = node.tcpAddress();
    const port = Number(tcp.split(':')[1]);
    const unixPath = socketPath(node.dirs.runDir, 'server');
    const client = connectServer(tcp, 60_000, { token: node.tcpToken() });
    const stats: LoadStats = {
      ok: 0,
      retried: 0,
      retriedDetails: new Map(),
      refused: 0,
      failed: [],
      inFlight: 0,
      maxInFlight: 0,
      freshChannels: 0,
      rawConnects: 0,
      rawRefused: [],
    };
    const onRetryableError = (e: ClientError) => {
      stats.retried++;
      const key = `${Status[e.code]}: ${e.details.slice(0, 120)}`;
      stats.retriedDetails.set(key, (stats.retriedDetails.get(key) ?? 0) + 1);
      if (isConnectFailure(e)) stats.refused++;
    };
    const noteFailure = (what: string, err: unknown) => {
      const e = err as ClientError;
      if (e instanceof ClientError && isConnectFailure(e)) stats.refused++;
      stats.failed.push(`${what}: ${e instanceof ClientError ? `${Status[e.code]} ${e.details}` : String(err)}`);
    };

    const made = await Promise.all([0, 1, 2].map((i) => client.sandboxes.createSandbox({ template: 'base', metadata: { load: String(i) }, requestId: `load-base-${i}` })));
    const sandboxes = made.map((r) => r.sandbox!);
    for (const s of sandboxes) expect(s.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    const before = await holderStatus(node.dirs);
    expect(before?.role).toBe(ServerRole.SERVER_ROLE_ACTIVE);
    const epoch0 = before!.epoch;

    // --- load: ~300 unary calls/s on one channel, many in flight --------------------------
    let loadOn = true;
    const pending = new Set<Promise<unknown>>();
    const track = (p: Promise<unknown>) => {
      pending.add(p);
      void p.finally(() => pending.delete(p));
    };
    let n = 0;
    const fire = () => {
      if (stats.inFlight >= 200) return;
      const i = n++;
      stats.inFlight++;
      stats.maxInFlight = Math.max(stats.maxInFlight, stats.inFlight);
      const call = i % 2 === 0 ? client.sandboxes.getSandbox({ sandboxId: sandboxes[i % 3]!.sandboxId }, { onRetryableError }) : client.sandboxes.listSandboxes({ pageSize: 10 }, { onRetryableError });
      track(
        call
          .then(
            () => stats.ok++,
            (err: unknown) => noteFailure(i % 2 === 0 ? 'GetSandbox' : 'ListSandboxes', err),
          )
          .finally(() => stats.inFlight--),
      );
    };
    const t0 = Date.now();
    const loadTimer = setInterval(() => {
      for (let k = 0; k < 3; k++) fire();
    }, 10);
    // --- new connections all the time: a fresh channel per call, raw connects ---------------
    const freshTimer = setInterval(() => {
      if (!loadOn) return;
      const api = connectServer(tcp, 60_000, { token: node.tcpToken() });
      stats.freshChannels++;
      track(
        api.sandboxes
          .getSandbox({ sandboxId: sandboxes[0]!.sandboxId }, { onRetryableError })
          .then(
            () => stats.ok++,
            (err: unknown) => noteFailure('GetSandbox (fresh channel)', err),
          )
          .finally(() => api.close()),
      );
    }, 50);
    const rawProbe = (opts: net.NetConnectOpts, what: string) =>
      new Promise<void>((resolve) => {
        const s = net.connect(opts);
        s.once('connect', () => {
          stats.rawConnects++;
          s.destroy();
          resolve();
        });
        s.once('error', (e: NodeJS.ErrnoException) => {
          stats.rawRefused.push(`${what}: ${e.code ?? e.message}`);
          resolve();
        });
      });
    const probes = (async () => {
      while (loadOn) {
        await Promise.all([rawProbe({ host: '127.0.0.1', port }, 'tcp'), rawProbe({ path: unixPath }, 'unix')]);
        await new Promise((r) => setTimeout(r, 5)); // the probes' pace (part of the load), not a wait
      }
    })();

    // --- one long exec stream, started on the first server --------------------------------
    const progress = { bytes: 0 };
    const stream = collectStream(client, sandboxes[0]!.sandboxId, progress);
    // the stream and the load run on the first server before the first handover
    await waitFor('the stream and the load to run on the first server', () => progress.bytes > 0 && stats.ok > 0, 30_000);

    // --- 5 handovers, with creates in flight and held ---------------------------------------
    const results: TakeoverResult[] = [];
    const creates: { label: string; p: Promise<{ ms: number; id: string; state: SandboxState }> }[] = [];
    const create = (label: string) => {
      const c0 = Date.now();
      const p = client.sandboxes
        .createSandbox({ template: 'base', metadata: { during: label }, requestId: `load-${label}` }, { onRetryableError })
        .then((r) => ({ ms: Date.now() - c0, id: r.sandbox!.sandboxId, state: r.sandbox!.state }));
      creates.push({ label, p });
      p.catch(() => undefined);
    };
    const heldSeen: boolean[] = [];
    let stream2: ReturnType<typeof collectStream> | undefined;
    let stream2Client: ServerApi | undefined;
    for (let h = 1; h <= HANDOVERS; h++) {
      const oldAdmin = (await holderStatus(node.dirs))!.admin;
      create(`h${h}-inflight`); // enters before the hold: the old server finishes it first
      // a head start for that create (no call shows it has entered the server), not a wait for a condition
      await new Promise((r) => setTimeout(r, 50));
      const upgrade = upgradeServer(node.dirs, '.');
      // fire a create while the old server is HANDING_OVER (its lifecycle calls are held)
      let done = false;
      void upgrade.finally(() => (done = true)).catch(() => undefined);
      let seen = false;
      await waitFor(
        `the old server to be HANDING_OVER (or handover ${h} to end)`,
        async () => {
          if ((await adminStatus(oldAdmin, 500))?.role === ServerRole.SERVER_ROLE_HANDING_OVER) {
            seen = true;
            create(`h${h}-held`);
          }
          return seen || done;
        },
        120_000,
        5,
      );
      heldSeen.push(seen);
      const r = await upgrade;
      results.push(r);
      // a second long stream runs through the first new server (slot b) while the node moves
      // on to slot a and back to a new slot-b server: the retiring one must not disturb it
      // (on a new connection, once the first server has stopped accepting)
      if (h === 1) {
        // time for the first server to stop accepting after FinishHandover (no call shows when it has)
        await new Promise((r) => setTimeout(r, 300));
        stream2Client = connectServer(tcp, 60_000, { token: node.tcpToken() });
        stream2 = collectStream(stream2Client, sandboxes[1]!.sandboxId);
      }
      console.log(
        `handover ${h}: pid ${r.oldPid} -> ${r.newPid}, epoch ${r.epoch}, hold window ${r.holdWindowMs} ms, ${r.adopted} adopted in ${r.adoptionMs} ms, create fired while HANDING_OVER: ${seen}`,
      );
    }

    const execResult = await stream;
    const exec2 = await stream2!;
    stream2Client?.close();
    loadOn = false;
    clearInterval(loadTimer);
    clearInterval(freshTimer);
    await probes;
    const elapsedS = (Date.now() - t0) / 1000;
    await Promise.all([...pending]);
    const createResults = await Promise.allSettled(creates.map((c) => c.p));
    client.close();

    const holds = results.map((r) => r.holdWindowMs);
    const sortedHolds = [...holds].sort((a, b) => a - b);
    const createMs = createResults.map((c, i) => `${creates[i]!.label}=${c.status === 'fulfilled' ? `${c.value.ms}ms` : 'FAILED'}`);
    console.log(
      [
        `hold windows (ms): ${holds.join(', ')} (min ${sortedHolds[0]}, median ${sortedHolds[Math.floor(sortedHolds.length / 2)]}, max ${sortedHolds[sortedHolds.length - 1]})`,
        `unary calls: ${stats.ok} ok in ${elapsedS.toFixed(1)} s (${(stats.ok / elapsedS).toFixed(0)}/s), max in flight ${stats.maxInFlight}, fresh channels ${stats.freshChannels}`,
        `retried attempts: ${stats.retried} (${[...stats.retriedDetails].map(([k, v]) => `${v}x ${k}`).join('; ') || 'none'})`,
        `raw connects: ${stats.rawConnects} ok, ${stats.rawRefused.length} refused`,
        `creates during handovers: ${createMs.join(', ')}`,
        `final failures: ${stats.failed.length}${stats.failed.length ? `: ${stats.failed.slice(0, 10).join(' | ')}` : ''}`,
      ].join('\n'),
    );

    // nothing refused, nothing failed
    expect(stats.rawRefused).toEqual([]);
    expect(stats.refused).toBe(0);
    expect(stats.failed).toEqual([]);
    expect(stats.ok).toBeGreaterThan(0);
    // the stream ran to completion through its (retiring) server, every line in order
    expect(execResult.exitCode).toBe(0);
    expect(execResult.lines).toEqual(Array.from({ length: LINES }, (_, i) => `line-${i}`));
    expect(exec2.exitCode).toBe(0);
    expect(exec2.lines).toEqual(Array.from({ length: LINES }, (_, i) => `line-${i}`));
    // every create issued around a handover succeeded (held, or retried), exactly once
    for (const [i, c] of createResults.entries()) {
      expect({ label: creates[i]!.label, status: c.status }).toEqual({ label: creates[i]!.label, status: 'fulfilled' });
    }
    const createdIds = createResults.map((c) => (c as PromiseFulfilledResult<{ id: string; state: SandboxState }>).value);
    for (const c of createdIds) expect(c.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    // the epoch went up by one per handover; the last new server is the one active server
    expect(results.map((r) => r.epoch)).toEqual(Array.from({ length: HANDOVERS }, (_, i) => epoch0 + i + 1));
    const after = await holderStatus(node.dirs);
    expect(after).toMatchObject({ role: ServerRole.SERVER_ROLE_ACTIVE, epoch: epoch0 + HANDOVERS, holderPid: results[HANDOVERS - 1]!.newPid });
    // every sandbox kept its pid; the created ones are there once each
    const api = node.reconnect();
    for (const s of sandboxes) {
      const now = (await api.sandboxes.getSandbox({ sandboxId: s.sandboxId })).sandbox!;
      expect([now.state, now.pid]).toEqual([SandboxState.SANDBOX_STATE_RUNNING, s.pid]);
    }
    const all = (await api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes;
    expect(all).toHaveLength(3 + creates.length);
    expect(new Set(all.map((s) => s.metadata.during ?? s.metadata.load)).size).toBe(all.length);
    // the retired servers are gone (the stream's server exited once it ended)
    await waitFor(
      'the retired servers to exit',
      () => {
        const pids = serverProcesses(node.dirs.runDir);
        if (pids.length > 1) throw new Error(`server processes: ${pids.join(', ')}`); // named in the timeout
        return true;
      },
      10_000,
      100,
    );
    expect(serverProcesses(node.dirs.runDir)).toEqual([results[HANDOVERS - 1]!.newPid]);
    // the port stayed the same
    expect(node.tcpAddress()).toBe(tcp);
  });
});
