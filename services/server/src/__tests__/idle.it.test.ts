/**
 * Idle actions on a whole node with real runc sandboxes (issue 14 §3): an idle sandbox is paused
 * and an Exec resumes it with its processes (same pid); a hibernated one comes back by a cold
 * start (new pid) with /workspace kept; two Execs at once on a paused sandbox give one resume;
 * a KeepAlive lease holds the pause off; the paused TTL deletes; the timers live in the record,
 * so `upgrade server` (which writes the activity held in memory) and kill -9 of the server neither
 * reset nor lose them; auto_resume=false and
 * bad input are refused; the CLI's flags and `sandbox keepalive` reach the server. Short timers
 * (2-3 s) and waitFor, never a timed assertion. The ingress side is idle-ingress.it.test.ts.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Status } from 'nice-grpc-common';
import { killComponent, startComponent, upgradeServer } from '@sandnode/node-stack';
import type { UploadFileRequest } from '@sandnode/shared/proto/server/v1/files';
import { SandboxState, type IdleSettings, type Sandbox } from '@sandnode/shared/proto/server/v1/sandbox';
import { autoResumes as countAutoResumes } from './idle-helpers';
import { describeNode, execCollect, expectCode, startNode, waitFor, type TestNode } from '@sandnode/testkit';

jest.setTimeout(300_000);

describeNode('idle pause, hibernate, TTL and auto-resume (whole node)', () => {
  let node: TestNode;

  beforeAll(async () => {
    node = await startNode({ buildTemplate: true });
  });
  afterAll(async () => {
    await node?.stop();
  });

  const create = async (idle: Partial<IdleSettings>): Promise<Sandbox> =>
    (await node.api.sandboxes.createSandbox({ template: 'base', timeoutSeconds: 0, metadata: {}, requestId: '', idle: { pauseAfterS: 0, hibernateAfterS: 0, pausedTtlS: 0, ...idle } })).sandbox!;
  const get = async (id: string): Promise<Sandbox> => (await node.api.sandboxes.getSandbox({ sandboxId: id })).sandbox!;
  const waitState = (id: string, state: SandboxState, what: string) => waitFor(what, async () => ((await get(id)).state === state ? true : undefined), 60_000, 100);
  const sh = (id: string, cmd: string) => execCollect(node.api, id, ['/bin/busybox', 'sh', '-c', cmd], { timeoutMs: 30_000 });
  const autoResumes = (id: string): number => countAutoResumes(node.dirs.runDir, id);

  test('pause_after_s pauses an idle sandbox; an Exec resumes it with the same pid and runs', async () => {
    const sb = await create({ pauseAfterS: 2 });
    expect(sb.idle).toMatchObject({ settings: { pauseAfterS: 2, autoResume: true }, nextAction: 'pause' });
    await sh(sb.sandboxId, 'echo started > /workspace/mark');
    await waitState(sb.sandboxId, SandboxState.SANDBOX_STATE_PAUSED, 'the idle pause');
    const paused = await get(sb.sandboxId);
    expect(paused.idle?.pausedAtMs).toBeGreaterThan(0);
    const r = await sh(sb.sandboxId, 'cat /workspace/mark');
    expect(r).toMatchObject({ exitCode: 0, stdout: 'started\n' });
    const back = await get(sb.sandboxId);
    expect(back.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    expect(back.pid).toBe(sb.pid);
    expect(back.idle).toMatchObject({ pausedAtMs: 0, hibernated: false, nextAction: 'pause' });
    await node.api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });

  test('the CLI exec (ExecStream) auto-resumes an idle-paused sandbox too, with the same pid', async () => {
    const sb = await create({ pauseAfterS: 2 });
    await sh(sb.sandboxId, 'echo via-cli > /workspace/mark');
    await waitState(sb.sandboxId, SandboxState.SANDBOX_STATE_PAUSED, 'the idle pause');
    const r = node.cli(['sandbox', 'exec', sb.sandboxId, '--', '/bin/busybox', 'cat', '/workspace/mark']);
    expect({ status: r.status, stdout: r.stdout, stderr: r.stderr }).toEqual({ status: 0, stdout: 'via-cli\n', stderr: '' });
    const back = await get(sb.sandboxId);
    expect(back.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    expect(back.pid).toBe(sb.pid);
    await node.api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });

  test('sandbox cp (UploadFile, a client stream) and a download auto-resume an idle-paused sandbox', async () => {
    const sb = await create({ pauseAfterS: 2 });
    await waitState(sb.sandboxId, SandboxState.SANDBOX_STATE_PAUSED, 'the idle pause');
    const local = path.join(node.dirs.stateDir, '..', `cp-${sb.sandboxId}.txt`);
    writeFileSync(local, 'uploaded while paused\n');
    const up = node.cli(['sandbox', 'cp', local, `${sb.sandboxId}:/workspace/up.txt`]);
    expect({ status: up.status, stderr: up.stderr }).toEqual({ status: 0, stderr: '' });
    expect((await get(sb.sandboxId)).state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    await waitState(sb.sandboxId, SandboxState.SANDBOX_STATE_PAUSED, 'the second idle pause');
    const back = `${local}.back`;
    const down = node.cli(['sandbox', 'cp', `${sb.sandboxId}:/workspace/up.txt`, back]);
    expect({ status: down.status, stderr: down.stderr, data: readFileSync(back, 'utf8') }).toEqual({ status: 0, stderr: '', data: 'uploaded while paused\n' });
    // an API caller's UploadFile alone (no StatFile first, as the CLI does) resumes it too
    await waitState(sb.sandboxId, SandboxState.SANDBOX_STATE_PAUSED, 'the third idle pause');
    async function* direct(): AsyncIterable<UploadFileRequest> {
      yield { part: { $case: 'header', value: { sandboxId: sb.sandboxId, path: 'direct.txt', offset: 0, mode: 0, inPlace: false } } };
      yield { part: { $case: 'data', value: Buffer.from('direct') } };
      yield { part: { $case: 'end', value: { sha256: '' } } };
    }
    expect(await node.api.sandboxes.uploadFile(direct(), { deadline: undefined, retry: false })).toMatchObject({ sizeBytes: 6 });
    expect((await get(sb.sandboxId)).state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    await node.api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });

  test('two Execs at once on a paused sandbox: both run, one resume', async () => {
    const sb = await create({ pauseAfterS: 2 });
    await waitState(sb.sandboxId, SandboxState.SANDBOX_STATE_PAUSED, 'the idle pause');
    const [a, b] = await Promise.all([sh(sb.sandboxId, 'echo a'), sh(sb.sandboxId, 'echo b')]);
    expect([a.stdout, b.stdout]).toEqual(['a\n', 'b\n']);
    expect((await get(sb.sandboxId)).pid).toBe(sb.pid);
    expect(autoResumes(sb.sandboxId)).toBe(1);
    await node.api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });

  test('hibernate_after_s stops the processes and keeps the disks; an Exec cold-starts it (new pid, /workspace kept)', async () => {
    const sb = await create({ hibernateAfterS: 2 });
    await sh(sb.sandboxId, 'echo kept > /workspace/f && sync');
    await waitFor('the hibernation', async () => ((await get(sb.sandboxId)).idle?.hibernated ? true : undefined), 60_000, 100);
    const h = await get(sb.sandboxId);
    expect(h).toMatchObject({ state: SandboxState.SANDBOX_STATE_DRAINED, pid: 0 });
    const r = await sh(sb.sandboxId, 'cat /workspace/f');
    expect(r).toMatchObject({ exitCode: 0, stdout: 'kept\n' });
    const back = await get(sb.sandboxId);
    expect(back.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    expect(back.pid).toBeGreaterThan(0);
    expect(back.pid).not.toBe(sb.pid);
    expect(back.idle?.hibernated).toBe(false);
    await node.api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });

  test('a KeepAlive lease holds the pause off (a twin made after it, without one, is paused first); the CLI sets it', async () => {
    const kept = await create({ pauseAfterS: 2 });
    const leased = (await node.api.sandboxes.keepAlive({ sandboxId: kept.sandboxId, forS: 600 })).sandbox!.idle!;
    expect(leased.nextActionAtMs).toBeGreaterThanOrEqual(leased.keepAliveUntilMs);
    const twin = await create({ pauseAfterS: 2 });
    await waitState(twin.sandboxId, SandboxState.SANDBOX_STATE_PAUSED, 'the twin paused');
    // two more reaper passes (1 s each) after the twin's pause, which came after the kept one's own time: it still runs
    const twinPausedAt = (await get(twin.sandboxId)).idle!.pausedAtMs;
    await waitFor('two reaper passes', () => Date.now() > twinPausedAt + 2_500 || undefined, 10_000, 100);
    expect((await get(kept.sandboxId)).state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    const cli = node.cli(['sandbox', 'keepalive', kept.sandboxId, '600', '--json']);
    expect(cli.status).toBe(0);
    const viaCli = JSON.parse(cli.stdout) as { idle: { keep_alive_until: string; next_action: string; next_action_at: string } };
    expect(viaCli.idle.next_action).toBe('pause');
    expect(Date.parse(viaCli.idle.keep_alive_until)).toBeGreaterThanOrEqual(leased.keepAliveUntilMs);
    // the lease ended: it is paused like the twin
    await node.api.sandboxes.keepAlive({ sandboxId: kept.sandboxId, forS: 0 });
    await waitState(kept.sandboxId, SandboxState.SANDBOX_STATE_PAUSED, 'the pause after the lease ended');
    for (const s of [kept, twin]) await node.api.sandboxes.deleteSandbox({ sandboxId: s.sandboxId });
  });

  test('paused_ttl_s deletes a sandbox paused that long', async () => {
    const sb = await create({ pauseAfterS: 2, pausedTtlS: 2 });
    await waitState(sb.sandboxId, SandboxState.SANDBOX_STATE_PAUSED, 'the idle pause');
    await waitFor(
      'the TTL delete',
      async () =>
        await node.api.sandboxes.getSandbox({ sandboxId: sb.sandboxId }).then(
          () => undefined,
          (e: { code?: number }) => e.code === Status.NOT_FOUND || undefined,
        ),
      60_000,
      100,
    );
  });

  test('auto_resume=false: an Exec on the paused sandbox is FAILED_PRECONDITION naming the state; it stays PAUSED', async () => {
    const sb = await create({ pauseAfterS: 2, autoResume: false });
    await waitState(sb.sandboxId, SandboxState.SANDBOX_STATE_PAUSED, 'the idle pause');
    await expectCode(sh(sb.sandboxId, 'true'), Status.FAILED_PRECONDITION, /is PAUSED and its idle.auto_resume is off/);
    expect((await get(sb.sandboxId)).state).toBe(SandboxState.SANDBOX_STATE_PAUSED);
    await node.api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });

  test('bad idle settings and leases are INVALID_ARGUMENT and make nothing', async () => {
    const before = (await node.api.sandboxes.listSandboxes({})).sandboxes.length;
    await expectCode(create({ pauseAfterS: 2_592_001 }), Status.INVALID_ARGUMENT, /idle.pause_after_s: 2592001/);
    await expectCode(create({ pauseAfterS: 4_294_967_295 }), Status.INVALID_ARGUMENT, /idle.pause_after_s/);
    await expectCode(create({ pauseAfterS: 10, hibernateAfterS: 5 }), Status.INVALID_ARGUMENT, /hibernate_after_s: 5 must be above pause_after_s/);
    expect((await node.api.sandboxes.listSandboxes({})).sandboxes.length).toBe(before);
    const sb = await create({ pauseAfterS: 600 });
    await expectCode(node.api.sandboxes.keepAlive({ sandboxId: sb.sandboxId, forS: 2_592_001 }), Status.INVALID_ARGUMENT, /for_s/);
    await expectCode(node.api.sandboxes.keepAlive({ sandboxId: 'sb-0000000000000000', forS: 1 }), Status.NOT_FOUND);
    // the CLI refuses a negative value before asking the server
    expect(node.cli(['sandbox', 'create', '--template', 'base', '--pause-after-s', '-1']).status).not.toBe(0);
    await node.api.sandboxes.deleteSandbox({ sandboxId: sb.sandboxId });
  });

  test('the timers survive `upgrade server` and kill -9 of the server: the same next action time, then the pause', async () => {
    const viaCli = node.cli(['sandbox', 'create', '--template', 'base', '--pause-after-s', '20', '--paused-ttl-s', '600', '--json']);
    expect(viaCli.status).toBe(0);
    const id = (JSON.parse(viaCli.stdout) as { id: string }).id;
    const created = (await get(id)).idle!;
    // activity the server holds in memory only (flushed at most every idleActivityFlushMs, 5 s): the handover writes it
    await sh(id, 'true');
    const first = (await get(id)).idle!;
    expect(first.nextActionAtMs).toBeGreaterThan(created.nextActionAtMs);
    expect(first).toMatchObject({ settings: { pauseAfterS: 20, pausedTtlS: 600 }, nextAction: 'pause' });
    await upgradeServer(node.dirs, '.');
    node.reconnect();
    const upgraded = await get(id);
    expect(upgraded.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    expect(upgraded.idle?.nextActionAtMs).toBe(first.nextActionAtMs);
    expect(await killComponent(node.dirs, 'server')).toBeGreaterThan(0);
    await startComponent(node.dirs, 'server');
    node.reconnect();
    const after = await get(id);
    // not reset by the restart: the pause is due when it was before (or done already)
    if (after.state === SandboxState.SANDBOX_STATE_RUNNING) expect(after.idle?.nextActionAtMs).toBe(first.nextActionAtMs);
    await waitState(id, SandboxState.SANDBOX_STATE_PAUSED, 'the pause after the restarts');
    // its paused TTL is the record's too: next is the delete, pausedAtMs + 600 s
    const p = (await get(id)).idle!;
    expect(p).toMatchObject({ nextAction: 'delete', nextActionAtMs: p.pausedAtMs + 600_000 });
    await node.api.sandboxes.deleteSandbox({ sandboxId: id });
  });
});
