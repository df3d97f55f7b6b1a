/**
 * The sandbox lifecycle through the public API of a real node: runc containers on loop devices,
 * podd inside, SQLite records, every service a separate process on unix sockets.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import { Status } from 'nice-grpc-common';
import { processStartTicks, processState, SANDBOX_ID_RE } from '@sandnode/shared';
import { SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { killComponent, startComponent } from '@sandnode/node-stack';
import { describeNode, execCollect, expectCode, startNode, waitFor, type TestNode } from '@sandnode/testkit';

jest.setTimeout(180_000);

function frozen(pid: number): boolean {
  // cgroup v1 freezer: the task's freezer cgroup says FROZEN
  const cg = readFileSync(`/proc/${pid}/cgroup`, 'utf8')
    .split('\n')
    .find((l) => l.includes(':freezer:'));
  if (!cg) return false;
  const rel = cg.split(':')[2] ?? '';
  return readFileSync(`/sys/fs/cgroup/freezer${rel}/freezer.state`, 'utf8').trim() === 'FROZEN';
}

describeNode('sandbox lifecycle on a real node', () => {
  let node: TestNode;
  beforeAll(async () => {
    node = await startNode();
  });
  afterAll(async () => {
    await node?.stop();
  });

  it('creates a RUNNING sandbox whose pid is a live host process, runs commands, moves files, pauses, resumes and deletes', async () => {
    const { api } = node;
    const s = (await api.sandboxes.createSandbox({ template: 'base', metadata: { team: 'a' } })).sandbox!;
    expect(s.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    expect(s.sandboxId).toMatch(SANDBOX_ID_RE);
    expect(processStartTicks(s.pid)).toBeDefined();
    expect(s.resources).toMatchObject({ vcpus: 1, memoryMib: 512, diskBytes: 1024 ** 3 });

    const hello = await execCollect(api, s.sandboxId, ['sh', '-c', 'echo out; echo err >&2; hostname; exit 7']);
    expect(hello.stdout).toBe(`out\n${s.sandboxId}\n`);
    expect(hello.stderr).toBe('err\n');
    expect(hello.exitCode).toBe(7);
    expect(hello.started).toBeGreaterThan(0);

    const cat = await execCollect(api, s.sandboxId, ['cat'], { stdin: Buffer.from('from stdin') });
    expect(cat.stdout).toBe('from stdin');
    const pwd = await execCollect(api, s.sandboxId, ['pwd']);
    expect(pwd.stdout.trim()).toBe('/workspace');
    const env = await execCollect(api, s.sandboxId, ['sh', '-c', 'echo $FOO'], { env: { FOO: 'bar' }, cwd: '/tmp' });
    expect(env.stdout).toBe('bar\n');

    const data = Buffer.from('x'.repeat(100_000));
    await api.sandboxes.writeFile({ sandboxId: s.sandboxId, path: 'dir/a.txt', data });
    const back = await api.sandboxes.readFile({ sandboxId: s.sandboxId, path: '/workspace/dir/a.txt' });
    expect(Buffer.from(back.data).equals(data)).toBe(true);
    expect(back.sizeBytes).toBe(100_000);
    const wc = await execCollect(api, s.sandboxId, ['wc', '-c', '/workspace/dir/a.txt']);
    expect(wc.stdout.trim().split(/\s+/)[0]).toBe('100000');
    // /workspace is its own ext4 device, the rootfs an overlay
    const mounts = await execCollect(api, s.sandboxId, ['cat', '/proc/mounts']);
    expect(mounts.stdout).toMatch(/ \/workspace ext4 /);
    expect(mounts.stdout).toMatch(/^overlay \/ overlay /m);

    const paused = (await api.sandboxes.pauseSandbox({ sandboxId: s.sandboxId })).sandbox!;
    expect(paused.state).toBe(SandboxState.SANDBOX_STATE_PAUSED);
    expect(paused.pid).toBe(s.pid);
    expect(frozen(s.pid)).toBe(true);
    const resumed = (await api.sandboxes.resumeSandbox({ sandboxId: s.sandboxId })).sandbox!;
    expect(resumed.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    expect(resumed.pid).toBe(s.pid);
    expect(frozen(s.pid)).toBe(false);

    await api.sandboxes.deleteSandbox({ sandboxId: s.sandboxId });
    await expect(api.sandboxes.getSandbox({ sandboxId: s.sandboxId })).rejects.toMatchObject({ code: Status.NOT_FOUND });
    // The init is gone: no such process, or a zombie until the host's pid 1 reaps it.
    expect([undefined, 'Z']).toContain(processState(s.pid));
  });

  it('lists with state and metadata filters and pages', async () => {
    const { api } = node;
    const made = [];
    for (let i = 0; i < 3; i++) made.push((await api.sandboxes.createSandbox({ template: 'base', metadata: { list: 'yes', i: String(i) } })).sandbox!);
    await api.sandboxes.pauseSandbox({ sandboxId: made[1]!.sandboxId });
    const all = await api.sandboxes.listSandboxes({ metadata: { list: 'yes' } });
    expect(all.sandboxes.map((s) => s.sandboxId)).toEqual(made.map((s) => s.sandboxId).sort());
    const paused = await api.sandboxes.listSandboxes({ states: [SandboxState.SANDBOX_STATE_PAUSED], metadata: { list: 'yes' } });
    expect(paused.sandboxes.map((s) => s.sandboxId)).toEqual([made[1]!.sandboxId]);
    const p1 = await api.sandboxes.listSandboxes({ metadata: { list: 'yes' }, pageSize: 2 });
    expect(p1.sandboxes).toHaveLength(2);
    expect(p1.nextPageToken).not.toBe('');
    const p2 = await api.sandboxes.listSandboxes({ metadata: { list: 'yes' }, pageSize: 2, pageToken: p1.nextPageToken });
    expect(p2.sandboxes).toHaveLength(1);
    expect(p2.nextPageToken).toBe('');
    for (const s of made) await api.sandboxes.deleteSandbox({ sandboxId: s.sandboxId });
  });

  it('returns the same sandbox for a repeated request_id', async () => {
    const { api } = node;
    const a = (await api.sandboxes.createSandbox({ template: 'base', requestId: 'req-1' })).sandbox!;
    const b = (await api.sandboxes.createSandbox({ template: 'base', requestId: 'req-1' })).sandbox!;
    expect(b.sandboxId).toBe(a.sandboxId);
    await api.sandboxes.deleteSandbox({ sandboxId: a.sandboxId });
  });

  it('deletes a sandbox when its timeout passes', async () => {
    const { api } = node;
    const s = (await api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    const t = (await api.sandboxes.setTimeout({ sandboxId: s.sandboxId, timeoutSeconds: 1 })).sandbox!;
    expect(t.expiresAtMs).toBeGreaterThan(Date.now() - 1000);
    // GetSandbox fails NOT_FOUND once the timeout has deleted it
    await waitFor('the expired sandbox to be deleted', () => expectCode(api.sandboxes.getSandbox({ sandboxId: s.sandboxId }), Status.NOT_FOUND), 15_000, 100);
  });

  it('reports a sandbox whose VM process died as ERROR (not RUNNING) and still deletes it', async () => {
    const { api } = node;
    const s = (await api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    process.kill(s.pid, 'SIGKILL');
    const g = await waitFor(
      'the sandbox to leave RUNNING',
      async () => {
        const now = (await api.sandboxes.getSandbox({ sandboxId: s.sandboxId })).sandbox!;
        return now.state === SandboxState.SANDBOX_STATE_RUNNING ? undefined : now;
      },
      15_000,
      100,
    );
    expect(g.state).toBe(SandboxState.SANDBOX_STATE_ERROR);
    expect(g.errorMessage).toMatch(new RegExp(`pid ${s.pid}`));
    await expect(execCollect(api, s.sandboxId, ['true'])).rejects.toMatchObject({ code: Status.FAILED_PRECONDITION });
    await api.sandboxes.deleteSandbox({ sandboxId: s.sandboxId });
    await expect(api.sandboxes.getSandbox({ sandboxId: s.sandboxId })).rejects.toMatchObject({ code: Status.NOT_FOUND });
  });

  it('refuses a create while ublk-manager is down (FAILED_PRECONDITION, nothing made) and creates again once it is back', async () => {
    const { api } = node;
    const before = (await api.sandboxes.listSandboxes({})).sandboxes.map((s) => s.sandboxId);
    await killComponent(node.dirs, 'ublk-manager');
    await expect(api.sandboxes.createSandbox({ template: 'base', requestId: 'while-ublk-down' })).rejects.toMatchObject({
      code: Status.FAILED_PRECONDITION,
      details: expect.stringMatching(/ublk-manager does not answer.*sandnode up.*nothing was created/),
    });
    await startComponent(node.dirs, 'ublk-manager');
    await waitFor(
      'no record of the refused create',
      async () => {
        const left = (await api.sandboxes.listSandboxes({})).sandboxes.map((s) => s.sandboxId).filter((id) => !before.includes(id));
        if (left.length) throw new Error(`records left: ${left.join(', ')}`); // named in the timeout
        return true;
      },
      15_000,
      100,
    );
    // the request_id is free again: the retried create makes a sandbox
    const s = (await api.sandboxes.createSandbox({ template: 'base', requestId: 'while-ublk-down' })).sandbox!;
    expect(s.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    await api.sandboxes.deleteSandbox({ sandboxId: s.sandboxId });
  });

  it('adopts every sandbox with the same pid and state after the server is killed with SIGKILL', async () => {
    const { api } = node;
    const a = (await api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    const b = (await api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    await api.sandboxes.pauseSandbox({ sandboxId: b.sandboxId });
    await api.sandboxes.writeFile({ sandboxId: a.sandboxId, path: 'keep.txt', data: Buffer.from('kept') });

    await killComponent(node.dirs, 'server');
    await startComponent(node.dirs, 'server');
    const api2 = node.reconnect();
    const a2 = (await api2.sandboxes.getSandbox({ sandboxId: a.sandboxId })).sandbox!;
    const b2 = (await api2.sandboxes.getSandbox({ sandboxId: b.sandboxId })).sandbox!;
    expect([a2.state, a2.pid]).toEqual([SandboxState.SANDBOX_STATE_RUNNING, a.pid]);
    expect([b2.state, b2.pid]).toEqual([SandboxState.SANDBOX_STATE_PAUSED, b.pid]);
    expect((await execCollect(api2, a.sandboxId, ['cat', 'keep.txt'])).stdout).toBe('kept');
    await api2.sandboxes.resumeSandbox({ sandboxId: b.sandboxId });
    await api2.sandboxes.deleteSandbox({ sandboxId: a.sandboxId });
    await api2.sandboxes.deleteSandbox({ sandboxId: b.sandboxId });
  });

  it('starts past bad record rows (garbage, {}, a duplicate of a live id): serves the good ones, NOT_FOUND for the bad, no undeletable ghost', async () => {
    const { api } = node;
    const a = (await api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    await killComponent(node.dirs, 'server');
    const db = new Database(path.join(node.dirs.stateDir, 'records.db'));
    const insert = db.prepare('INSERT INTO records (sandbox_id, state, updated_at_ms, record) VALUES (?, ?, 0, ?)');
    const { record } = db.prepare<[string], { record: Buffer }>('SELECT record FROM records WHERE sandbox_id = ?').get(a.sandboxId)!;
    insert.run('sb-00000000000000e1', 'RUNNING', Buffer.from([0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]));
    insert.run('sb-00000000000000e2', 'RUNNING', '{}');
    insert.run('sb-00000000000000e3', 'RUNNING', record); // a second row carrying a's id
    db.close();
    await startComponent(node.dirs, 'server');
    const api2 = node.reconnect();
    for (const id of ['sb-00000000000000e1', 'sb-00000000000000e2', 'sb-00000000000000e3']) await expectCode(api2.sandboxes.getSandbox({ sandboxId: id }), Status.NOT_FOUND);
    expect((await api2.sandboxes.getSandbox({ sandboxId: a.sandboxId })).sandbox!.pid).toBe(a.pid);
    const ours = async () => (await api2.sandboxes.listSandboxes({})).sandboxes.map((s) => s.sandboxId).filter((id) => id === a.sandboxId || id.startsWith('sb-00000000000000e'));
    expect(await ours()).toEqual([a.sandboxId]);
    await api2.sandboxes.deleteSandbox({ sandboxId: a.sandboxId });
    expect(await ours()).toEqual([]);
  });
});
