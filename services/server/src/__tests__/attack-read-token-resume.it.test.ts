/**
 * Security finding c, a whole node over TCP with bearer tokens: a token with the read role must
 * not wake or keep awake a sandbox (before, every read RPC auto-resumed an idle-PAUSED or
 * hibernated sandbox and counted as activity, so a read-only observer kept it running forever and
 * woke it at its owner's cost).
 *
 * - idle-PAUSED: StatFile, ListDirectory, ReadFile, ListProcesses and DownloadFile of a read token
 *   are FAILED_PRECONDITION naming PAUSED; the sandbox stays PAUSED, its last activity unchanged,
 *   no auto-resume logged; the write paths (Exec, ExecStream, UploadFile, WriteFile, ResumeSandbox,
 *   KeepAlive) are PERMISSION_DENIED and change nothing either; an admin token's StatFile resumes it;
 * - RUNNING: a read token is served, but a stream of its calls does not hold the idle pause off;
 * - hibernated: a read token's call is FAILED_PRECONDITION naming it, and it stays DRAINED.
 */
import { Status } from 'nice-grpc-common';
import { connectServerApi, type ServerApi } from '@sandnode/shared';
import type { UploadFileRequest } from '@sandnode/shared/proto/server/v1/files';
import { SandboxState, type ExecStreamRequest, type IdleSettings, type Sandbox } from '@sandnode/shared/proto/server/v1/sandbox';
import { autoResumes as countAutoResumes } from './idle-helpers';
import { describeNode, execCollect, expectCode, startNode, waitFor, type TestNode } from '@sandnode/testkit';

jest.setTimeout(300_000);

describeNode('a read-role token neither resumes a sandbox nor counts as its activity (TCP + tokens)', () => {
  let node: TestNode;
  let reader: ServerApi;
  let owner: ServerApi;

  beforeAll(async () => {
    node = await startNode({ listen: '127.0.0.1:0', buildTemplate: true });
    const r = node.cli(['token', 'create', '--name', 'observer', '--role', 'read', '--json']);
    if (r.status !== 0) throw new Error(`token create: ${r.stderr}`);
    reader = connectServerApi(node.tcpAddress(), 30_000, { token: (JSON.parse(r.stdout) as { secret: string }).secret });
    owner = connectServerApi(node.tcpAddress(), 30_000, { token: node.tcpToken() });
  });
  afterAll(async () => {
    reader?.close();
    owner?.close();
    await node?.stop();
  });

  const create = async (idle: Partial<IdleSettings>): Promise<Sandbox> =>
    (await node.api.sandboxes.createSandbox({ template: 'base', timeoutSeconds: 0, metadata: {}, requestId: '', idle: { pauseAfterS: 0, hibernateAfterS: 0, pausedTtlS: 0, ...idle } })).sandbox!;
  const get = async (id: string): Promise<Sandbox> => (await node.api.sandboxes.getSandbox({ sandboxId: id })).sandbox!;
  const waitState = (id: string, state: SandboxState, what: string) => waitFor(what, async () => ((await get(id)).state === state ? true : undefined), 60_000, 100);
  const autoResumes = (id: string): number => countAutoResumes(node.dirs.runDir, id);
  /** the read RPCs of SandboxService that name one sandbox and need it RUNNING (NO_SIDE_EFFECTS in sandbox.proto) */
  const reads = (api: ServerApi, id: string): [string, () => Promise<unknown>][] => [
    ['StatFile', () => api.sandboxes.statFile({ sandboxId: id, path: 'f' }, { retry: false })],
    ['ListDirectory', () => api.sandboxes.listDirectory({ sandboxId: id, path: '' }, { retry: false })],
    ['ReadFile', () => api.sandboxes.readFile({ sandboxId: id, path: 'f' }, { retry: false })],
    ['ListProcesses', () => api.sandboxes.listProcesses({ sandboxId: id }, { retry: false })],
    [
      'DownloadFile',
      async () => {
        for await (const _ of api.sandboxes.downloadFile({ sandboxId: id, path: 'f', offset: 0 }, { retry: false })) void _;
      },
    ],
  ];

  test('idle-PAUSED: every read RPC of a read token is FAILED_PRECONDITION naming PAUSED, the write RPCs PERMISSION_DENIED; it stays PAUSED with its activity unchanged; an admin token resumes it', async () => {
    const sb = await create({ pauseAfterS: 2 });
    const id = sb.sandboxId;
    expect(await execCollect(node.api, id, ['/bin/busybox', 'sh', '-c', 'echo hello > /workspace/f'], { timeoutMs: 30_000 })).toMatchObject({ exitCode: 0 });
    await waitState(id, SandboxState.SANDBOX_STATE_PAUSED, 'the idle pause');
    const before = await get(id);
    expect(before.idle?.lastActivityMs).toBeGreaterThan(0);
    // a loaded host may pause it before the first Exec arrives (which then auto-resumes it): count from here
    const resumed = autoResumes(id);

    for (const [rpc, call] of reads(reader, id)) {
      await expectCode(call(), Status.FAILED_PRECONDITION, new RegExp(`sandbox ${id} is PAUSED and ${rpc} needs RUNNING: a read-role caller does not resume a sandbox`));
    }
    // the calls that resume (or would) are not the read role's at all
    async function* upload(): AsyncIterable<UploadFileRequest> {
      yield { part: { $case: 'header', value: { sandboxId: id, path: 'up', offset: 0, mode: 0, inPlace: false } } };
      yield { part: { $case: 'end', value: { sha256: '' } } };
    }
    async function* execStream(): AsyncIterable<ExecStreamRequest> {
      yield { input: { $case: 'start', value: { sandboxId: id, argv: ['/bin/busybox', 'true'], env: {}, cwd: '', timeoutMs: 0, pty: false, size: undefined, detachKeepMs: 0 } } };
    }
    const drain = async (s: AsyncIterable<unknown>) => {
      for await (const _ of s) void _;
    };
    await expectCode(drain(reader.sandboxes.exec({ sandboxId: id, argv: ['/bin/busybox', 'true'] }, { retry: false })), Status.PERMISSION_DENIED);
    await expectCode(drain(reader.sandboxes.execStream(execStream(), { retry: false })), Status.PERMISSION_DENIED);
    await expectCode(reader.sandboxes.uploadFile(upload(), { retry: false }), Status.PERMISSION_DENIED);
    await expectCode(reader.sandboxes.writeFile({ sandboxId: id, path: 'w', data: Buffer.from('x') }, { retry: false }), Status.PERMISSION_DENIED);
    await expectCode(reader.sandboxes.resumeSandbox({ sandboxId: id }, { retry: false }), Status.PERMISSION_DENIED);
    await expectCode(reader.sandboxes.keepAlive({ sandboxId: id, forS: 3600 }, { retry: false }), Status.PERMISSION_DENIED);

    const after = await get(id);
    expect(after.state).toBe(SandboxState.SANDBOX_STATE_PAUSED);
    expect(after.idle?.lastActivityMs).toBe(before.idle?.lastActivityMs);
    expect(after.idle?.pausedAtMs).toBe(before.idle?.pausedAtMs);
    expect(autoResumes(id)).toBe(resumed);

    // the owner's (admin) token resumes it as before, with the same processes
    expect((await owner.sandboxes.statFile({ sandboxId: id, path: 'f' }, { retry: false })).info).toMatchObject({ sizeBytes: 6 });
    const back = await get(id);
    expect(back).toMatchObject({ state: SandboxState.SANDBOX_STATE_RUNNING, pid: sb.pid });
    expect(autoResumes(id)).toBe(resumed + 1);
    await node.api.sandboxes.deleteSandbox({ sandboxId: id });
  });

  test('RUNNING: a read token is served, but its calls do not hold the idle pause off', async () => {
    const sb = await create({ pauseAfterS: 4 });
    const id = sb.sandboxId;
    expect(await execCollect(node.api, id, ['/bin/busybox', 'sh', '-c', 'echo hello > /workspace/f'], { timeoutMs: 30_000 })).toMatchObject({ exitCode: 0 });
    const resumed = autoResumes(id);
    expect(Buffer.from((await reader.sandboxes.readFile({ sandboxId: id, path: 'f' }, { retry: false })).data).toString()).toBe('hello\n');
    // an observer polling every 200 ms (each call far shorter than pause_after_s apart): before, it kept the sandbox RUNNING for ever
    await waitFor(
      'the idle pause under a read-token poll',
      async () => {
        await reader.sandboxes.statFile({ sandboxId: id, path: 'f' }, { retry: false }).catch(() => undefined);
        return (await get(id)).state === SandboxState.SANDBOX_STATE_PAUSED ? true : undefined;
      },
      60_000,
      200,
    );
    expect(autoResumes(id)).toBe(resumed);
    await node.api.sandboxes.deleteSandbox({ sandboxId: id });
  });

  test('hibernated: a read token is FAILED_PRECONDITION naming it, and it stays DRAINED', async () => {
    const sb = await create({ hibernateAfterS: 2 });
    const id = sb.sandboxId;
    await waitFor('the hibernation', async () => ((await get(id)).idle?.hibernated ? true : undefined), 60_000, 100);
    for (const [rpc, call] of reads(reader, id)) {
      await expectCode(call(), Status.FAILED_PRECONDITION, new RegExp(`sandbox ${id} is hibernated \\(DRAINED\\) and ${rpc} needs RUNNING`));
    }
    expect(await get(id)).toMatchObject({ state: SandboxState.SANDBOX_STATE_DRAINED, pid: 0, idle: { hibernated: true } });
    expect(autoResumes(id)).toBe(0);
    await node.api.sandboxes.deleteSandbox({ sandboxId: id });
  });
});
