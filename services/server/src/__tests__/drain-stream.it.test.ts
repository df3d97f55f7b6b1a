/**
 * AdminService.DrainStream on a real node (feature server.drain-stream.v1; issue 11 §4) with 3
 * real sandboxes:
 * - a deadline that has passed before any sandbox can start: the stream still goes started ->
 *   one FAILED `sandbox` event per sandbox -> `result`, the report says what was not preserved
 *   and why (not reached before the deadline, the device manager not stopped), and nothing
 *   changed (every sandbox runs, the device manager too);
 * - a drain with time: started (the count) -> one PRESERVED event per sandbox, in the order they
 *   ended -> result (the same outcomes) -> the end of the stream; the records say DRAINED;
 * - `sandnode drain` on a terminal prints each sandbox's line as its drain ends, before the report.
 */
import { spawnSync } from 'node:child_process';
import { createSandnodeChannel, createServiceClient, mapLimit } from '@sandnode/shared';
import { AdminServiceDefinition, DrainOutcome, type DrainStreamResponse } from '@sandnode/shared/proto/server/v1/admin';
import { SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { findRunning, startComponent, waitForActiveServer } from '@sandnode/node-stack';
import { describeNode, execCollect, startNode, waitFor, type TestNode } from '@sandnode/testkit';

jest.setTimeout(240_000);

const COUNT = 3;

/** drainEvents runs DrainStream on the node's active server and collects every event, in order. */
async function drainEvents(node: TestNode, req: { deadlineMs: number; concurrency: number }): Promise<DrainStreamResponse[]> {
  const ch = createSandnodeChannel((await waitForActiveServer(node.dirs.runDir)).admin);
  try {
    const admin = createServiceClient(AdminServiceDefinition, ch, { timeoutMs: 60_000 });
    const out: DrainStreamResponse[] = [];
    for await (const e of admin.drainStream(req, { deadline: 60_000 })) out.push(e);
    return out;
  } finally {
    ch.close();
  }
}

/** kinds is the $case of each event ("started", "sandbox", "result"). */
const kinds = (es: DrainStreamResponse[]) => es.map((e) => e.event?.$case);

/** shellQuote quotes s for sh. */
const shellQuote = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;

describeNode('AdminService.DrainStream with real sandboxes', () => {
  let node: TestNode;
  let ids: string[] = [];

  beforeAll(async () => {
    node = await startNode();
    ids = await mapLimit(
      Array.from({ length: COUNT }, (_, i) => i),
      3,
      async (i) => (await node.api.sandboxes.createSandbox({ template: 'base', requestId: `drain-stream-${i}` })).sandbox!.sandboxId,
    );
  });
  afterAll(async () => {
    // the device manager must run for the deletes in stop()
    if (node && !findRunning(node.dirs, 'ublk-manager')) await startComponent(node.dirs, 'ublk-manager').catch(() => undefined);
    await node?.stop();
  });

  it('an expired deadline: started, one FAILED event per sandbox, then the report saying what was not preserved; nothing changed', async () => {
    const ublk = findRunning(node.dirs, 'ublk-manager')?.pid;
    // 1 ms leaves no time for any sandbox (each is started only while it can end before the phase end)
    const es = await drainEvents(node, { deadlineMs: 1, concurrency: 2 });
    expect(kinds(es)).toEqual(['started', ...ids.map(() => 'sandbox'), 'result']);
    const started = es[0]!.event!;
    expect(started.$case === 'started' && started.value).toMatchObject({ sandboxes: COUNT, deadlineMs: 1, concurrency: 2 });
    const events = es.slice(1, -1).map((e) => (e.event?.$case === 'sandbox' ? e.event.value : undefined)!);
    expect(events.map((s) => s.sandboxId).sort()).toEqual([...ids].sort());
    for (const s of events) {
      expect(s.outcome).toBe(DrainOutcome.DRAIN_OUTCOME_FAILED);
      expect(s.error).toMatch(/not reached before the drain deadline \(1 ms\); it keeps running/);
    }
    const last = es[es.length - 1]!.event!;
    if (last.$case !== 'result') throw new Error('no result last');
    expect(last.value.sandboxes.map((s) => [s.sandboxId, s.outcome]).sort()).toEqual(events.map((s) => [s.sandboxId, s.outcome]).sort());
    expect(last.value.deviceManagerStopped).toBe(false);
    expect(last.value.deviceManagerError).toMatch(/deadline.*keeps running/);
    // nothing changed: every sandbox runs and answers, the device manager is the same process
    for (const id of ids) {
      expect((await node.api.sandboxes.getSandbox({ sandboxId: id })).sandbox!.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
      expect((await execCollect(node.api, id, ['true'])).exitCode).toBe(0);
    }
    expect(findRunning(node.dirs, 'ublk-manager')?.pid).toBe(ublk);
  });

  it('started, one PRESERVED event per sandbox as its drain ends, then the same outcomes in the result, then the end', async () => {
    const es = await drainEvents(node, { deadlineMs: 30_000, concurrency: 2 });
    expect(kinds(es)).toEqual(['started', ...ids.map(() => 'sandbox'), 'result']);
    const events = es.slice(1, -1).map((e) => (e.event?.$case === 'sandbox' ? e.event.value : undefined)!);
    expect(events.map((s) => s.sandboxId).sort()).toEqual([...ids].sort());
    for (const s of events)
      expect({ id: s.sandboxId, outcome: s.outcome, resume: s.resumeMethod, error: s.error }).toEqual({
        id: s.sandboxId,
        outcome: DrainOutcome.DRAIN_OUTCOME_PRESERVED,
        resume: 'cold-start',
        error: '',
      });
    const last = es[es.length - 1]!.event!;
    if (last.$case !== 'result') throw new Error('no result last');
    // the result has each sandbox once, with the outcome and time its event said
    expect([...last.value.sandboxes].sort((a, b) => a.sandboxId.localeCompare(b.sandboxId))).toEqual([...events].sort((a, b) => a.sandboxId.localeCompare(b.sandboxId)));
    expect(last.value.deviceManagerStopped).toBe(true);
    for (const id of ids) expect((await node.api.sandboxes.getSandbox({ sandboxId: id })).sandbox!.state).toBe(SandboxState.SANDBOX_STATE_DRAINED);
  });

  it('sandnode drain on a terminal prints each sandbox once, as its drain ends, before the report', async () => {
    await waitFor('ublk-manager to exit after the drain', () => !findRunning(node.dirs, 'ublk-manager'), 15_000, 100);
    await startComponent(node.dirs, 'ublk-manager');
    await mapLimit(ids, 3, (id) => node.api.sandboxes.resumeSandbox({ sandboxId: id }));
    const argv = [
      process.execPath,
      require.resolve('@sandnode/cli/dist/main.js'),
      '--state-dir',
      node.dirs.stateDir,
      '--run-dir',
      node.dirs.runDir,
      '--listen',
      '',
      'drain',
      '--deadline-ms',
      '30000',
      '--concurrency',
      '2',
    ];
    // script(1) gives the CLI a terminal (stdout and stderr both go to it, in the order written)
    const r = spawnSync('script', ['-qec', argv.map(shellQuote).join(' '), '/dev/null'], { encoding: 'utf8', timeout: 120_000 });
    console.log(`sandnode drain on a terminal: exit ${r.status}:\n${r.stdout}`);
    expect(r.status).toBe(0);
    const out = r.stdout;
    const report = out.indexOf(`drained ${COUNT} of ${COUNT} sandboxes`);
    expect(report).toBeGreaterThan(0);
    expect(out).toContain(`draining: 0 of ${COUNT} sandboxes`);
    for (const id of ids) {
      // the line of the sandbox's event, written as its drain ended, and not repeated by the report
      const line = new RegExp(`${id}: preserved in \\d+ ms \\(cold-start\\)`, 'g');
      const at = [...out.matchAll(line)].map((m) => m.index);
      expect(at.length).toBe(1);
      expect(at[0]).toBeLessThan(report);
    }
    // what a preserved sandbox keeps and loses is said once
    expect(out.match(/preserved sandboxes kept: rootfs/g)?.length).toBe(1);
    expect(out).toContain(`drained ${COUNT} of ${COUNT} sandboxes`);
  });

  it('sandnode sandbox resume --all-drained brings every drained sandbox back (it starts the ublk-manager the drain stopped)', async () => {
    for (const id of ids) expect((await node.api.sandboxes.getSandbox({ sandboxId: id })).sandbox!.state).toBe(SandboxState.SANDBOX_STATE_DRAINED);
    const r = spawnSync(
      process.execPath,
      [require.resolve('@sandnode/cli/dist/main.js'), '--state-dir', node.dirs.stateDir, '--run-dir', node.dirs.runDir, '--listen', '', 'sandbox', 'resume', '--all-drained'],
      { encoding: 'utf8', timeout: 120_000 },
    );
    console.log(`sandnode sandbox resume --all-drained: exit ${r.status}:\n${r.stdout}${r.stderr}`);
    expect(r.status).toBe(0);
    expect(r.stdout).toContain(`resumed ${COUNT} of ${COUNT} drained sandboxes`);
    for (const id of ids) expect((await node.api.sandboxes.getSandbox({ sandboxId: id })).sandbox!.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
  });
});
